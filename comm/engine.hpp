// Engine: one ordered stream of communication operations on its own wire. Every byte kdist
// moves between ranks goes through an Engine.
//
// - Wire: the Engine duplicates the Communicator it is given (MPI errors are returned, never
//   fatal), so two Engines on one Communicator never interleave. Sub-groups for Schedule steps
//   come from node_group()/cross_node_group(), which run inside the checked stream.
// - Operations (all-reduce sum/average/min/max, broadcast, reduce-scatter, all-gather, send/recv,
//   composite Schedules) return a Request, valid after the Engine is gone. Views in any memory
//   space: host memory goes to MPI as is; device memory is staged through the host, or handed to
//   GPU-aware MPI, or enqueued on NCCL on the caller's stream (comm/impl/engine_core.hpp says how).
// - Progress: no thread; every call (submit, test, wait, progress) advances everything in flight.
// - Every collective is checked across ranks before its payload moves (a composite may send its
//   first bytes inside the check, CheckPayload, read only once the ranks agree); a rank that fails,
//   finishes early or stalls is reported on every rank (README "Errors": what, and its cost).
// - Any count: collectives past EngineOptions::max_call_elements (2^31 - 1) go out in pieces,
//   point-to-point transfers through MPI 4's large-count calls (docs/comm.md, "Message sizes").
// - An error while posting a step (e.g. a count no MPI call can carry) fails the Engine on
//   every rank, like an error in a step's local work.
// - One thread at a time per Engine; a second concurrent caller gets InvalidArgument.
#pragma once

#include <kdist/comm/communicator.hpp>
#include <kdist/comm/schedule.hpp>
#include <kdist/config.hpp>
#include <kdist/core/compat.hpp>
#include <kdist/core/dtype.hpp>
#include <kdist/core/error.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace kdist {
namespace comm {

using kdist::DType;
using kdist::dtype_of;
using kdist::to_string;

/// Operation kinds as they appear in signatures and messages.
enum class OpKind : int {
  allreduce = 1,
  broadcast = 2,
  reduce_scatter = 3,
  allgather = 4,
  send = 5,
  recv = 6,
  composite = 7,
  split = 8,
  finish = 9
};
const char* to_string(OpKind kind);

/// Raised on every rank when ranks submit different collectives at the same position.
class MismatchError : public Error {
 public:
  using Error::Error;
};
/// Raised when another rank failed (its message is included) or stopped talking.
class RemoteError : public Error {
 public:
  using Error::Error;
};
/// Raised when an operation waited longer than EngineOptions::stall_timeout_seconds.
class StallError : public Error {
 public:
  using Error::Error;
};

/// Tensor boundaries (element offsets, 0 ... n) and labels of a fused buffer: part of the
/// signature, so ranks that fuse differently are caught before data moves.
struct Layout {
  std::vector<std::size_t> bounds;
  std::vector<std::string> labels;
  /// Tensors (indices into labels) held as the packed upper triangle of a symmetric matrix
  /// (FusedAllreducer): elementwise reductions do not care, Adasum's dot products would (each
  /// off-diagonal entry stands for two). Hashed, so every rank must pack the same tensors.
  std::vector<std::size_t> symmetric;
  bool empty() const noexcept { return bounds.empty(); }
  std::uint64_t hash() const;
  /// Short text for messages: "3 tensors [10 10 10]".
  std::string summary() const;
};

/// What the signature check compares (built by the Engine's operations; composites pass theirs).
/// Made through the named constructors, one per operation kind.
struct OpDescription {
  OpKind kind = OpKind::composite;
  DType dtype = DType::bytes;
  long long count = 0;
  int root = -1;  ///< broadcast: the root; send/recv: the peer; split: the node size
  ReduceOp op = ReduceOp::sum;
  std::string label;
  Layout layout;
  /// What else every rank must have chosen alike (a composite's plan, e.g. Adasum's algorithm and
  /// chunking), in words: hashed into the signature with the label, and shown in a mismatch report.
  std::string plan;

