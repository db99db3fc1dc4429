// The Engine's machinery. Read engine.hpp for the contract; this file holds how it is kept.
//
// Wire: three duplicates of the user's communicator per Engine, all with MPI_ERRORS_RETURN:
//   payload  - collective steps, posted strictly in submission order;
//   p2p      - point-to-point of schedules; tag = tag_base(op) + step tag, so the k-th composite
//              on every rank uses the same tag block (user send/recv use block 0);
//   check    - signature all-reduces (collective) and control messages (point-to-point, one
//              tag); the two never match each other.
//
// Signature: kSig values, reduced with MAX together with their negations, so one all-reduce
// yields both max and -min; equal max and min mean every rank agrees. The all-reduce is
// impl::SignatureCheck: point-to-point recursive doubling on the check wire, cheaper per
// operation than MPI_Iallreduce (comm/impl/signature_check.cpp has the figures).
//
// Mismatch: every rank finds it at the same check (checks are posted and judged in submission
// order), so the blocking all-gather of per-rank records that builds the message is matched
// everywhere; it runs on the p2p wire, the only one with no other collective traffic. The records also carry how many
// checks each rank has started; each rank runs its started checks to the end and dummy checks up to the maximum, so no
// check message is left unmatched. Operations before the failing one were checked and are matched on every rank: they
// complete.
//
// Control messages (fixed 512-byte records): ABORT carries a failed rank's message; QUERY asks
// where a rank is (sent by a stalled rank); REPLY answers. Every Engine keeps one receive posted
// and tests it on every call.
//
// Backends: a step whose buffers are host memory (or device memory with GPU-aware MPI) is posted
// on MPI; on NCCL builds a step with device buffers is enqueued on NCCL, on the caller's stream,
// at the same point of the ordered stream, and completes when an event recorded after it does.
// The NCCL communicator is bootstrapped over the payload wire when the Engine is made.
//
// Abandoned work: a request of a nonblocking collective may not be freed or cancelled (MPI 3.1
// §5.12), so operations that can never complete (a peer failed) are moved to a process-wide list
// that is never freed; MPI may still write into their buffers.
#include <kdist/comm/engine.hpp>
#include <kdist/comm/impl/signature_check.hpp>
#include <kdist/core/phase.hpp>

#if KDIST_ENABLE_NCCL
#include <kdist/comm/impl/nccl_bootstrap.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
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

namespace {

// Word-at-a-time multiply-xorshift (every step a bijection of the state, so two inputs that differ
// in one word always hash differently), finished with MurmurHash3's mixer and kept to 62 bits so
// the value and its negation are representable. Byte-at-a-time FNV-1a cost ~0.7 us per call for
// 64 tensors' bounds; this is eight times fewer dependent multiplies.
struct Hasher {
  std::uint64_t h = 1469598103934665603ull;
  void word(std::uint64_t w) {
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 32;
  }
  void bytes(const void* p, std::size_t n) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    word(n);
    for (; n >= 8; n -= 8, c += 8) {
      std::uint64_t w;
      std::memcpy(&w, c, 8);
      word(w);
    }
    std::uint64_t tail = 0;
    std::memcpy(&tail, c, n);
    word(tail);
  }
  void text(const std::string& s) { bytes(s.data(), s.size()); }
  long long value() const {
    std::uint64_t x = h;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return static_cast<long long>(x & ((1ull << 62) - 1));
  }
};

}  // namespace

std::uint64_t Layout::hash() const {
  if (bounds.empty()) return 0;
  Hasher h;
  h.bytes(bounds.data(), bounds.size() * sizeof(std::size_t));  // the length goes in first
  for (const auto& l : labels) h.text(l);
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
  }
  os << "]";
  return os.str();
}

