// Asynchronous communication engine: every byte kdist moves between ranks goes through it.
//
// Operations on views (all-reduce sum/average, broadcast, reduce-scatter, all-gather,
// send/recv) and composite schedules (comm/schedule.hpp) return a Request that can be tested or
// waited on. Views are staged through host memory when they are not host-accessible.
//
// Progress. There is no communication thread. MPICH advances nonblocking operations only inside
// MPI calls (unless MPICH_ASYNC_PROGRESS=1, which the user may set at the price of a core), so the
// engine advances every operation in flight whenever it is called: on submit, test, wait and
// progress(). Training code calls progress() from its layer hooks; that is how a factor
// all-reduce moves while the next layer computes. A thread was rejected because Kokkos 3.4's
// Serial backend is not re-entrant (local work of composites must run on the caller's thread
// anyway) and a spinning thread would take one of the cores the overlapped compute needs.
//
// Ordering. MPI requires collectives on a communicator to be posted in the same order on every
// rank. The engine posts payload collectives strictly in submission order; point-to-point steps
// of composites run on a private communicator with per-operation tags, so they may interleave.
//
// Consistency check (on by default). Before any payload of a collective operation moves, the
// ranks reduce its signature (operation index, kind, dtype, count, root) on a private
// communicator: one small MPI_Iallreduce posted at submission, so its latency overlaps the
// caller's work. On a mismatch every rank raises kdist::comm::MismatchError naming the operation
// index, its label and each rank's values; the engine then refuses further work.
#pragma once

#include <kdist/comm/communicator.hpp>
#include <kdist/comm/schedule.hpp>
#include <kdist/core/compat.hpp>
#include <kdist/core/dtype.hpp>
#include <kdist/core/error.hpp>

#include <Kokkos_Core.hpp>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace kdist {
namespace comm {

/// Element-wise reductions: average is the sum divided by the rank count.
enum class ReduceOp { sum, average, min, max };
const char* to_string(ReduceOp op);

/// Operation kinds as they appear in signatures and messages.
enum class OpKind : int {
  allreduce = 1,
  broadcast = 2,
  reduce_scatter = 3,
  allgather = 4,
  send = 5,
  recv = 6,
  composite = 7
};
const char* to_string(OpKind kind);

using kdist::DType;
using kdist::dtype_of;
using kdist::to_string;
/// MPI reduction for `op` (average is a sum, divided afterwards).
inline MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::min ? MPI_MIN : op == ReduceOp::max ? MPI_MAX : MPI_SUM;
}
template <class T>
MPI_Datatype mpi_type() {
  return std::is_same<T, float>::value ? MPI_FLOAT : std::is_same<T, double>::value ? MPI_DOUBLE : MPI_INT;
}

/// Raised on every rank when ranks submit different collectives at the same position.
class MismatchError : public Error {
 public:
  using Error::Error;
};

struct EngineOptions {
  bool check_consistency = true;
};

struct EngineStats {
  long long operations = 0;             ///< operations submitted
  long long payload_calls = 0;          ///< MPI calls that move payload (collectives + point-to-point)
  long long collective_calls = 0;       ///< of which nonblocking collectives
  long long check_calls = 0;            ///< signature all-reduces
  long long bytes_sent = 0;             ///< point-to-point bytes sent by composite schedules
  long long completed_before_wait = 0;  ///< operations found complete when wait() was called
  long long waited = 0;                 ///< wait() calls on unfinished operations
};

class Engine;

namespace impl {
struct Operation;
}

/// Handle on an operation in flight. Copyable; the operation lives until it completes.
class Request {
 public:
  Request() = default;
  /// Advances the engine; true once the operation is complete (its results are in place).
  bool test();
  /// Blocks until complete; rethrows the operation's error (e.g. MismatchError) on failure.
  void wait();
  bool valid() const noexcept { return op_ != nullptr; }