  /// A composite Schedule of `count` elements of `dtype` per rank (Engine::submit).
  static OpDescription composite(DType dtype, long long count, std::string label, Layout layout = {},
                                 std::string plan = {}) {
    return {OpKind::composite, dtype, count, -1, ReduceOp::sum, std::move(label), std::move(layout), std::move(plan)};
  }
  static OpDescription allreduce(DType dtype, long long count, ReduceOp op, std::string label, Layout layout = {}) {
    return {OpKind::allreduce, dtype, count, -1, op, std::move(label), std::move(layout), {}};
  }
  static OpDescription broadcast(DType dtype, long long count, int root, std::string label) {
    return {OpKind::broadcast, dtype, count, root, ReduceOp::sum, std::move(label), {}, {}};
  }
  /// `count`: the elements each rank keeps.
  static OpDescription reduce_scatter(DType dtype, long long count, ReduceOp op, std::string label) {
    return {OpKind::reduce_scatter, dtype, count, -1, op, std::move(label), {}, {}};
  }
  /// `count`: the elements each rank contributes.
  static OpDescription allgather(DType dtype, long long count, std::string label) {
    return {OpKind::allgather, dtype, count, -1, ReduceOp::sum, std::move(label), {}, {}};
  }
  static OpDescription send(DType dtype, long long count, int dest, std::string label) {
    return {OpKind::send, dtype, count, dest, ReduceOp::sum, std::move(label), {}, {}};
  }
  static OpDescription recv(DType dtype, long long count, int source, std::string label) {
    return {OpKind::recv, dtype, count, source, ReduceOp::sum, std::move(label), {}, {}};
  }
  /// The agreement that every rank splits the Engine's wire into node groups here.
  static OpDescription split(int node_size, std::string label) {
    return {OpKind::split, DType::int32, node_size, -1, ReduceOp::sum, std::move(label), {}, {}};
  }
  /// The agreement that every rank is done (Engine::finish).
  static OpDescription finish() { return {OpKind::finish, DType::bytes, 0, -1, ReduceOp::sum, "finish", {}, {}}; }
};

/// Bytes an operation exchanges with rank ^ 1 inside its signature check's first message
/// (Engine::submit): one message where a schedule's first exchange would have sent another.
struct CheckPayload {
  const void* out = nullptr;  ///< copied at submission
  void* in = nullptr;         ///< rank ^ 1's bytes, written once the check agreed, before step 1
  std::size_t bytes = 0;
};

struct EngineOptions {
  /// Check every payload operation across ranks before it moves. Ranks must agree (InvalidArgument on
  /// every rank at construction otherwise).
  bool check_consistency = true;
  /// Print where every rank is after waiting this long (Horovod's stall inspector). Unset (< 0):
  /// KDIST_STALL_WARNING_SECONDS, else 60. A value set here wins over the environment.
  double stall_warning_seconds = -1.0;
  /// > 0: after waiting this long, raise StallError here and RemoteError on every other rank.
  /// Unset (< 0): KDIST_STALL_TIMEOUT_SECONDS, else 0 (never).
  double stall_timeout_seconds = -1.0;
  /// > 0: the largest tag the Engine's composite schedules use (at most MPI_TAG_UB; below
  /// 2 * Schedule::kMaxTag - 1 on any rank, InvalidArgument on every rank), e.g. to leave the
  /// tags above it to the application; 0: MPI_TAG_UB. The ranks use the smallest limit any asked
  /// for. Composites take tag blocks of kMaxTag in turn; one posts its transfers only once the
  /// earlier operations on its block have finished (submitting never waits).
  int tag_limit = 0;
  /// > 0: the most elements one MPI collective call carries (at most 2^31 - 1, MPI's int count);
  /// larger all-reduces, broadcasts, reduce-scatter blocks and all-gather blocks go out as several
  /// calls (for an MPI library with trouble near 2 GiB messages). 0: 2^31 - 1. The ranks use the
  /// smallest value any asked for; a negative one on any rank is an InvalidArgument on every rank.
  /// NCCL steps are never split.
  long long max_call_elements = 0;
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

namespace impl {
struct Operation;
struct EngineCore;
}  // namespace impl

/// Handle on an operation. Copyable; valid after the Engine is destroyed.
class Request {
 public:
  Request() = default;
  /// Advances the engine; true once the operation is complete (its results are in place).
  bool test();
  /// Blocks until complete; rethrows the operation's error (MismatchError, RemoteError, ...).
  void wait();
  bool valid() const noexcept { return op_ != nullptr; }

