// The Engine as a coordinator: entry (one thread at a time), submission, the ordered progress of
// every operation in flight, waiting, and teardown. Read engine.hpp for the contract; the
// machinery it coordinates (wires, control channel, consistency check, MPI and NCCL steps, stall
// inspector) is listed in comm/impl/engine_core.hpp, one unit per concern.
//
// Progress: operations advance in submission order; a step with a collective is posted only when
// no earlier operation still has a collective to post, so collectives enter MPI (and NCCL) in the
// same order on every rank; with NCCL, which has no tags, a composite's device transfers likewise
// wait for earlier composites' ones. Signatures are judged in submission order too, so every rank
// raises a mismatch at the same operation.
#include <kdist/comm/engine.hpp>
#include <kdist/comm/impl/engine_core.hpp>
#include <kdist/core/phase.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <thread>

namespace kdist {
namespace comm {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::allreduce:
      return "allreduce";
    case OpKind::broadcast:
      return "broadcast";
    case OpKind::reduce_scatter:
      return "reduce_scatter";
    case OpKind::allgather:
      return "allgather";
    case OpKind::send:
      return "send";
    case OpKind::recv:
      return "recv";
    case OpKind::composite:
      return "composite";
    case OpKind::split:
      return "split";
    case OpKind::finish:
      return "finish";
  }
  return "unknown";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::average:
      return "average";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
  }
  return "unknown";
}

std::uint64_t Layout::hash() const {
  if (bounds.empty()) return 0;
  impl::Hasher h;
  h.bytes(bounds.data(), bounds.size() * sizeof(std::size_t));  // the length goes in first
  for (const auto& l : labels) h.text(l);
  // A flat tensor and a packed symmetric one of the same size would sum alike but not Adasum alike.
  if (!symmetric.empty()) h.bytes(symmetric.data(), symmetric.size() * sizeof(std::size_t));
  return static_cast<std::uint64_t>(h.value()) | 1;  // never 0: 0 means "no layout"
}

std::string Layout::summary() const {
  if (bounds.empty()) return "";
  std::ostringstream os;
  os << bounds.size() - 1 << " tensors [";
  for (std::size_t t = 0; t + 1 < bounds.size(); ++t) {
    if (os.tellp() > 80) {
      os << " ...";
      break;
    }
    os << (t ? " " : "") << bounds[t + 1] - bounds[t];
    if (t < labels.size()) os << ":" << labels[t];
    if (std::find(symmetric.begin(), symmetric.end(), t) != symmetric.end()) os << "(packed)";
  }
  os << "]";
  return os.str();
}

namespace impl {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double env_or(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

std::vector<std::shared_ptr<const void>>& graveyard() {
  static auto* g = new std::vector<std::shared_ptr<const void>>;  // never freed: MPI may still use it
  return *g;
}

std::string Operation::describe() const {
  std::ostringstream os;
  os << "operation #" << seq << " " << to_string(what.kind) << " '" << what.label << "'";
  if (state == State::checking)
    os << " (signature check pending)";
  else
    os << " (step " << step + 1 << " of " << schedule.steps().size() << ")";
  return os.str();
}

namespace {
std::atomic<std::uint64_t> g_next_engine_id{1};
}  // namespace

}  // namespace impl

using impl::EngineCore;
using impl::Operation;
using State = impl::Operation::State;

namespace {

// One thread at a time per Engine; the owning thread may re-enter (local work calling progress).
class Entry {
 public:
  Entry(EngineCore& c, const char* func) : c_(c) {
    std::thread::id none;
    const std::thread::id me = std::this_thread::get_id();
    if (!c_.owner.compare_exchange_strong(none, me)) {
      if (none != me)
        kdist::impl::throw_invalid(func, "another thread is using this Engine (rank " + std::to_string(c_.rank) +
                                             "); one thread at a time per Engine");
      outer_ = false;
    }
  }
  ~Entry() {
    if (outer_) c_.owner.store(std::thread::id());
  }
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;

