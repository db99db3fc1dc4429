// A composite communication operation, described without MPI types: a list of steps, each a set
// of point-to-point transfers and/or one collective on a group, followed by local work that runs
// on the caller's thread once the step's transfers have completed (and, optionally, work that
// runs while they are in flight: during()). The Engine runs schedules
// with the same request model as single collectives and translates each step for its backend,
// so adasum/ and kfac/ never name an MPI type, communicator or request.
//
// Buffers are rank-1 contiguous views (any memory space the backend can reach) or, for scratch
// owned by the schedule's state, typed host pointers; both become a `Buffer` (data, count,
// dtype). A collective step runs on `Group::all()` (the Engine's own wire) or on a sub-group made
// by Engine::node_group() / cross_node_group(); groups from another Engine are refused at submission.
//
// Rules: every rank of the Engine submits the same schedules in the same order (the consistency
// check enforces it); both partners of a transfer use the same `tag` (< Schedule::kMaxTag), and
// schedules are matched by their submission index, so tags never collide across operations.
#pragma once

#include <kdist/comm/communicator.hpp>
#include <kdist/core/compat.hpp>
#include <kdist/core/dtype.hpp>
#include <kdist/core/error.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kdist {
namespace comm {

/// Element-wise reductions: average is the sum divided by the rank count.
enum class ReduceOp { sum, average, min, max };
const char* to_string(ReduceOp op);

/// Typed memory handed to a backend.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::bytes;
  bool device = false;  ///< not host-accessible: NCCL (or GPU-aware MPI) moves it

  template <class T>
  static Buffer host(T* p, std::size_t n) {
    return {const_cast<void*>(static_cast<const void*>(p)), n, dtype_of<T>(), false};
  }
  template <class V>
  static Buffer of(const V& v) {
    static_assert(Kokkos::is_view<V>::value && compat::view_rank<V>() == 1, "kdist::comm::Buffer: rank-1 view");
    if (!v.span_is_contiguous())
      kdist::impl::throw_invalid("kdist::comm::Buffer", "view '" + v.label() + "' must be contiguous");
    Buffer b = host(v.data(), v.extent(0));
    b.device = !Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible;
    return b;
  }
};

/// The ranks a collective step runs on: the whole Engine, or a sub-group from Engine::node_group() or
/// Engine::cross_node_group(). The group holds its own handle to the communicator, so a temporary
/// (Group::of(engine.node_group())) lives as long as the step.
class Group {
 public:
  static Group all() { return Group(); }
  static Group of(const Communicator& sub) { return Group(std::make_shared<const Communicator>(sub)); }
  const Communicator* sub() const noexcept { return sub_.get(); }

 private:
  explicit Group(std::shared_ptr<const Communicator> sub = nullptr) : sub_(std::move(sub)) {}
  std::shared_ptr<const Communicator> sub_;
};

class Schedule {
 public:
  static constexpr int kMaxTag = 4096;

  struct Transfer {
    bool is_send;
    int peer;
    Buffer buffer;
    int tag;
  };
  enum class CollectiveKind { none, allreduce, reduce_scatter, allgather, broadcast };
  struct Collective {
    CollectiveKind kind = CollectiveKind::none;
    Group group = Group::all();
    Buffer in, out;  ///< in-place kinds (allreduce, broadcast) use `out` only
    ReduceOp op = ReduceOp::sum;
    int root = 0;
  };
  struct Step {
    std::vector<Transfer> transfers;
    Collective collective;
    std::function<void()> local_work;
    std::function<void()> overlap_work;  ///< runs once the transfers are posted, before they complete
    void* stream = nullptr;              ///< CUDA stream of the caller's instance, for device buffers
    bool device() const {
      bool d = collective.out.device || collective.in.device;
      for (const auto& t : transfers) d = d || t.buffer.device;
      return d;
    }
  };

  explicit Schedule(std::string label = "composite") : label_(std::move(label)) {}

  /// Room for this many steps without reallocating (each step holds std::functions to move).
  Schedule& reserve(std::size_t steps) {
    steps_.reserve(steps);
    return *this;
  }
  /// Starts a new step; transfers, a collective and local work added next belong to it.
  Schedule& step() {
    steps_.emplace_back();
    return *this;
  }
  Schedule& send(int peer, Buffer b, int tag) { return transfer(true, peer, b, tag); }
  Schedule& recv(int peer, Buffer b, int tag) { return transfer(false, peer, b, tag); }
  /// In place: out := sum/min/max over `group` (average is finished by the caller's local work).
  Schedule& allreduce(Group group, Buffer inout, ReduceOp op = ReduceOp::sum) {
    return collective({CollectiveKind::allreduce, group, {}, inout, op, 0});
  }
  /// out (count) := this rank's block of the reduction of in (count x group size).
  Schedule& reduce_scatter(Group group, Buffer in, Buffer out, ReduceOp op = ReduceOp::sum) {
    return collective({CollectiveKind::reduce_scatter, group, in, out, op, 0});
  }
  /// out (count x group size) := every member's in (count), in group rank order.
  Schedule& allgather(Group group, Buffer in, Buffer out) {
    return collective({CollectiveKind::allgather, group, in, out, ReduceOp::sum, 0});
  }
  Schedule& broadcast(Group group, Buffer inout, int root) {
    return collective({CollectiveKind::broadcast, group, {}, inout, ReduceOp::sum, root});
  }
  /// Device buffers of this step are enqueued on `stream` (the caller's instance's CUDA stream),
  /// after the kernels that produced them.
  Schedule& on_stream(void* stream) {
    current().stream = stream;
    return *this;
  }
  /// Local work after this step's transfers complete (plain loops or kernels on the caller's
  /// thread). An exception from the last step fails the operation on this rank only (peers
  /// expect nothing more from it); from an earlier step it fails the Engine on every rank.
  Schedule& then(std::function<void()> work) {
    current().local_work = std::move(work);
    return *this;
  }

  /// Local work that runs as soon as this step's transfers are posted, while they are in flight
  /// (computing on what an earlier step received while this step's data moves). It must not
  /// touch this step's buffers. An exception fails the Engine on every rank.
  Schedule& during(std::function<void()> work) {
    current().overlap_work = std::move(work);
    return *this;
  }

  const std::string& label() const noexcept { return label_; }
  std::vector<Step>& steps() noexcept { return steps_; }
  const std::vector<Step>& steps() const noexcept { return steps_; }
  /// Number of steps that run a collective (the engine orders these across operations).
  long long collective_steps() const {
    long long n = 0;
    for (const auto& s : steps_) n += s.collective.kind != CollectiveKind::none ? 1 : 0;
    return n;
  }

 private:
  Step& current() {
    if (steps_.empty()) steps_.emplace_back();
    return steps_.back();
  }
  Schedule& transfer(bool is_send, int peer, Buffer b, int tag) {
    if (tag < 0 || tag >= kMaxTag)
      kdist::impl::throw_invalid("kdist::comm::Schedule", "schedule '" + label_ + "' uses tag " + std::to_string(tag) +
                                                              " outside [0, " + std::to_string(kMaxTag) + ")");
    current().transfers.push_back({is_send, peer, b, tag});
    return *this;
  }
  Schedule& collective(Collective c) {
    current().collective = c;
    return *this;
  }
  std::string label_;
  std::vector<Step> steps_;
};

}  // namespace comm
}  // namespace kdist