namespace impl {

namespace {
constexpr int kSig = 8;  // seq, kind, op, dtype, count, root, label hash, layout hash
static_assert(2 * kSig == SignatureCheck::kValues, "the check carries each value and its negation");
constexpr int kCtrlTag = 32000;
constexpr int kCtrlText = 500;
enum class Ctrl : int { abort = 1, query = 2, reply = 3 };
struct CtrlMsg {
  int kind = 0;
  int from = -1;
  long long seq = -1;
  long long wire = 0;  ///< the sending Engine's wire_id: MPI may reuse a freed communicator's context
  char text[kCtrlText] = {};
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double env_or(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::float32:
      return MPI_FLOAT;
    case DType::float64:
      return MPI_DOUBLE;
    case DType::int32:
      return MPI_INT;
    case DType::int64:
      return MPI_INT64_T;
    case DType::bytes:
      return MPI_BYTE;
  }
  return MPI_BYTE;
}
MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::min ? MPI_MIN : op == ReduceOp::max ? MPI_MAX : MPI_SUM;
}

int as_count(std::size_t n, const std::string& label) {
  if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    kdist::impl::throw_invalid("kdist::comm::Engine", "'" + label + "' has " + std::to_string(n) +
                                                          " elements; one MPI call moves at most 2^31-1");
  return static_cast<int>(n);
}

std::vector<std::shared_ptr<Operation>>& graveyard() {
  static auto* g = new std::vector<std::shared_ptr<Operation>>;  // never freed: MPI may still write
  return *g;
}
std::atomic<std::uint64_t> g_next_engine_id{1};
}  // namespace

struct Operation {
  enum class State { checking, ready, done, failed };
  OpDescription what;
  long long seq = -1;  ///< collective index (-1: user point-to-point, not checked)
  Schedule schedule;
  std::size_t step = 0;
  bool step_posted = false;
  long long collectives_left = 0;
  std::vector<MPI_Request> requests;
  long long sig_send[2 * kSig] = {};
  SignatureCheck check;
  CheckPayload payload;  ///< exchanged with rank ^ 1 inside the check (Engine::submit)
  State state = State::ready;
  std::exception_ptr error;
  int tag_base = 0;
#if KDIST_ENABLE_NCCL
  std::unique_ptr<nccl::Event> nccl_done;  ///< recorded after the step's NCCL calls
#endif

  bool finished() const {
    return state == State::done || state == State::failed;
  }
  std::string describe() const {
    std::ostringstream os;
    os << "operation #" << seq << " " << to_string(what.kind) << " '" << what.label << "'";
    if (state == State::checking)
      os << " (signature check pending)";
    else
      os << " (step " << step + 1 << " of " << schedule.steps().size() << ")";
    return os.str();
  }
};

struct EngineCore {
  Communicator comm;
  EngineOptions options;
  std::uint64_t id = 0;
  // Agreed by every rank at construction. A control message still in flight when an Engine is
  // destroyed can reach the next Engine whose duplicated communicator got the same context id;
  // messages stamped with another wire_id are dropped.
  long long wire_id = 0;
  int rank = 0, size = 1;
  MPI_Comm payload = MPI_COMM_NULL, p2p = MPI_COMM_NULL, check = MPI_COMM_NULL;
  std::shared_ptr<MPI_Comm> payload_owner, p2p_owner, check_owner;
  int tag_blocks = 1;
  std::vector<int> node_of;  ///< shared-memory node of each rank (its lowest rank)
  long long next_seq = 0, next_composite = 0;
  long long checks_started = 0;  ///< not next_seq: without check_consistency only finish and split check
  std::deque<std::shared_ptr<Operation>> inflight;
  EngineStats stats;
  std::exception_ptr poisoned;
  bool finished = false;
  std::atomic<std::thread::id> owner{std::thread::id()};
  // Control channel.
  CtrlMsg ctrl_in;
  MPI_Request ctrl_request = MPI_REQUEST_NULL;
  std::vector<std::pair<std::unique_ptr<CtrlMsg>, MPI_Request>> ctrl_out;
  std::vector<std::string> replies;
#if KDIST_ENABLE_NCCL
  std::unique_ptr<nccl::Comm> nccl;
#endif