 private:
  EngineCore& c_;
  bool outer_ = true;
};

// Runs the step's local work. An exception from a middle step leaves peers waiting for this
// rank's later steps: it fails the Engine everywhere. From the last step only this operation.
void run_local_work(EngineCore& c, Operation& op, Schedule::Step& s, bool last) {
  if (!s.local_work) return;
  try {
    s.local_work();
  } catch (const std::exception& e) {
    auto p = std::current_exception();
    if (last) {
      op.error = p;
      op.state = State::failed;
    } else {
      c.fail_everywhere(p, std::string("error in '") + op.what.label + "': " + e.what());
    }
  }
}

// Work that overlaps the step's transfers; they are in flight, so an error fails the Engine.
void run_overlap_work(EngineCore& c, Operation& op, Schedule::Step& s) {
  if (!s.overlap_work) return;
  try {
    s.overlap_work();
  } catch (const std::exception& e) {
    c.fail_everywhere(std::current_exception(), std::string("error in '") + op.what.label + "': " + e.what());
  }
}

// Posts the step; false (the Engine failed everywhere, op with it) when posting threw.
bool post_or_fail(EngineCore& c, Operation& op, Schedule::Step& s) {
  try {
    impl::post_step(c, op, s);
    return true;
  } catch (const std::exception& e) {
    c.fail_everywhere(std::current_exception(), std::string("error posting ") + op.describe() + " on rank " +
                                                    std::to_string(c.rank) + ": " + e.what());
  }
  return false;
}

// Composite k takes tag block 1 + k mod (tag_blocks - 1) (block 0: user send/recv). Two operations
// on one block would exchange messages with the same peers and tags, and their steps post in
// whatever order they progress: an operation posts its transfers only once every earlier one on
// its block that has transfers is finished (the same earlier ones on every rank). Submitting never
// waits. MPI_TAG_UB at MPI's minimum, 32767, gives 7 blocks.
bool tag_block_busy(const EngineCore& c, const Operation& op) {
  for (const auto& earlier : c.inflight) {
    if (earlier.get() == &op) return false;
    if (earlier->uses_tags && earlier->tag_base == op.tag_base && !earlier->finished()) return true;
  }
  return false;
}

// Tests the step's requests; false (the Engine failed everywhere) when MPI reports an error in
// them, e.g. a receive truncated by a longer send: the peers would otherwise wait for ever.
bool test_or_fail(EngineCore& c, Operation& op, int& done) {
  done = 1;
  if (op.requests.empty()) return true;
  try {
    c.ok(MPI_Testall(static_cast<int>(op.requests.size()), op.requests.data(), &done, MPI_STATUSES_IGNORE),
         "MPI_Testall");
    return true;
  } catch (const std::exception& e) {
    const std::string text = "error in " + op.describe() + " on rank " + std::to_string(c.rank) + ": " + e.what();
    c.fail_everywhere(std::make_exception_ptr(BackendError("kdist::comm: " + text)), text);
  }
  return false;
}

// NCCL pairs a rank's sends and receives with a peer in the order it launches them; it has no
// tags. Two composites with device transfers in flight at once could launch theirs in different
// orders on two ranks (each step waits for the one before it, rank by rank) and swap their data:
// with NCCL a composite's device transfers post in submission order, which checked operations
// share on every rank, as collectives do.
bool nccl_transfers(const EngineCore& c, const Schedule::Step& s) {
#if KDIST_ENABLE_NCCL
  return c.nccl && !s.transfers.empty() && s.device();
#else
  (void)c;
  (void)s;
  return false;
#endif
}

bool nccl_transfers_left(const EngineCore& c, const Operation& op) {
  const auto& steps = op.schedule.steps();
  for (std::size_t i = op.step; i < steps.size(); ++i)
    if (nccl_transfers(c, steps[i])) return true;
  return false;
}

/// What the operations before the one advancing still hold back, in submission order.
struct Earlier {
  bool collectives_pending = false;
  bool nccl_transfers_pending = false;  ///< composites' device transfers (NCCL)

