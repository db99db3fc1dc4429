// The consistency check: every collective operation is checked across ranks before its payload
// moves (comm/impl/engine_core.hpp has the wires).
//
// Signature: kSig values, reduced with MAX together with their negations, so one all-reduce
// yields both max and -min; equal max and min mean every rank agrees. The all-reduce is
// impl::SignatureCheck: point-to-point recursive doubling on the check wire, cheaper per
// operation than MPI_Iallreduce (comm/impl/signature_check.cpp has the figures). A composite may
// send its first bytes to rank ^ 1 inside the check (CheckPayload), read only once ranks agree.
//
// Mismatch: every rank finds it at the same check (checks are posted and judged in submission
// order), so the all-gather of per-rank records that builds the message is matched everywhere; it
// runs on the p2p wire, the only one with no other collective traffic. The records also carry how
// many checks each rank has started; each rank runs its started checks to the end and dummy checks
// up to the maximum, so no check message is left unmatched. Operations before the failing one were
// checked and are matched on every rank: they complete. A peer may fail before it judges the check
// (fail(), its Engine destroyed by an exception, a stall): the all-gather and the drain listen to
// the control channel meanwhile and give up on its ABORT, so every rank ends with an error.
#include <kdist/comm/impl/engine_core.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <sstream>

namespace kdist {
namespace comm {
namespace impl {

namespace {

void make_signature(Operation& op) {
  const OpDescription& w = op.what;
  Hasher label;
  label.text(w.label);
  label.text(w.plan);
  const long long sig[kSig] = {op.seq,
                               static_cast<long long>(w.kind),
                               static_cast<long long>(w.op),
                               static_cast<long long>(w.dtype),
                               w.count,
                               w.root,
                               label.value(),
                               static_cast<long long>(w.layout.hash() & ((1ull << 62) - 1))};
  for (int i = 0; i < kSig; ++i) {
    op.sig_send[i] = sig[i];
    op.sig_send[kSig + i] = -sig[i];
  }
}

/// One rank's view of the failing operation, all-gathered to build the message.
struct Record {
  long long sig[kSig];
  long long checks_started;
  char label[64];
  char plan[64];
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
    if (x.plan[0]) os << " plan=" << x.plan;
    if (x.layout[0]) os << " layout=" << x.layout;
  }
  return os.str();
}

// Runs `done` (true once the work is complete) until it is, hearing the control channel and
// applying the stall limits of `op` meanwhile. False when the Engine failed first (a peer's ABORT:
// a peer that failed never does its part; or this rank's stall timeout), the work left unfinished.
template <class Done>
bool finish_or_fail(EngineCore& c, const Operation& op, const Done& done) {
  const double start = now();
  bool warned = false;
  while (!done()) {
    c.poll_control();
    if (!c.poisoned) inspect_stall(c, op, now() - start, warned);
    if (c.poisoned) return false;
  }
  return true;
}

// Runs every check started on this rank to the end, in order, then dummy checks up to the number
// the busiest rank started, so every check message on the check wire is matched on every rank.
// Stops when the Engine fails meanwhile: the operations' checks are given up when they retire, a
// dummy's here (kept while its send may be in flight).
void drain_checks(EngineCore& c, const Operation& failing, long long max_started) {
  const SignatureCheck::Wire wire = c.check_wire();
  for (auto& o : c.inflight)
    if (o->check.pending() && !finish_or_fail(c, failing, [&] { return o->check.advance(wire); })) return;
  const long long zeros[2 * kSig] = {};
  for (long long k = c.checks_started; k < max_started; ++k) {
    auto dummy = std::make_shared<SignatureCheck>();
    dummy->start(wire, zeros);
    if (!finish_or_fail(c, failing, [&] { return dummy->advance(wire); })) {
      if (dummy->abandon()) graveyard().push_back(dummy);
      return;
    }
  }
}

// Every rank's Record of the failing operation, all-gathered; kept by the graveyard when a peer
// fails before it joins.
struct Report {
  Record mine{};
  std::vector<Record> all;
  MPI_Request request = MPI_REQUEST_NULL;
};

[[noreturn]] void raise_mismatch(EngineCore& c, Operation& op) {
  auto report = std::make_shared<Report>();
  Record& mine = report->mine;
  std::memcpy(mine.sig, op.sig_send, sizeof(mine.sig));
  mine.checks_started = c.checks_started;
  std::strncpy(mine.label, op.what.label.c_str(), sizeof(mine.label) - 1);
  std::strncpy(mine.plan, op.what.plan.c_str(), sizeof(mine.plan) - 1);
  std::strncpy(mine.layout, op.what.layout.summary().c_str(), sizeof(mine.layout) - 1);
  report->all.resize(static_cast<std::size_t>(c.size));
  // On the point-to-point wire, which carries no other collective: on the check wire ranks may
  // have posted different numbers of checks before this call. Nonblocking, so that a peer's
  // ABORT is still heard: a peer that fails before it judges this check never joins.
  c.ok(MPI_Iallgather(&mine, sizeof(Record), MPI_BYTE, report->all.data(), sizeof(Record), MPI_BYTE, c.p2p,
                      &report->request),
       "MPI_Iallgather (mismatch report)");
  const bool gathered = finish_or_fail(c, op, [&] {
    int done = 0;
    c.ok(MPI_Test(&report->request, &done, MPI_STATUS_IGNORE), "MPI_Test (mismatch report)");
    return done != 0;
  });
  if (!gathered) {
    graveyard().push_back(report);
    std::rethrow_exception(c.poisoned);  // the peer's failure (or this rank's stall) fails every operation
  }
  long long max_started = 0;
  for (const Record& r : report->all) max_started = std::max(max_started, r.checks_started);
  auto e = std::make_exception_ptr(MismatchError(mismatch_message(c, op, report->all)));
  // This and every later operation fail; earlier ones were checked and still complete. A peer's
  // failure heard during the drain fails them all with its reason instead; this one keeps the
  // mismatch every rank found.
  drain_checks(c, op, max_started);
  if (!c.poisoned) c.poisoned = e;
  c.fail_from(op.seq, e);
  op.error = e;
  op.state = Operation::State::failed;
  std::rethrow_exception(e);
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

}  // namespace

void post_check(EngineCore& c, Operation& op) {
  make_signature(op);
  op.check.start(c.check_wire(), op.sig_send, op.payload.out, op.payload.bytes);
  c.stats.bytes_sent += static_cast<long long>(op.payload.bytes);
  ++c.stats.check_calls;
  ++c.checks_started;
  op.state = Operation::State::checking;
}

void judge_check(EngineCore& c, Operation& op) {
  const long long* agreed = op.check.result();
  bool same = true;
  for (int i = 0; i < kSig; ++i) same = same && agreed[i] == -agreed[kSig + i];
  if (!same) raise_mismatch(c, op);
  op.state = Operation::State::ready;
  if (op.payload.bytes) take_payload(c, op);
}

}  // namespace impl
}  // namespace comm
}  // namespace kdist