  explicit EngineCore(const Communicator& c) : comm(c) {}

  void ok(int rc, const char* call) const {
    check_mpi(rc, call, rank);
  }
  SignatureCheck::Wire check_wire() const {
    return {check, rank, size, wire_id};
  }
  MPI_Comm group_comm(const Group& g) const {
    return g.sub() ? g.sub()->raw() : payload;
  }

  void post_ctrl_recv() {
    ok(MPI_Irecv(&ctrl_in, sizeof(CtrlMsg), MPI_BYTE, MPI_ANY_SOURCE, kCtrlTag, check, &ctrl_request),
       "MPI_Irecv (control)");
  }
  void send_ctrl(int to, Ctrl kind, const std::string& text) {
    auto m = std::make_unique<CtrlMsg>();
    m->kind = static_cast<int>(kind);
    m->from = rank;
    m->seq = next_seq;
    m->wire = wire_id;
    std::strncpy(m->text, text.c_str(), kCtrlText - 1);
    MPI_Request r = MPI_REQUEST_NULL;
    if (MPI_Isend(m.get(), sizeof(CtrlMsg), MPI_BYTE, to, kCtrlTag, check, &r) == MPI_SUCCESS)
      ctrl_out.emplace_back(std::move(m), r);
  }
  void reap_ctrl_sends() {
    for (auto it = ctrl_out.begin(); it != ctrl_out.end();) {
      int done = 0;
      MPI_Test(&it->second, &done, MPI_STATUS_IGNORE);
      it = done ? ctrl_out.erase(it) : it + 1;
    }
  }

  std::string where() const {
    for (const auto& op : inflight)
      if (!op->finished()) return "waits for " + op->describe();
    return "has no operation in flight (next is #" + std::to_string(next_seq) + ")";
  }

  /// Fails every unfinished operation whose index is at least `from_seq` (composites and
  /// collectives; with from_seq < 0 user point-to-point too).
  void fail_from(long long from_seq, std::exception_ptr e) {
    for (auto& op : inflight)
      if (!op->finished() && (op->seq >= from_seq || from_seq < 0)) {
        op->error = e;
        op->state = Operation::State::failed;
      }
  }
  void poison(std::exception_ptr e) {
    if (!poisoned) poisoned = e;
    fail_from(-1, e);
  }
  /// Local failure that peers must hear about.
  void fail_everywhere(std::exception_ptr e, const std::string& text) {
    if (poisoned) return;
    poison(e);
    for (int r = 0; r < size; ++r)
      if (r != rank) send_ctrl(r, Ctrl::abort, text);
  }

