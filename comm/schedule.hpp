// A composite communication operation: a list of steps, each a set of point-to-point transfers
// and/or one collective, followed by local work that runs on the caller's thread when the step's
// transfers have completed. The Engine runs schedules with the same request model as single
// collectives, so VHDD Adasum, its fold for odd rank counts, hierarchical modes and K-FAC's
// broadcast-while-inverting share one progress mechanism.
//
// Rules: every rank of the communicator submits the same schedules in the same order (the
// consistency check enforces it); both partners of a transfer use the same `tag` (< 4096), and
// schedules are matched by their submission index, so tags never collide across operations.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace kdist {
namespace comm {

class Schedule {
 public:
  struct Transfer {
    bool is_send;
    int peer;
    void* buffer;
    int count;
    MPI_Datatype type;
    int tag;
  };
  struct Step {
    std::vector<Transfer> transfers;
    /// Posts one nonblocking collective into the request (empty if none).
    std::function<int(MPI_Request*)> collective;
    std::function<void()> local_work;
  };

  explicit Schedule(std::string label = "composite") : label_(std::move(label)) {}

  /// Starts a new step; transfers and local work added next belong to it.
  Schedule& step() {
    steps_.emplace_back();
    return *this;
  }
  Schedule& send(int peer, const void* buffer, int count, MPI_Datatype type, int tag) {
    current().transfers.push_back({true, peer, const_cast<void*>(buffer), count, type, tag});
    return *this;
  }
  Schedule& recv(int peer, void* buffer, int count, MPI_Datatype type, int tag) {
    current().transfers.push_back({false, peer, buffer, count, type, tag});
    return *this;
  }
  /// One nonblocking collective for this step, e.g.
  /// [=](MPI_Request* r) { return MPI_Iallreduce(..., sub_comm, r); }. Collective steps of all
  /// operations are posted in submission order, as MPI requires.
  Schedule& collective(std::function<int(MPI_Request*)> post) {
    current().collective = std::move(post);
    return *this;
  }
  /// Collective steps on a (sub-)communicator, e.g. the node communicator of hierarchical modes.
  Schedule& reduce_scatter_block(MPI_Comm comm, const void* send, void* recv, int count, MPI_Datatype type) {
    return collective(
        [=](MPI_Request* r) { return MPI_Ireduce_scatter_block(send, recv, count, type, MPI_SUM, comm, r); });
  }
  Schedule& allgather(MPI_Comm comm, const void* send, void* recv, int count, MPI_Datatype type) {
    return collective([=](MPI_Request* r) { return MPI_Iallgather(send, count, type, recv, count, type, comm, r); });
  }
  /// Local work after this step's transfers complete (plain loops or kernels on the caller's
  /// thread; it may throw, which fails the request on this rank).
  Schedule& then(std::function<void()> work) {
    current().local_work = std::move(work);
    return *this;
  }

  const std::string& label() const noexcept { return label_; }
  std::vector<Step>& steps() noexcept { return steps_; }
  /// Number of steps that post a collective (the engine orders these across operations).
  long long collective_steps() const {
    long long n = 0;
    for (const auto& s : steps_) n += s.collective ? 1 : 0;
    return n;
  }

 private:
  Step& current() {
    if (steps_.empty()) steps_.emplace_back();
    return steps_.back();
  }
  std::string label_;
  std::vector<Step> steps_;
};

}  // namespace comm
}  // namespace kdist