 private:
  friend class Engine;
  Request(std::weak_ptr<impl::EngineCore> engine, std::shared_ptr<impl::Operation> op)
      : engine_(std::move(engine)), op_(std::move(op)) {}
  std::weak_ptr<impl::EngineCore> engine_;
  std::shared_ptr<impl::Operation> op_;
};

class Engine {
 public:
  /// Collective over `comm`: duplicates it into this Engine's private wire.
  explicit Engine(const Communicator& comm, EngineOptions options = {});
  /// Without an exception propagating: finish() (completes the work in flight and checks that
  /// every rank is done). While one propagates, or after an error: tells the peers and returns
  /// at once. Errors are printed, never thrown.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Communicator& communicator() const noexcept;
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// True when `rank` shares this rank's shared-memory node (MPI_Comm_split_type at construction).
  bool shares_node(int rank) const noexcept;

  /// In place: v := the reduction of v over all ranks. average needs a floating-point element type
  /// (InvalidArgument otherwise, as for reduce_scatter).
  template <class Exec, class V>
  Request allreduce(const Exec& exec, const V& v, ReduceOp op = ReduceOp::sum, std::string label = "allreduce",
                    Layout layout = {});
  /// Blocking, on the host: `values` reduced over all ranks (collective and checked like
  /// allreduce). For the few numbers ranks agree on: a job's sums, a status flag, sizes.
  template <class T>
  std::vector<T> allreduce_values(std::vector<T> values, ReduceOp op, std::string label);
  /// In place: v := root's v.
  template <class Exec, class V>
  Request broadcast(const Exec& exec, const V& v, int root, std::string label = "broadcast");
  /// out (n) := this rank's block of the reduction of in (n * size) over all ranks.
  template <class Exec, class VIn, class VOut>
  Request reduce_scatter(const Exec& exec, const VIn& in, const VOut& out, ReduceOp op = ReduceOp::sum,
                         std::string label = "reduce_scatter");
  /// out (n * size) := every rank's in (n), in rank order.
  template <class Exec, class VIn, class VOut>
  Request allgather(const Exec& exec, const VIn& in, const VOut& out, std::string label = "allgather");
  /// Point-to-point (not checked: only two ranks take part); tags below Schedule::kMaxTag. A peer
  /// outside [0, size) (here or in a composite's transfers) is an InvalidArgument raised before
  /// anything is posted; it fails the Engine, so the other ranks raise RemoteError, not hang. An
  /// error MPI reports in a posted transfer (a receive shorter than its send) fails the Engine
  /// the same way, naming the operation, where MPI returns it (MPICH raises it on
  /// MPI_COMM_WORLD's error handler: by default the job aborts with MPI's message). With NCCL,
  /// device send/recv are launched at the next call that progresses the Engine (a wait, test,
  /// progress(), any other submission), all those submitted since in one NCCL group, as PyTorch's
  /// batch_isend_irecv does: NCCL matches a send to this rank only inside one group, and a receive
  /// launched alone would hold its stream until the peer's send. NCCL has no tags: device
  /// transfers between two ranks pair up in the order they are posted, whatever their tags.
  template <class Exec, class V>
  Request send(const Exec& exec, const V& v, int dest, int tag, std::string label = "send");
  template <class Exec, class V>
  Request recv(const Exec& exec, const V& v, int source, int tag, std::string label = "recv");

  /// Runs a composite schedule; `what` is its signature (kind composite). With check_consistency
  /// its first step starts only once the ranks agree, i.e. once every rank has submitted it
  /// (adasum's in-place reads rely on that).
  Request submit(Schedule schedule, OpDescription what);
  /// The same, with `payload` exchanged with rank ^ 1 in the check (Adasum's small messages at
  /// 2 ranks: the whole operation is one message). The bytes cross before the ranks are known to
  /// agree, but nothing reads them unless they do. Needs check_consistency and a power-of-two
  /// size >= 2 (InvalidArgument otherwise).
  Request submit(Schedule schedule, OpDescription what, CheckPayload payload);

