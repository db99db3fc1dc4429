// The Engine's internal state, shared by the units that keep it. Read comm/engine.hpp for the
// contract and docs/architecture.md §6 for the design; each concern lives in its own unit:
//
//   comm/engine.cpp                 Engine and Request: entry, submission, progress, teardown
//   comm/impl/control_channel.cpp   ABORT / QUERY / REPLY messages between the ranks' Engines
//   comm/impl/consistency.cpp       signature checks, check payloads and the mismatch report
//   comm/impl/mpi_steps.cpp         posting a schedule step on MPI (host or GPU-aware buffers)
//   comm/impl/nccl_steps.cpp        posting a step with device buffers on NCCL (NCCL builds)
//   comm/impl/stall_inspector.cpp   the stall report and the stall timeout
//
// Wire: three duplicates of the user's communicator per Engine, all with MPI_ERRORS_RETURN:
//   payload  - collective steps, posted strictly in submission order;
//   p2p      - point-to-point of schedules; tag = tag_base(op) + step tag, so the k-th composite
//              on every rank uses the same tag block (user send/recv use block 0);
//   check    - signature all-reduces (collective) and control messages (point-to-point, one
//              tag); the two never match each other.
//
// Abandoned work: a request of a nonblocking collective may not be freed or cancelled (MPI 3.1
// §5.12), so operations that can never complete (a peer failed), and whatever else an abandoned
// request may still use (a mismatch report, a control message), are moved to a process-wide list
// that is never freed (graveyard()); MPI may still read or write them.
#pragma once

#include <kdist/comm/engine.hpp>
#include <kdist/comm/impl/signature_check.hpp>

#if KDIST_ENABLE_NCCL
#include <kdist/comm/impl/nccl_bootstrap.hpp>
#endif

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kdist {
namespace comm {
namespace impl {

constexpr int kSig = 8;  // seq, kind, op, dtype, count, root, label hash, layout hash
static_assert(2 * kSig == SignatureCheck::kValues, "the check carries each value and its negation");

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

/// Seconds on the steady clock.
double now();
/// The environment variable `name` as a number, or `fallback` when unset or empty.
double env_or(const char* name, double fallback);

/// One submitted operation: its description, schedule, progress and outcome.
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
  bool uses_tags = false;  ///< some step has point-to-point transfers (on tag_base's block)
#if KDIST_ENABLE_NCCL
  std::shared_ptr<nccl::Event> nccl_done;  ///< recorded after the step's NCCL calls
#endif

  bool finished() const {
    return state == State::done || state == State::failed;
  }
  /// "operation #3 composite 'grads' (step 2 of 4)".
  std::string describe() const;
};

/// What abandoned MPI requests may still use (operations that can never complete, their buffers,
/// messages): never freed.
std::vector<std::shared_ptr<const void>>& graveyard();

/// Control messages: fixed 512-byte records on the check wire, one tag. ABORT carries a failed
/// rank's message; QUERY asks where a rank is (sent by a stalled rank); REPLY answers. Every
/// Engine keeps one receive posted and tests it on every call (comm/impl/control_channel.cpp).
enum class Ctrl : int { abort = 1, query = 2, reply = 3 };
constexpr int kCtrlTag = 32000;
constexpr int kCtrlText = 500;
struct CtrlMsg {
  int kind = 0;
  int from = -1;
  long long seq = -1;
  long long wire = 0;  ///< the sending Engine's wire_id: MPI may reuse a freed communicator's context
  char text[kCtrlText] = {};
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
  /// The most elements one MPI collective call carries (agreed at construction).
  std::size_t call_elements = static_cast<std::size_t>(std::numeric_limits<int>::max());
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
  /// The completion events of the steps posted in this progress pass's NCCL group, with their
  /// streams: recorded once the group ends, when NCCL launches its calls.
  std::vector<std::pair<std::shared_ptr<nccl::Event>, void*>> nccl_unlaunched;
  bool nccl_pass_open = false;
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

  /// "waits for operation #3 ..." or "has no operation in flight (next is #4)".
  std::string where() const;
  /// Fails every unfinished operation whose index is at least `from_seq` (composites and
  /// collectives; with from_seq < 0 user point-to-point too).
  void fail_from(long long from_seq, std::exception_ptr e);
  /// Fails this Engine: every operation in flight and every later call rethrows `e`.
  void poison(std::exception_ptr e);
  /// A local failure that peers must hear about: poison, and send ABORT with `text` to every rank.
  void fail_everywhere(std::exception_ptr e, const std::string& text);

  // Control channel (comm/impl/control_channel.cpp).
  void post_ctrl_recv();
  void send_ctrl(int to, Ctrl kind, const std::string& text);
  void reap_ctrl_sends();
  /// Handles every control message that has arrived.
  void poll_control();
  void handle_ctrl(const CtrlMsg& m);
};

// ---- consistency (comm/impl/consistency.cpp) -------------------------------------------------
/// Starts op's signature check (and its check payload) on the check wire.
void post_check(EngineCore& c, Operation& op);
/// Once op's check completed: when every rank agreed, marks op ready and takes its check payload;
/// otherwise fails op and every later operation and raises the MismatchError, on every rank.
void judge_check(EngineCore& c, Operation& op);

// ---- posting steps (comm/impl/mpi_steps.cpp, comm/impl/nccl_steps.cpp) ------------------------
/// Posts step s of op: its transfers and its collective, on MPI or (device buffers) NCCL.
void post_step(EngineCore& c, Operation& op, const Schedule::Step& s);
#if KDIST_ENABLE_NCCL
void post_step_nccl(EngineCore& c, Operation& op, const Schedule::Step& s);
/// Opens the NCCL group that every step posted in one progress pass joins (with an NCCL
/// communicator; nested groups inside it launch nothing).
void begin_nccl_pass(EngineCore& c);
/// Closes it: NCCL launches the pass's calls, then their events are recorded. An NCCL error fails
/// the Engine everywhere.
void end_nccl_pass(EngineCore& c);
/// Once the Engine has failed (poisoned), outside a pass: ncclCommAbort, so that no NCCL kernel
/// of this rank waits on its stream for a peer that will never launch the other half (the next
/// fence of that stream, or Kokkos::finalize, would hang). A failed Engine posts nothing more.
void abort_nccl_if_failed(EngineCore& c) noexcept;
#else
inline void begin_nccl_pass(EngineCore&) {}
inline void end_nccl_pass(EngineCore&) {}
inline void abort_nccl_if_failed(EngineCore&) noexcept {}
#endif

// ---- stalls (comm/impl/stall_inspector.cpp) ---------------------------------------------------
/// Called while waiting `waited` seconds for op: prints where every rank is once past
/// stall_warning_seconds (`warned` remembers it), and fails the Engine everywhere past
/// stall_timeout_seconds.
void inspect_stall(EngineCore& c, const Operation& op, double waited, bool& warned);

}  // namespace impl
}  // namespace comm
}  // namespace kdist