  void add(const EngineCore& c, const Operation& op) {
    collectives_pending = collectives_pending || op.collectives_left > 0;
    nccl_transfers_pending = nccl_transfers_pending || (op.seq >= 0 && nccl_transfers_left(c, op));
  }
};

void advance(EngineCore& c, Operation& op, Earlier& earlier, bool hold_device_p2p) {
  if (op.finished()) return;
  if (op.state == State::checking) {
    if (!op.check.advance(c.check_wire())) {
      earlier.add(c, op);
      return;
    }
    impl::judge_check(c, op);
  }
  auto& steps = op.schedule.steps();
  while (op.step < steps.size() && !op.finished()) {
    Schedule::Step& s = steps[op.step];
    if (!op.step_posted) {
      if (hold_device_p2p && op.seq < 0 && s.device()) break;
      if (s.collective.kind != Schedule::CollectiveKind::none && earlier.collectives_pending) break;
      if (op.seq >= 0 && earlier.nccl_transfers_pending && nccl_transfers(c, s)) break;
      if (!s.transfers.empty() && tag_block_busy(c, op)) break;
      // A step posted in part (or not at all) leaves its peers waiting for the rest: an error here
      // fails the Engine everywhere, like any other failure, instead of escaping from whichever
      // call happened to progress it with the operation still in flight.
      if (!post_or_fail(c, op, s)) return;
      run_overlap_work(c, op, s);
    }
    int done = 1;
    if (!test_or_fail(c, op, done)) return;
#if KDIST_ENABLE_NCCL
    if (op.nccl_done) {
      if (!op.nccl_done->done()) break;
      op.nccl_done.reset();
    }
#endif
    if (!done) break;
    run_local_work(c, op, s, op.step + 1 == steps.size());
    s = Schedule::Step{};  // release captured buffers early
    ++op.step;
    op.step_posted = false;
  }
  if (op.state == State::ready && op.step >= steps.size()) op.state = State::done;
  if (!op.finished()) earlier.add(c, op);
}

// Whether MPI or NCCL may still read or write the buffers of the step op stopped in.
bool transfers_in_flight(const Operation& op) {
  for (MPI_Request r : op.requests)
    if (r != MPI_REQUEST_NULL) return true;
#if KDIST_ENABLE_NCCL
  if (op.nccl_done) return true;
#endif
  return false;
}

// A finished operation leaves the queue. A failed one may still have a check waiting for a peer
// that stopped (its receive is cancelled) or payload transfers posted (a peer's matching send can
// still arrive): it stays alive, with the buffers its schedule holds, while MPI may use them.
void retire(const std::shared_ptr<Operation>& op) {
  const bool check_in_flight = op->check.abandon();
  if (check_in_flight || (op->state == State::failed && transfers_in_flight(*op))) impl::graveyard().push_back(op);
}

// The pass's NCCL group; closed before the pass retires anything, and on an exception.
class NcclPass {
 public:
  explicit NcclPass(EngineCore& c) : c_(c) { impl::begin_nccl_pass(c_); }
  ~NcclPass() { impl::end_nccl_pass(c_); }
  NcclPass(const NcclPass&) = delete;
  NcclPass& operator=(const NcclPass&) = delete;