  /// Collective and checked: completes the work in flight, then splits this Engine's wire into
  /// nodes (node_size > 0: consecutive blocks of that many ranks; 0: shared-memory nodes), or
  /// into cross-node groups (one rank per node, same position). Groups for Schedule steps.
  Communicator node_group(int node_size = 0);
  Communicator cross_node_group(int node_size = 0);

  /// Advances every operation in flight without blocking.
  void progress();
  /// Waits for every operation in flight.
  void wait_all();
  std::size_t in_flight() const noexcept;
  /// Collective and checked: waits for everything, then agrees that every rank is done; a rank
  /// still submitting is named in a MismatchError. The Engine takes no work afterwards.
  void finish();
  /// Reports a failure outside any Engine call (a bad file, an unwritable path) to every rank:
  /// call it from your catch block, before the Engine is destroyed, so the peers learn the reason
  /// (otherwise they only learn that this rank destroyed its Engine while an exception propagated).
  /// Marks this Engine failed: pending and later operations here rethrow `error` itself, its type
  /// kept; on every other rank they raise RemoteError naming this rank, with error's what() (for a
  /// non-std exception, "an exception that is not a std::exception"). Once this Engine has failed
  /// (fail() was called, or a peer's RemoteError reached it), fail() does nothing: no message, no
  /// throw, and the first reason stays. The destructor then returns without finish() or another
  /// message. A null `error` is an InvalidArgument.
  void fail(std::exception_ptr error);
  /// The same; `error` is kept when it is the exception being handled (a catch block's), else
  /// copied as a kdist::Error with its message.
  void fail(const std::exception& error);
  /// False once a mismatch, a failure here or on a peer, or finish() happened.
  bool healthy() const noexcept;

  EngineStats stats() const;
  void reset_stats();
  const EngineOptions& options() const noexcept;

 private:
  friend class Request;
  template <class V>
  static void check_view(const char* func, const V& v);
  template <class VWhole, class VBlock>
  void check_blocks(const char* func, const VWhole& whole, const VBlock& block, const char* whole_role) const;
  template <class T>
  void check_op(const char* func, ReduceOp op, long long count, const std::string& label) const;
  Request enqueue(OpDescription what, Schedule schedule, CheckPayload payload = {});
  Communicator split_group(bool node, int node_size);

