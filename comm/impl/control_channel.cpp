// The control channel between the ranks' Engines (comm/impl/engine_core.hpp): ABORT carries a
// failed rank's message so every peer raises RemoteError with the reason; QUERY / REPLY let a
// stalled rank ask where the others are. Messages are fixed-size records on the check wire with
// one tag; a message stamped with another Engine's wire_id (a reused communicator context) is
// dropped. Sends are nonblocking and reaped on every call; a failed send is not an error (the
// peer may be gone).
#include <kdist/comm/impl/engine_core.hpp>

#include <cstring>

namespace kdist {
namespace comm {
namespace impl {

std::string EngineCore::where() const {
  for (const auto& op : inflight)
    if (!op->finished()) return "waits for " + op->describe();
  return "has no operation in flight (next is #" + std::to_string(next_seq) + ")";
}

void EngineCore::fail_from(long long from_seq, std::exception_ptr e) {
  for (auto& op : inflight)
    if (!op->finished() && (op->seq >= from_seq || from_seq < 0)) {
      op->error = e;
      op->state = Operation::State::failed;
    }
}

void EngineCore::poison(std::exception_ptr e) {
  if (!poisoned) poisoned = e;
  fail_from(-1, e);
  abort_nccl_if_failed(*this);
}

void EngineCore::fail_everywhere(std::exception_ptr e, const std::string& text) {
  if (poisoned) return;
  poison(e);
  for (int r = 0; r < size; ++r)
    if (r != rank) send_ctrl(r, Ctrl::abort, text);
}

void EngineCore::post_ctrl_recv() {
  ok(MPI_Irecv(&ctrl_in, sizeof(CtrlMsg), MPI_BYTE, MPI_ANY_SOURCE, kCtrlTag, check, &ctrl_request),
     "MPI_Irecv (control)");
}

void EngineCore::send_ctrl(int to, Ctrl kind, const std::string& text) {
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

void EngineCore::reap_ctrl_sends() {
  for (auto it = ctrl_out.begin(); it != ctrl_out.end();) {
    int done = 0;
    MPI_Test(&it->second, &done, MPI_STATUS_IGNORE);
    it = done ? ctrl_out.erase(it) : it + 1;
  }
}

void EngineCore::poll_control() {
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

void EngineCore::handle_ctrl(const CtrlMsg& m) {
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

}  // namespace impl
}  // namespace comm
}  // namespace kdist