 private:
  EngineCore& c_;
};

void advance_all(EngineCore& c, bool hold_device_p2p) {
  NcclPass pass(c);
  Earlier earlier;
  bool earlier_checking = false;
  for (std::size_t i = 0; i < c.inflight.size(); ++i) {
    Operation& op = *c.inflight[i];
    // Signatures are judged in submission order, so every rank raises a mismatch at the same
    // operation even when a later check completes first. Operations behind it that need no
    // check (point-to-point) still move: a peer may wait for them before it submits the checks.
    if (op.state == State::checking && earlier_checking) {
      earlier.add(c, op);
      continue;
    }
    advance(c, op, earlier, hold_device_p2p);
    earlier_checking = earlier_checking || op.state == State::checking;
  }
}

// hold_device_p2p: enqueue progressing a user send/recv with device buffers. Such operations are
// then left unposted, so that the next pass (a wait, progress(), any other submission) posts every
// one submitted since in one NCCL group. NCCL, unlike MPI, matches a receive with its send only
// inside one group when both are on this rank, and a receive launched alone blocks its stream
// until the peer's send, which may itself sit behind the peer's receive.
void progress_core(EngineCore& c, bool hold_device_p2p = false) {
  c.poll_control();
  advance_all(c, hold_device_p2p);
  while (!c.inflight.empty() && c.inflight.front()->finished()) {
    retire(c.inflight.front());
    c.inflight.pop_front();
  }
}

void wait_op(EngineCore& c, Operation& op) {
  if (op.finished()) {
    ++c.stats.completed_before_wait;
  } else {
    ++c.stats.waited;
    Phase phase("kdist::comm::wait");
    const double start = impl::now();
    bool warned = false;
    while (!op.finished()) {
      progress_core(c);
      if (op.finished()) break;
      impl::inspect_stall(c, op, impl::now() - start, warned);
    }
  }
  if (op.state == State::failed) std::rethrow_exception(op.error);
}

void wait_all_core(EngineCore& c) {
  while (!c.inflight.empty()) {
    auto op = c.inflight.front();
    wait_op(c, *op);
    progress_core(c);
  }
}

// ---- teardown -------------------------------------------------------------------------------

void shutdown(EngineCore& c) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (c.ctrl_request != MPI_REQUEST_NULL) {
    MPI_Cancel(&c.ctrl_request);
    MPI_Wait(&c.ctrl_request, MPI_STATUS_IGNORE);
  }
  // Control sends are small (eager): give them a moment, then leave them to MPI, with the
  // messages they may still read.
  const double until = impl::now() + 1.0;
  while (!c.ctrl_out.empty() && impl::now() < until) c.reap_ctrl_sends();
  for (auto& sent : c.ctrl_out)
    impl::graveyard().push_back(std::shared_ptr<const impl::CtrlMsg>(std::move(sent.first)));
  c.ctrl_out.clear();
  for (auto& op : c.inflight)
    if (op->check.abandon() || transfers_in_flight(*op)) impl::graveyard().push_back(op);
  c.inflight.clear();
}

}  // namespace

// ---- Engine ---------------------------------------------------------------------------------