  std::shared_ptr<impl::EngineCore> core_;
  int rank_ = 0;
  int size_ = 1;
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
  const std::size_t n = block.extent(0), size = static_cast<std::size_t>(size_);
  if (whole.extent(0) != n * size)
    kdist::impl::throw_invalid(func, std::string(whole_role) + " '" + whole.label() + "' has " +
                                         std::to_string(whole.extent(0)) + " elements, expected " + std::to_string(n) +
                                         " x " + std::to_string(size) + " ranks (rank " + std::to_string(rank_) + ")");
}

// An integer average would scale by T(1) / T(ranks), which is 0 beyond one rank: every element
// would silently become 0. Rejected on every rank alike (the element type and op are the caller's).
template <class T>
void Engine::check_op(const char* func, ReduceOp op, long long count, const std::string& label) const {
  if (op == ReduceOp::average && !std::is_floating_point<T>::value)
    kdist::impl::throw_invalid(func, std::string("average of ") + to_string(dtype_of<T>()) + " (" +
                                         std::to_string(count) + " elements, label '" + label + "', rank " +
                                         std::to_string(rank_) +
                                         ") is not supported: integers cannot hold 1/ranks; sum, then divide");
}

namespace impl {
/// True when the wire takes V's memory as it is: host memory, or device memory with NCCL (on the
/// caller's stream) or with KDIST_ENABLE_GPU_AWARE_MPI.
template <class V>
constexpr bool wire_reaches() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible ||
         KDIST_ENABLE_GPU_AWARE_MPI || KDIST_ENABLE_NCCL;
}
/// The CUDA stream of a Kokkos instance (nullptr for host spaces): NCCL enqueues there.
template <class Exec>
void* stream_of(const Exec& exec) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same<Exec, Kokkos::Cuda>::value) return static_cast<void*>(exec.cuda_stream());
#endif
  (void)exec;
  return nullptr;
}
/// Whether MPI reads or writes V's memory where it is: then the caller's instance is fenced first.
/// NCCL needs no fence (it runs on the instance's stream, in order with the work queued there).
template <class V>
constexpr bool mpi_in_place() {
  return wire_reaches<V>() &&
         (!KDIST_ENABLE_NCCL || Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible);
}
/// Whether stage_in fences the caller's instance for V (MPI reads it in place, or a host copy).
template <class V>
constexpr bool stage_in_fences() {
  return !wire_reaches<V>() || mpi_in_place<V>();
}
/// The view the wire reads and writes: `v` itself when the wire reaches its memory, else a host
/// mirror filled from `v`.
template <class Exec, class V>
auto stage_in(const Exec& exec, const V& v) {
  if constexpr (wire_reaches<V>()) {
    if (mpi_in_place<V>()) compat::fence(exec, "kdist::comm: producer done before MPI");
    return v;
  } else {
    auto h = Kokkos::create_mirror_view(v);
    Kokkos::deep_copy(exec, h, v);
    compat::fence(exec, "kdist::comm: producer done before MPI");
    return h;
  }
}
/// Wire view for an output (no copy in): `v` itself when the wire reaches its memory, after a
/// fence of the caller's instance when MPI writes it (work queued there may still read or write
/// `v`) unless the caller's stage_in has just fenced it. Else a host mirror, copied back on the
/// instance afterwards.
template <class Exec, class V>
auto stage_out(const Exec& exec, const V& v, bool instance_fenced = false) {
  if constexpr (wire_reaches<V>()) {
    if (mpi_in_place<V>() && !instance_fenced) compat::fence(exec, "kdist::comm: consumers done before MPI writes");
    return v;
  } else {
    (void)exec;
    (void)instance_fenced;
    return Kokkos::create_mirror_view(v);
  }
}
/// After a reduction: divide by the rank count for an average, then copy the wire view to `dst`
/// (asynchronously on `exec` when they differ).
template <class Exec, class W, class V>
void finish_reduction(const Exec& exec, const W& wire, const V& dst, ReduceOp op, int ranks) {
  using T = typename W::non_const_value_type;
  constexpr bool on_exec = Kokkos::SpaceAccessibility<Exec, typename W::memory_space>::accessible;
  using WireExec = std::conditional_t<on_exec, Exec, Kokkos::DefaultHostExecutionSpace>;
  if (op == ReduceOp::average) {
    const T f = T(1) / static_cast<T>(ranks);
    WireExec wexec;
    if constexpr (on_exec) wexec = exec;
    Kokkos::parallel_for(
        "kdist::comm::average", Kokkos::RangePolicy<WireExec>(wexec, 0, wire.extent(0)),
        KOKKOS_LAMBDA(const std::size_t i) { wire(i) *= f; });
  }
  if (wire.data() != dst.data()) Kokkos::deep_copy(exec, dst, wire);
}
}  // namespace impl

template <class Exec, class V>
Request Engine::allreduce(const Exec& exec, const V& v, ReduceOp op, std::string label, Layout layout) {
  check_view("kdist::comm::Engine::allreduce", v);
  using T = typename V::non_const_value_type;
  check_op<T>("kdist::comm::Engine::allreduce", op, static_cast<long long>(v.extent(0)), label);
  auto w = impl::stage_in(exec, v);
  const int size = size_;
  Schedule s(label);
  s.step().on_stream(impl::stream_of(exec)).allreduce(Group::all(), Buffer::of(w), op).then([w, v, op, size, exec] {
    impl::finish_reduction(exec, w, v, op, size);
  });
  return enqueue(OpDescription::allreduce(dtype_of<T>(), static_cast<long long>(v.extent(0)), op, std::move(label),
                                          std::move(layout)),
                 std::move(s));
}

template <class T>
std::vector<T> Engine::allreduce_values(std::vector<T> values, ReduceOp op, std::string label) {
  // A managed view, not one wrapping `values`: after an error the wire may still hold the buffer.
  Kokkos::View<T*, Kokkos::HostSpace> v(label, values.size());
  std::copy(values.begin(), values.end(), v.data());
  allreduce(Kokkos::DefaultHostExecutionSpace(), v, op, std::move(label)).wait();
  std::copy_n(v.data(), values.size(), values.begin());
  return values;
}

