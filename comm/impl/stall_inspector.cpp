// The stall inspector (Horovod's name): a rank that has waited stall_warning_seconds for one
// operation asks every peer where it is (QUERY on the control channel), waits half a second for
// the replies, and prints them with its own position; peers that do not answer are not inside
// this Engine. Past stall_timeout_seconds the wait fails with StallError here and RemoteError on
// every other rank.
#include <kdist/comm/impl/engine_core.hpp>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>

namespace kdist {
namespace comm {
namespace impl {

namespace {

void report_stall(EngineCore& c, const Operation& op, double waited) {
  c.replies.clear();
  for (int r = 0; r < c.size; ++r)
    if (r != c.rank) c.send_ctrl(r, Ctrl::query, "");
  const double until = now() + 0.5;
  while (now() < until && static_cast<int>(c.replies.size()) < c.size - 1) {
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

}  // namespace

void inspect_stall(EngineCore& c, const Operation& op, double waited, bool& warned) {
  if (!warned && c.options.stall_warning_seconds > 0 && waited > c.options.stall_warning_seconds) {
    report_stall(c, op, waited);
    warned = true;
  }
  if (c.options.stall_timeout_seconds > 0 && waited > c.options.stall_timeout_seconds) {
    const std::string text = "rank " + std::to_string(c.rank) + " waited " + std::to_string(int(waited)) + " s for " +
                             op.describe() + " and gave up (stall_timeout_seconds)";
    c.fail_everywhere(std::make_exception_ptr(StallError("kdist::comm: " + text)), text);
  }
}

}  // namespace impl
}  // namespace comm
}  // namespace kdist