Engine::Engine(const Communicator& comm, EngineOptions options) : core_(std::make_shared<EngineCore>(comm)) {
  EngineCore& c = *core_;
  c.options = options;
  // The environment supplies defaults; options set in code win.
  if (options.stall_warning_seconds < 0)
    c.options.stall_warning_seconds = impl::env_or("KDIST_STALL_WARNING_SECONDS", 60.0);
  if (options.stall_timeout_seconds < 0)
    c.options.stall_timeout_seconds = impl::env_or("KDIST_STALL_TIMEOUT_SECONDS", 0.0);
  c.rank = rank_ = comm.rank();
  c.size = size_ = comm.size();
  auto dup = [&](MPI_Comm* out, std::shared_ptr<MPI_Comm>* owner) {
    c.ok(MPI_Comm_dup(comm.raw(), out), "MPI_Comm_dup");
    *owner = Communicator::own(*out);
  };
  dup(&c.payload, &c.payload_owner);
  dup(&c.p2p, &c.p2p_owner);
  dup(&c.check, &c.check_owner);
  void* attr = nullptr;
  int flag = 0;
  c.ok(MPI_Comm_get_attr(c.p2p, MPI_TAG_UB, &attr, &flag), "MPI_Comm_get_attr");
  const long long tag_ub = flag ? *static_cast<int*>(attr) : 32767;
  const long long limit = options.tag_limit ? std::min<long long>(options.tag_limit, tag_ub) : tag_ub;
  const bool bad_limit = options.tag_limit != 0 && options.tag_limit < 2 * Schedule::kMaxTag - 1;
  const long long int_max = std::numeric_limits<int>::max();
  const long long elements = options.max_call_elements > 0 ? std::min(options.max_call_elements, int_max) : int_max;
  // Local identity only: groups made by this Engine carry it, and submit() checks it.
  c.id = impl::g_next_engine_id.fetch_add(1);
  // One all-reduce (MAX; minima as MAX of the complements): the wire id (the largest local id),
  // the tag blocks and the elements per MPI call every rank can use, whether any rank asked for
  // too few tags or a negative count, and whether the ranks check consistency alike (one that
  // checks waits for check messages one that does not never sends). On a disagreement every rank
  // throws here; none waits in a collective.
  const bool checks = options.check_consistency;
  long long local[7] = {static_cast<long long>(c.id),
                        ~std::max(2LL, (limit + 1) / Schedule::kMaxTag),
                        bad_limit ? 1LL : 0LL,
                        ~elements,
                        options.max_call_elements < 0 ? 1LL : 0LL,
                        checks ? 1LL : 0LL,
                        checks ? 0LL : 1LL},
            agreed[7];
  c.ok(MPI_Allreduce(local, agreed, 7, MPI_LONG_LONG, MPI_MAX, c.check), "MPI_Allreduce (engine id)");
  if (agreed[5] != 0 && agreed[6] != 0)
    kdist::impl::throw_invalid("kdist::comm::Engine", "the ranks' EngineOptions::check_consistency differ; rank " +
                                                          std::to_string(rank_) + "'s is " +
                                                          (checks ? "true" : "false"));
  if (agreed[2] != 0)
    kdist::impl::throw_invalid("kdist::comm::Engine", "a rank's EngineOptions::tag_limit is below " +
                                                          std::to_string(2 * Schedule::kMaxTag - 1) +
                                                          " (two tag blocks of " + std::to_string(Schedule::kMaxTag) +
                                                          "); this rank's is " + std::to_string(options.tag_limit));
  if (agreed[4] != 0)
    kdist::impl::throw_invalid("kdist::comm::Engine",
                               "a rank's EngineOptions::max_call_elements is negative; "
                               "this rank's is " +
                                   std::to_string(options.max_call_elements));
  c.wire_id = agreed[0];
  c.tag_blocks = static_cast<int>(~agreed[1]);
  c.call_elements = static_cast<std::size_t>(~agreed[3]);
  // Later Engines get larger ids on every rank, so no two Engines that coexist share a wire id.
  for (std::uint64_t seen = impl::g_next_engine_id.load(); seen <= static_cast<std::uint64_t>(c.wire_id);)
    impl::g_next_engine_id.compare_exchange_weak(seen, static_cast<std::uint64_t>(c.wire_id) + 1);
  c.node_of = comm.node_ids();  // which ranks share a node, once per Engine
#if KDIST_ENABLE_NCCL
  c.nccl = nccl::bootstrap(c.payload);  // collective, like the constructor
#endif
  c.post_ctrl_recv();
}

bool Engine::shares_node(int rank) const noexcept {
  return rank >= 0 && rank < size_ && core_->node_of[static_cast<std::size_t>(rank)] == core_->node_of[rank_];
}