 private:
  friend class Engine;
  Request(Engine* engine, std::shared_ptr<impl::Operation> op) : engine_(engine), op_(std::move(op)) {}
  Engine* engine_ = nullptr;
  std::shared_ptr<impl::Operation> op_;
};

namespace impl {
struct Operation {
  enum class State { checking, ready, done, failed };
  long long seq = -1;  ///< collective index on this engine (-1: point-to-point, not checked)
  OpKind kind = OpKind::composite;
  DType dtype = DType::bytes;
  long long count = 0;
  int root = -1;
  std::string label;
  Schedule schedule;
  std::size_t step = 0;
  bool step_posted = false;
  long long collectives_left = 0;
  std::vector<MPI_Request> requests;
  static constexpr int kSig = 5;
  long long sig_send[2 * kSig] = {};
  long long sig_recv[2 * kSig] = {};
  MPI_Request check_request = MPI_REQUEST_NULL;
  State state = State::ready;
  std::exception_ptr error;
  int tag_base = 0;
};
}  // namespace impl

class Engine {
 public:
  explicit Engine(const Communicator& comm, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Communicator& communicator() const noexcept { return comm_; }
  int rank() const noexcept { return comm_.rank(); }
  int size() const noexcept { return comm_.size(); }

  /// In place: v := sum (or average) of v over all ranks.
  template <class Exec, class V>
  Request allreduce(const Exec& exec, const V& v, ReduceOp op = ReduceOp::sum, std::string label = "allreduce");
  /// In place: v := root's v.
  template <class Exec, class V>
  Request broadcast(const Exec& exec, const V& v, int root, std::string label = "broadcast");
  /// out (n) := this rank's block of the sum (or average) of in (n * size) over all ranks.
  template <class Exec, class VIn, class VOut>
  Request reduce_scatter(const Exec& exec, const VIn& in, const VOut& out, ReduceOp op = ReduceOp::sum,
                         std::string label = "reduce_scatter");
  /// out (n * size) := every rank's in (n), in rank order.
  template <class Exec, class VIn, class VOut>
  Request allgather(const Exec& exec, const VIn& in, const VOut& out, std::string label = "allgather");
  /// Point-to-point (not checked: only two ranks take part).
  template <class Exec, class V>
  Request send(const Exec& exec, const V& v, int dest, int tag, std::string label = "send");
  template <class Exec, class V>
  Request recv(const Exec& exec, const V& v, int source, int tag, std::string label = "recv");

  /// Runs a composite schedule. `count` and `dtype` describe its payload for the check.
  Request submit(Schedule schedule, long long count, DType dtype);
  /// MPI communicator for point-to-point transfers of composite schedules (private).
  MPI_Comm schedule_comm() const noexcept { return sched_comm_; }

  /// Advances every operation in flight without blocking.
  void progress();
  /// Waits for every operation in flight.
  void wait_all();
  std::size_t in_flight() const noexcept { return inflight_.size(); }

  const EngineStats& stats() const noexcept { return stats_; }
  void reset_stats() { stats_ = EngineStats{}; }
  const EngineOptions& options() const noexcept { return options_; }

 private:
  friend class Request;
  template <class V>
  static void check_view(const char* func, const V& v);
  /// Checks both views and that `whole` holds size() blocks of `block`'s length.
  template <class VWhole, class VBlock>
  void check_blocks(const char* func, const VWhole& whole, const VBlock& block, const char* whole_role) const;
  static std::shared_ptr<impl::Operation> make_op(OpKind kind, DType dtype, long long count, std::string label,
                                                  int root = -1);
  Request enqueue(std::shared_ptr<impl::Operation> op);
  void advance(impl::Operation& op, bool& earlier_collectives_pending);
  void check_signature(impl::Operation& op);
  [[noreturn]] void raise_mismatch(impl::Operation& op);
  void wait(impl::Operation& op);
  void fail(impl::Operation& op, std::exception_ptr e);

  Communicator comm_;
  EngineOptions options_;
  MPI_Comm check_comm_ = MPI_COMM_NULL;
  MPI_Comm sched_comm_ = MPI_COMM_NULL;
  int tag_ops_ = 1;  ///< distinct composite tag bases available
  long long next_seq_ = 0;
  long long next_composite_ = 0;
  std::deque<std::shared_ptr<impl::Operation>> inflight_;
  EngineStats stats_;
  std::exception_ptr poisoned_;
};

// ---- templates -----------------------------------------------------------------------------

template <class V>
void Engine::check_view(const char* func, const V& v) {
  static_assert(Kokkos::is_view<V>::value, "kdist::comm: argument must be a Kokkos::View");
  static_assert(compat::view_rank<V>() == 1, "kdist::comm: views must be rank 1 (flatten first)");
  if (!v.span_is_contiguous()) kdist::impl::throw_invalid(func, "view '" + v.label() + "' must be contiguous");
}

template <class VWhole, class VBlock>
void Engine::check_blocks(const char* func, const VWhole& whole, const VBlock& block, const char* whole_role) const {
  check_view(func, whole);
  check_view(func, block);
  static_assert(std::is_same<typename VWhole::non_const_value_type, typename VBlock::non_const_value_type>::value,
                "kdist::comm: value types differ");
  const std::size_t n = block.extent(0), size = static_cast<std::size_t>(comm_.size());
  if (whole.extent(0) != n * size)
    kdist::impl::throw_invalid(func, std::string(whole_role) + " '" + whole.label() + "' has " +
                                         std::to_string(whole.extent(0)) + " elements, expected " + std::to_string(n) +
                                         " x " + std::to_string(size) + " ranks (rank " + std::to_string(comm_.rank()) +
                                         ")");
}

namespace impl {
/// Host view over v's data: v itself when host-accessible, else a mirror filled from v.
template <class Exec, class V>
auto stage_in(const Exec& exec, const V& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(exec, h, v);
  compat::fence(exec, "kdist::comm: producer done before MPI");
  return h;
}
/// After a sum: divide by the rank count for an average, then copy the host result to `dst`.
template <class Exec, class H, class V>
void finish_reduction(const Exec& exec, const H& host, const V& dst, ReduceOp op, int ranks) {
  using T = typename H::non_const_value_type;
  if (op == ReduceOp::average) {
    const T f = T(1) / static_cast<T>(ranks);
    for (std::size_t i = 0; i < host.extent(0); ++i) host(i) *= f;
  }
  Kokkos::deep_copy(exec, dst, host);
}
}  // namespace impl

template <class Exec, class V>
Request Engine::allreduce(const Exec& exec, const V& v, ReduceOp op, std::string label) {
  check_view("kdist::comm::Engine::allreduce", v);
  using T = typename V::non_const_value_type;
  auto h = impl::stage_in(exec, v);
  const int n = static_cast<int>(v.extent(0));
  const int size = comm_.size();
  MPI_Comm c = comm_.raw();
  auto o = make_op(OpKind::allreduce, dtype_of<T>(), n, std::move(label));
  o->schedule.step()
      .collective([h, n, c, op](MPI_Request* r) {
        return MPI_Iallreduce(MPI_IN_PLACE, h.data(), n, mpi_type<T>(), mpi_op(op), c, r);
      })
      .then([h, v, op, size, exec] { impl::finish_reduction(exec, h, v, op, size); });
  return enqueue(std::move(o));
}

template <class Exec, class V>
Request Engine::broadcast(const Exec& exec, const V& v, int root, std::string label) {
  check_view("kdist::comm::Engine::broadcast", v);
  using T = typename V::non_const_value_type;
  if (root < 0 || root >= comm_.size())
    kdist::impl::throw_invalid("kdist::comm::Engine::broadcast",
                               "root " + std::to_string(root) + " is not a rank of " + std::to_string(comm_.size()));
  auto h = impl::stage_in(exec, v);
  const int n = static_cast<int>(v.extent(0));
  MPI_Comm c = comm_.raw();
  auto o = make_op(OpKind::broadcast, dtype_of<T>(), n, std::move(label), root);
  o->schedule.step()
      .collective([h, n, root, c](MPI_Request* r) { return MPI_Ibcast(h.data(), n, mpi_type<T>(), root, c, r); })
      .then([h, v, exec] { Kokkos::deep_copy(exec, v, h); });
  return enqueue(std::move(o));
}

template <class Exec, class VIn, class VOut>
Request Engine::reduce_scatter(const Exec& exec, const VIn& in, const VOut& out, ReduceOp op, std::string label) {
  check_blocks("kdist::comm::Engine::reduce_scatter", in, out, "input");
  using T = typename VOut::non_const_value_type;
  const int size = comm_.size();
  const int n = static_cast<int>(out.extent(0));
  auto hin = impl::stage_in(exec, in);
  auto hout = Kokkos::create_mirror_view(out);
  MPI_Comm c = comm_.raw();
  auto o = make_op(OpKind::reduce_scatter, dtype_of<T>(), n, std::move(label));
  o->schedule.step()
      .collective([hin, hout, n, c, op](MPI_Request* r) {
        return MPI_Ireduce_scatter_block(hin.data(), hout.data(), n, mpi_type<T>(), mpi_op(op), c, r);
      })
      .then([hout, out, op, size, exec] { impl::finish_reduction(exec, hout, out, op, size); });
  return enqueue(std::move(o));
}

template <class Exec, class VIn, class VOut>
Request Engine::allgather(const Exec& exec, const VIn& in, const VOut& out, std::string label) {
  check_blocks("kdist::comm::Engine::allgather", out, in, "output");
  using T = typename VOut::non_const_value_type;
  const int n = static_cast<int>(in.extent(0));
  auto hin = impl::stage_in(exec, in);
  auto hout = Kokkos::create_mirror_view(out);
  MPI_Comm c = comm_.raw();
  auto o = make_op(OpKind::allgather, dtype_of<T>(), n, std::move(label));
  o->schedule.step()
      .collective([hin, hout, n, c](MPI_Request* r) {
        return MPI_Iallgather(hin.data(), n, mpi_type<T>(), hout.data(), n, mpi_type<T>(), c, r);
      })
      .then([hout, out, exec] { Kokkos::deep_copy(exec, out, hout); });
  return enqueue(std::move(o));
}

template <class Exec, class V>
Request Engine::send(const Exec& exec, const V& v, int dest, int tag, std::string label) {
  check_view("kdist::comm::Engine::send", v);
  using T = typename V::non_const_value_type;
  auto h = impl::stage_in(exec, v);
  auto o = make_op(OpKind::send, dtype_of<T>(), static_cast<long long>(v.extent(0)), std::move(label));
  o->schedule.step().send(dest, h.data(), static_cast<int>(v.extent(0)), mpi_type<T>(), tag).then([h] {
  });  // keeps the staging buffer alive until the send completes
  return enqueue(std::move(o));
}

template <class Exec, class V>
Request Engine::recv(const Exec& exec, const V& v, int source, int tag, std::string label) {
  check_view("kdist::comm::Engine::recv", v);
  using T = typename V::non_const_value_type;
  auto h = Kokkos::create_mirror_view(v);
  auto o = make_op(OpKind::recv, dtype_of<T>(), static_cast<long long>(v.extent(0)), std::move(label));
  o->schedule.step().recv(source, h.data(), static_cast<int>(v.extent(0)), mpi_type<T>(), tag).then([h, v, exec] {
    Kokkos::deep_copy(exec, v, h);
  });
  return enqueue(std::move(o));
}

}  // namespace comm
}  // namespace kdist