  void poll_control() {
    if (ctrl_request == MPI_REQUEST_NULL) return;
    for (;;) {
      int done = 0;
      MPI_Test(&ctrl_request, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      const CtrlMsg m = ctrl_in;
      post_ctrl_recv();
      handle_ctrl(m);
    }
    reap_ctrl_sends();
  }
  void handle_ctrl(const CtrlMsg& m) {
    if (m.wire != wire_id) return;  // left over from an earlier Engine on a reused context
    const std::string text(m.text, strnlen(m.text, kCtrlText));
    switch (static_cast<Ctrl>(m.kind)) {
      case Ctrl::abort:
        poison(std::make_exception_ptr(RemoteError("kdist::comm: rank " + std::to_string(m.from) +
                                                   " failed, so this operation cannot complete on rank " +
                                                   std::to_string(rank) + ": " + text)));
        break;
      case Ctrl::query:
        send_ctrl(m.from, Ctrl::reply, "rank " + std::to_string(rank) + " " + where());
        break;
      case Ctrl::reply:
        replies.push_back(text);
        break;
    }
  }
};

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

void make_signature(Operation& op) {
  const OpDescription& w = op.what;
  Hasher label;
  label.text(w.label);
  const long long sig[impl::kSig] = {op.seq,
                                     static_cast<long long>(w.kind),
                                     static_cast<long long>(w.op),
                                     static_cast<long long>(w.dtype),
                                     w.count,
                                     w.root,
                                     label.value(),
                                     static_cast<long long>(w.layout.hash() & ((1ull << 62) - 1))};
  for (int i = 0; i < impl::kSig; ++i) {
    op.sig_send[i] = sig[i];
    op.sig_send[impl::kSig + i] = -sig[i];
  }
}

void post_check(EngineCore& c, Operation& op) {
  make_signature(op);
  op.check.start(c.check_wire(), op.sig_send, op.payload.out, op.payload.bytes);
  c.stats.bytes_sent += static_cast<long long>(op.payload.bytes);
  ++c.stats.check_calls;
  ++c.checks_started;
  op.state = State::checking;
}

// ---- mismatch -------------------------------------------------------------------------------

struct Record {
  long long sig[impl::kSig];
  long long checks_started;
  char label[64];
  char layout[112];
};

std::string mismatch_message(const EngineCore& c, const Operation& op, const std::vector<Record>& all) {
  std::ostringstream os;
  os << "kdist::comm: ranks disagree on collective operation #" << op.seq << " ('" << op.what.label << "' on rank "
     << c.rank
     << (op.payload.bytes ? "); nothing of it was used (its check payload crossed, unread). Per rank:"
                          : "); nothing of it was sent. Per rank:");
  for (int r = 0; r < c.size; ++r) {
    const Record& x = all[static_cast<std::size_t>(r)];
    const auto kind = static_cast<OpKind>(x.sig[1]);
    os << "\n  rank " << r << ": " << to_string(kind) << " '" << x.label << "'";
    if (kind == OpKind::finish) {
      os << " (this rank finished: it submits nothing more)";
      continue;
    }
    os << " op=" << to_string(static_cast<ReduceOp>(x.sig[2])) << " dtype=" << to_string(static_cast<DType>(x.sig[3]))
       << " count=" << x.sig[4] << " root=" << x.sig[5];
    if (x.layout[0]) os << " layout=" << x.layout;
  }
  return os.str();
}

// Runs every check started on this rank to the end, in order, then dummy checks up to the number
// the busiest rank started, so every check message on the check wire is matched on every rank.
void drain_checks(EngineCore& c, long long max_started) {
  const impl::SignatureCheck::Wire wire = c.check_wire();
  for (auto& o : c.inflight)
    if (o->check.pending()) o->check.run_to_end(wire);
  const long long zeros[2 * impl::kSig] = {};
  for (long long k = c.checks_started; k < max_started; ++k) {
    impl::SignatureCheck dummy;
    dummy.start(wire, zeros);
    dummy.run_to_end(wire);
  }
}

[[noreturn]] void raise_mismatch(EngineCore& c, Operation& op) {
  Record mine{};
  std::memcpy(mine.sig, op.sig_send, sizeof(mine.sig));
  mine.checks_started = c.checks_started;
  std::strncpy(mine.label, op.what.label.c_str(), sizeof(mine.label) - 1);
  std::strncpy(mine.layout, op.what.layout.summary().c_str(), sizeof(mine.layout) - 1);
  std::vector<Record> all(static_cast<std::size_t>(c.size));
  // On the point-to-point wire, which carries no other collective: on the check wire ranks may
  // have posted different numbers of checks before this call.
  c.ok(MPI_Allgather(&mine, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE, c.p2p),
       "MPI_Allgather (mismatch report)");
  long long max_started = 0;
  for (const Record& r : all) max_started = std::max(max_started, r.checks_started);
  auto e = std::make_exception_ptr(MismatchError(mismatch_message(c, op, all)));
  if (!c.poisoned) c.poisoned = e;
  // This and every later operation fail; earlier ones were checked and still complete.
  c.fail_from(op.seq, e);
  drain_checks(c, max_started);
  std::rethrow_exception(e);
}

// ---- posting and advancing ------------------------------------------------------------------

void post_collective(EngineCore& c, const Schedule::Collective& k, const std::string& label, MPI_Request* r) {
  using K = Schedule::CollectiveKind;
  MPI_Comm g = c.group_comm(k.group);
  const MPI_Datatype t = impl::mpi_type(k.out.dtype);
  const int n = impl::as_count(k.kind == K::allgather ? k.in.count : k.out.count, label);
  switch (k.kind) {
    case K::allreduce:
      c.ok(MPI_Iallreduce(MPI_IN_PLACE, k.out.data, n, t, impl::mpi_op(k.op), g, r), "MPI_Iallreduce");
      break;
    case K::reduce_scatter:
      c.ok(MPI_Ireduce_scatter_block(k.in.data, k.out.data, n, t, impl::mpi_op(k.op), g, r),
           "MPI_Ireduce_scatter_block");
      break;
    case K::allgather:
      c.ok(MPI_Iallgather(k.in.data, n, t, k.out.data, n, t, g, r), "MPI_Iallgather");
      break;
    case K::broadcast:
      c.ok(MPI_Ibcast(k.out.data, n, t, k.root, g, r), "MPI_Ibcast");
      break;
    case K::none:
      break;
  }
}

#if KDIST_ENABLE_NCCL
nccl::Reduce nccl_op(ReduceOp op) {
  return op == ReduceOp::min ? nccl::Reduce::min : op == ReduceOp::max ? nccl::Reduce::max : nccl::Reduce::sum;
}
// Device buffers: the step's transfers and collective as one NCCL group on the caller's stream.
void post_step_nccl(EngineCore& c, Operation& op, const Schedule::Step& s) {
  using K = Schedule::CollectiveKind;
  if (s.collective.kind != K::none && s.collective.group.sub())
    kdist::impl::throw_invalid("kdist::comm::Engine",
                               "'" + op.what.label +
                                   "': a collective on a sub-group with device buffers needs "
                                   "host staging or GPU-aware MPI (NCCL runs on the whole Engine)");
  auto stream = static_cast<cudaStream_t>(s.stream);
  nccl::Comm& n = *c.nccl;
  n.group_start();
  for (const auto& t : s.transfers) {
    if (t.is_send)
      n.send(t.buffer.data, t.buffer.count, t.buffer.dtype, t.peer, stream);
    else
      n.recv(t.buffer.data, t.buffer.count, t.buffer.dtype, t.peer, stream);
    ++c.stats.payload_calls;
  }
  const auto& k = s.collective;
  switch (k.kind) {
    case K::allreduce:
      n.allreduce(k.out.data, k.out.data, k.out.count, k.out.dtype, nccl_op(k.op), stream);
      break;
    case K::reduce_scatter:
      n.reduce_scatter(k.in.data, k.out.data, k.out.count, k.out.dtype, nccl_op(k.op), stream);
      break;
    case K::allgather:
      n.allgather(k.in.data, k.out.data, k.in.count, k.in.dtype, stream);
      break;
    case K::broadcast:
      n.broadcast(k.out.data, k.out.count, k.out.dtype, k.root, stream);
      break;
    case K::none:
      break;
  }
  n.group_end();
  if (k.kind != K::none) {
    ++c.stats.payload_calls;
    ++c.stats.collective_calls;
    --op.collectives_left;
  }
  op.nccl_done.reset(new nccl::Event);
  op.nccl_done->record(stream);
  op.step_posted = true;
}
#endif

void post_step(EngineCore& c, Operation& op, const Schedule::Step& s) {
  op.requests.clear();
#if KDIST_ENABLE_NCCL
  if (s.device()) return post_step_nccl(c, op, s);
#endif
  for (const auto& t : s.transfers) {
    MPI_Request r;
    const int n = impl::as_count(t.buffer.count, op.what.label);
    const int tag = op.tag_base + t.tag;
    if (t.is_send) {
      c.ok(MPI_Isend(t.buffer.data, n, impl::mpi_type(t.buffer.dtype), t.peer, tag, c.p2p, &r), "MPI_Isend");
      if (op.seq >= 0) c.stats.bytes_sent += static_cast<long long>(size_of(t.buffer.dtype)) * n;
    } else {
      c.ok(MPI_Irecv(t.buffer.data, n, impl::mpi_type(t.buffer.dtype), t.peer, tag, c.p2p, &r), "MPI_Irecv");
    }
    op.requests.push_back(r);
    ++c.stats.payload_calls;
  }
  if (s.collective.kind != Schedule::CollectiveKind::none) {
    MPI_Request r;
    post_collective(c, s.collective, op.what.label, &r);
    op.requests.push_back(r);
    ++c.stats.payload_calls;
    ++c.stats.collective_calls;
    --op.collectives_left;
  }
  op.step_posted = true;
}

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

// The partner agreed on the signature, which fixes the payload's size; anything else is a fault.
void take_payload(EngineCore& c, Operation& op) {
  if (op.check.payload_bytes() == op.payload.bytes) {
    std::memcpy(op.payload.in, op.check.payload(), op.payload.bytes);
    return;
  }
  const std::string text = "'" + op.what.label + "' received " + std::to_string(op.check.payload_bytes()) +
                           " check-payload bytes from rank " + std::to_string(c.rank ^ 1) + ", expected " +
                           std::to_string(op.payload.bytes) + " (rank " + std::to_string(c.rank) + ")";
  c.fail_everywhere(std::make_exception_ptr(BackendError("kdist::comm: " + text)), text);
}

void advance(EngineCore& c, Operation& op, bool& earlier_collectives_pending) {
  if (op.finished()) return;
  if (op.state == State::checking) {
    if (!op.check.advance(c.check_wire())) {
      earlier_collectives_pending = earlier_collectives_pending || op.collectives_left > 0;
      return;
    }
    const long long* agreed = op.check.result();
    bool same = true;
    for (int i = 0; i < impl::kSig; ++i) same = same && agreed[i] == -agreed[impl::kSig + i];
    if (!same) raise_mismatch(c, op);
    op.state = State::ready;
    if (op.payload.bytes) take_payload(c, op);
  }
  auto& steps = op.schedule.steps();
  while (op.step < steps.size() && !op.finished()) {
    Schedule::Step& s = steps[op.step];
    if (!op.step_posted) {
      if (s.collective.kind != Schedule::CollectiveKind::none && earlier_collectives_pending) break;
      post_step(c, op, s);
      run_overlap_work(c, op, s);
    }
    int done = 1;
    if (!op.requests.empty())
      c.ok(MPI_Testall(static_cast<int>(op.requests.size()), op.requests.data(), &done, MPI_STATUSES_IGNORE),
           "MPI_Testall");
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
  if (!op.finished()) earlier_collectives_pending = earlier_collectives_pending || op.collectives_left > 0;
}

// A failed operation's check may still wait for a peer that stopped: cancel its receive, and keep
// the operation alive while its send is in flight.
void abandon_check(const std::shared_ptr<Operation>& op) {
  if (op->check.abandon()) impl::graveyard().push_back(op);
}

void progress_core(EngineCore& c) {
  c.poll_control();
  bool earlier_collectives_pending = false, earlier_checking = false;
  for (std::size_t i = 0; i < c.inflight.size(); ++i) {
    Operation& op = *c.inflight[i];
    // Signatures are judged in submission order, so every rank raises a mismatch at the same
    // operation even when a later check completes first.
    if (op.state == State::checking && earlier_checking) break;
    advance(c, op, earlier_collectives_pending);
    earlier_checking = earlier_checking || op.state == State::checking;
  }
  while (!c.inflight.empty() && c.inflight.front()->finished()) {
    abandon_check(c.inflight.front());
    c.inflight.pop_front();
  }
}

// ---- stalls ---------------------------------------------------------------------------------

void report_stall(EngineCore& c, const Operation& op, double waited) {
  c.replies.clear();
  for (int r = 0; r < c.size; ++r)
    if (r != c.rank) c.send_ctrl(r, impl::Ctrl::query, "");
  const double until = impl::now() + 0.5;
  while (impl::now() < until && static_cast<int>(c.replies.size()) < c.size - 1) {
    c.poll_control();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::ostringstream os;
  os << "[kdist] rank " << c.rank << " has waited " << static_cast<int>(waited) << " s for " << op.describe()
     << ". Every rank must submit the same collectives in the same order. Where the ranks are:\n  rank " << c.rank
     << " " << c.where();
  for (const auto& r : c.replies) os << "\n  " << r;
  if (static_cast<int>(c.replies.size()) < c.size - 1)
    os << "\n  " << c.size - 1 - static_cast<int>(c.replies.size())
       << " other rank(s) did not answer: not inside this Engine (busy elsewhere, finished, or stuck)";
  std::fprintf(stderr, "%s\n", os.str().c_str());
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
      const double waited = impl::now() - start;
      if (!warned && c.options.stall_warning_seconds > 0 && waited > c.options.stall_warning_seconds) {
        report_stall(c, op, waited);
        warned = true;
      }
      if (c.options.stall_timeout_seconds > 0 && waited > c.options.stall_timeout_seconds) {
        const std::string text = "rank " + std::to_string(c.rank) + " waited " + std::to_string(int(waited)) +
                                 " s for " + op.describe() + " and gave up (stall_timeout_seconds)";
        c.fail_everywhere(std::make_exception_ptr(StallError("kdist::comm: " + text)), text);
      }
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
  // Control sends are small (eager): give them a moment, then leave them to MPI.
  const double until = impl::now() + 1.0;
  while (!c.ctrl_out.empty() && impl::now() < until) c.reap_ctrl_sends();
  for (auto& op : c.inflight)
    if (op->check.abandon() || !op->requests.empty()) impl::graveyard().push_back(op);
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
  // Local identity only: groups made by this Engine carry it, and submit() checks it.
  c.id = impl::g_next_engine_id.fetch_add(1);
  long long local = static_cast<long long>(c.id);
  c.ok(MPI_Allreduce(&local, &c.wire_id, 1, MPI_LONG_LONG, MPI_MAX, c.check), "MPI_Allreduce (engine id)");
  // Later Engines get larger ids on every rank, so no two Engines that coexist share a wire id.
  for (std::uint64_t seen = impl::g_next_engine_id.load(); seen <= static_cast<std::uint64_t>(c.wire_id);)
    impl::g_next_engine_id.compare_exchange_weak(seen, static_cast<std::uint64_t>(c.wire_id) + 1);
  void* attr = nullptr;
  int flag = 0;
  c.ok(MPI_Comm_get_attr(c.p2p, MPI_TAG_UB, &attr, &flag), "MPI_Comm_get_attr");
  const long long tag_ub = flag ? *static_cast<int*>(attr) : 32767;
  c.tag_blocks = static_cast<int>(std::max(2LL, (tag_ub + 1) / Schedule::kMaxTag));
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
    if (c.options.check_consistency || op->what.kind == OpKind::finish || op->what.kind == OpKind::split)
      post_check(c, *op);
  }
  c.inflight.push_back(op);
  progress_core(c);
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
  Request r = enqueue({OpKind::finish, DType::bytes, 0, -1, ReduceOp::sum, "finish", {}}, Schedule("finish"));
  r.wait();
  c.finished = true;
}

void Engine::fail(const std::exception& error) {
  EngineCore& c = *core_;
  Entry entry(c, "kdist::comm::Engine::fail");
  c.fail_everywhere(std::make_exception_ptr(Error(error.what())), error.what());
}

Communicator Engine::split_group(bool node, int node_size) {
  EngineCore& c = *core_;
  // Agree (checked) that every rank splits here, with nothing in flight, then split the wire.
  wait_all();
  enqueue({OpKind::split, DType::int32, node_size, -1, ReduceOp::sum, node ? "node_group" : "cross_node_group", {}},
          Schedule("split"))
      .wait();
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