Engine::~Engine() {
  if (!core_) return;
  EngineCore& c = *core_;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  try {
    if (std::uncaught_exceptions() > 0) {
      const std::string text = "rank " + std::to_string(c.rank) +
                               " destroyed its Engine while an exception was "
                               "propagating (" +
                               std::to_string(in_flight()) + " operations in flight)";
      c.fail_everywhere(std::make_exception_ptr(RemoteError("kdist::comm: " + text)), text);
    } else if (!c.poisoned && !c.finished) {
      finish();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[kdist] rank %d: Engine destroyed with an error: %s\n", c.rank, e.what());
  }
  shutdown(c);
}

const Communicator& Engine::communicator() const noexcept {
  return core_->comm;
}
std::size_t Engine::in_flight() const noexcept {
  return core_->inflight.size();
}
bool Engine::healthy() const noexcept {
  return !core_->poisoned && !core_->finished;
}
EngineStats Engine::stats() const {
  return core_->stats;
}
void Engine::reset_stats() {
  core_->stats = EngineStats{};
}
const EngineOptions& Engine::options() const noexcept {
  return core_->options;
}

Request Engine::enqueue(OpDescription what, Schedule schedule, CheckPayload payload) {
  EngineCore& c = *core_;
  Entry entry(c, "kdist::comm::Engine");
  if (c.poisoned) std::rethrow_exception(c.poisoned);
  if (c.finished)
    throw Error("kdist::comm::Engine: '" + what.label + "' submitted after finish() (rank " + std::to_string(c.rank) +
                ")");
  for (const auto& s : schedule.steps()) {
    if (s.device() && !KDIST_ENABLE_NCCL && !KDIST_ENABLE_GPU_AWARE_MPI)
      kdist::impl::throw_invalid("kdist::comm::Engine::submit",
                                 "schedule '" + what.label +
                                     "' has device buffers, but this build has neither NCCL nor "
                                     "GPU-aware MPI (stage them through host memory)");
    if (const Communicator* g = s.collective.group.sub())
      if (g->engine_id() != c.id)
        kdist::impl::throw_invalid("kdist::comm::Engine::submit",
                                   "schedule '" + what.label +
                                       "' runs a collective on a group that is not from this "
                                       "Engine (make groups with Engine::node_group / cross_node_group)");
  }
  // A peer outside the Engine would reach MPI only when the step is posted, inside some later
  // call. Rejected here, before anything is posted; the Engine fails everywhere, since the rank
  // this one meant to talk to (or, for a composite, every rank in its check) would wait for ever.
  for (std::size_t k = 0; k < schedule.steps().size(); ++k)
    for (const auto& t : schedule.steps()[k].transfers)
      if (t.peer < 0 || t.peer >= c.size) {
        const bool p2p = what.kind == OpKind::send || what.kind == OpKind::recv;
        const std::string func = std::string("kdist::comm::Engine::") + (p2p ? to_string(what.kind) : "submit");
        kdist::InvalidArgument e(func + ": " + to_string(what.kind) + " '" + what.label + "' (" +
                                 std::to_string(t.buffer.count) + " elements of " + to_string(t.buffer.dtype) +
                                 (p2p ? "" : ", step " + std::to_string(k + 1)) + ", rank " + std::to_string(c.rank) +
                                 "): " + (t.is_send ? "destination " : "source ") + std::to_string(t.peer) +
                                 " is not a rank of " + std::to_string(c.size));
        c.fail_everywhere(std::make_exception_ptr(e), e.what());
        throw e;
      }
  if (payload.bytes && (!c.options.check_consistency || c.size < 2 || (c.size & (c.size - 1)) != 0))
    kdist::impl::throw_invalid("kdist::comm::Engine::submit",
                               "'" + what.label +
                                   "' has a check payload, which needs check_consistency and a "
                                   "power-of-two number of ranks >= 2 (this Engine: " +
                                   std::to_string(c.size) + " ranks, check " +
                                   (c.options.check_consistency ? "on" : "off") + ")");
  auto op = std::make_shared<Operation>();
  op->what = std::move(what);
  op->payload = payload;
  op->schedule = std::move(schedule);
  op->collectives_left = op->schedule.collective_steps();
  ++c.stats.operations;
  const bool user_p2p = op->what.kind == OpKind::send || op->what.kind == OpKind::recv;
  if (!user_p2p) {
    op->seq = c.next_seq++;
    op->tag_base = static_cast<int>(1 + c.next_composite++ % (c.tag_blocks - 1)) * Schedule::kMaxTag;
    for (const auto& step : op->schedule.steps()) op->uses_tags = op->uses_tags || !step.transfers.empty();
    if (c.options.check_consistency || op->what.kind == OpKind::finish || op->what.kind == OpKind::split)
      impl::post_check(c, *op);
  }
  c.inflight.push_back(op);
  progress_core(c, KDIST_ENABLE_NCCL && user_p2p && op->schedule.steps().front().device());
  return Request(core_, std::move(op));
}

Request Engine::submit(Schedule schedule, OpDescription what) {
  return submit(std::move(schedule), std::move(what), CheckPayload{});
}

Request Engine::submit(Schedule schedule, OpDescription what, CheckPayload payload) {
  what.kind = OpKind::composite;
  if (what.label.empty()) what.label = schedule.label();
  return enqueue(std::move(what), std::move(schedule), payload);
}

void Engine::progress() {
  Entry entry(*core_, "kdist::comm::Engine::progress");
  progress_core(*core_);
}

void Engine::wait_all() {
  Entry entry(*core_, "kdist::comm::Engine::wait_all");
  wait_all_core(*core_);
}

void Engine::finish() {
  EngineCore& c = *core_;
  if (c.finished) return;
  {
    Entry entry(c, "kdist::comm::Engine::finish");
    wait_all_core(c);
  }
  Request r = enqueue(OpDescription::finish(), Schedule("finish"));
  r.wait();
  c.finished = true;
}

void Engine::fail(std::exception_ptr error) {
  EngineCore& c = *core_;
  Entry entry(c, "kdist::comm::Engine::fail");
  if (!error)
    kdist::impl::throw_invalid("kdist::comm::Engine::fail",
                               "null exception_ptr (rank " + std::to_string(c.rank) + "); pass the failure to report");
  if (c.poisoned) return;  // failed already: the first reason stands, and the peers have it
  std::string text;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    text = e.what();
  } catch (...) {
    text = "an exception that is not a std::exception";
  }
  c.fail_everywhere(std::move(error), text);
}