template <class Exec, class V>
Request Engine::broadcast(const Exec& exec, const V& v, int root, std::string label) {
  check_view("kdist::comm::Engine::broadcast", v);
  using T = typename V::non_const_value_type;
  if (root < 0 || root >= size_)
    kdist::impl::throw_invalid(
        "kdist::comm::Engine::broadcast",
        "root " + std::to_string(root) + " is not a rank of " + std::to_string(size_) + " (label '" + label + "')");
  auto w = impl::stage_in(exec, v);
  Schedule s(label);
  s.step().on_stream(impl::stream_of(exec)).broadcast(Group::all(), Buffer::of(w), root).then([w, v, exec] {
    if (w.data() != v.data()) Kokkos::deep_copy(exec, v, w);
  });
  return enqueue(OpDescription::broadcast(dtype_of<T>(), static_cast<long long>(v.extent(0)), root, std::move(label)),
                 std::move(s));
}

template <class Exec, class VIn, class VOut>
Request Engine::reduce_scatter(const Exec& exec, const VIn& in, const VOut& out, ReduceOp op, std::string label) {
  check_blocks("kdist::comm::Engine::reduce_scatter", in, out, "input");
  using T = typename VOut::non_const_value_type;
  check_op<T>("kdist::comm::Engine::reduce_scatter", op, static_cast<long long>(out.extent(0)), label);
  const int size = size_;
  auto win = impl::stage_in(exec, in);
  auto wout = impl::stage_out(exec, out, impl::stage_in_fences<VIn>());
  Schedule s(label);
  s.step()
      .on_stream(impl::stream_of(exec))
      .reduce_scatter(Group::all(), Buffer::of(win), Buffer::of(wout), op)
      .then([win, wout, out, op, size, exec] { impl::finish_reduction(exec, wout, out, op, size); });
  return enqueue(
      OpDescription::reduce_scatter(dtype_of<T>(), static_cast<long long>(out.extent(0)), op, std::move(label)),
      std::move(s));
}

template <class Exec, class VIn, class VOut>
Request Engine::allgather(const Exec& exec, const VIn& in, const VOut& out, std::string label) {
  check_blocks("kdist::comm::Engine::allgather", out, in, "output");
  using T = typename VOut::non_const_value_type;
  auto win = impl::stage_in(exec, in);
  auto wout = impl::stage_out(exec, out, impl::stage_in_fences<VIn>());
  Schedule s(label);
  s.step()
      .on_stream(impl::stream_of(exec))
      .allgather(Group::all(), Buffer::of(win), Buffer::of(wout))
      .then([win, wout, out, exec] {
        if (wout.data() != out.data()) Kokkos::deep_copy(exec, out, wout);
      });
  return enqueue(OpDescription::allgather(dtype_of<T>(), static_cast<long long>(in.extent(0)), std::move(label)),
                 std::move(s));
}

template <class Exec, class V>
Request Engine::send(const Exec& exec, const V& v, int dest, int tag, std::string label) {
  check_view("kdist::comm::Engine::send", v);
  using T = typename V::non_const_value_type;
  auto w = impl::stage_in(exec, v);
  Schedule s(label);
  s.step().on_stream(impl::stream_of(exec)).send(dest, Buffer::of(w), tag).then([w] {
  });  // keeps the wire buffer alive until sent
  return enqueue(OpDescription::send(dtype_of<T>(), static_cast<long long>(v.extent(0)), dest, std::move(label)),
                 std::move(s));
}

template <class Exec, class V>
Request Engine::recv(const Exec& exec, const V& v, int source, int tag, std::string label) {
  check_view("kdist::comm::Engine::recv", v);
  using T = typename V::non_const_value_type;
  auto w = impl::stage_out(exec, v);
  Schedule s(label);
  s.step().on_stream(impl::stream_of(exec)).recv(source, Buffer::of(w), tag).then([w, v, exec] {
    if (w.data() != v.data()) Kokkos::deep_copy(exec, v, w);
  });
  return enqueue(OpDescription::recv(dtype_of<T>(), static_cast<long long>(v.extent(0)), source, std::move(label)),
                 std::move(s));
}

}  // namespace comm
}  // namespace kdist