void Engine::fail(const std::exception& error) {
  // From error's own catch block the exception being handled is `error` itself: keep it.
  std::exception_ptr handled = std::current_exception();
  bool same = false;
  if (handled) {
    try {
      std::rethrow_exception(handled);
    } catch (const std::exception& e) {
      same = &e == &error;
    } catch (...) {
    }
  }
  fail(same ? std::move(handled) : std::make_exception_ptr(Error(error.what())));
}

Communicator Engine::split_group(bool node, int node_size) {
  EngineCore& c = *core_;
  // Agree (checked) that every rank splits here, with nothing in flight, then split the wire.
  wait_all();
  enqueue(OpDescription::split(node_size, node ? "node_group" : "cross_node_group"), Schedule("split")).wait();
  Communicator wire(std::shared_ptr<MPI_Comm>(core_, &c.payload), "engine", c.id);
  return node ? wire.node(node_size) : wire.cross_node(node_size);
}
Communicator Engine::node_group(int node_size) {
  return split_group(true, node_size);
}
Communicator Engine::cross_node_group(int node_size) {
  return split_group(false, node_size);
}

// ---- Request --------------------------------------------------------------------------------

bool Request::test() {
  if (!op_) return true;
  if (auto c = engine_.lock()) {
    Entry entry(*c, "kdist::comm::Request::test");
    progress_core(*c);
  }
  if (op_->state == State::failed) std::rethrow_exception(op_->error);
  if (op_->state != State::done && engine_.expired())
    throw Error("kdist::comm::Request: '" + op_->what.label + "' never completed: its Engine was destroyed");
  return op_->state == State::done;
}

void Request::wait() {
  if (!op_) return;
  if (auto c = engine_.lock()) {
    Entry entry(*c, "kdist::comm::Request::wait");
    wait_op(*c, *op_);
    return;
  }
  if (op_->state == State::failed) std::rethrow_exception(op_->error);
  if (op_->state != State::done)
    throw Error("kdist::comm::Request: '" + op_->what.label + "' never completed: its Engine was destroyed");
}

}  // namespace comm
}  // namespace kdist
