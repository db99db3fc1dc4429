// Clock synchronisation: estimates each rank's offset to rank 0 by ping-pong (Cristian's
// algorithm, best of `rounds` exchanges) and installs it in the rank's Clock. The exchanges are
// the Engine's point-to-point operations, so they share its wire, its error reporting (a rank that
// fails is named on the others) and its stall inspector.
#pragma once

#include <kdist/comm/engine.hpp>
#include <kdist/core/timer.hpp>

#include <functional>

namespace kdist {
namespace comm {

/// Collective over the Engine's ranks. Returns this rank's offset (0 +- 0 on rank 0) and sets it
/// on `clock`. Nothing else may be in flight on the Engine's thread while it runs (it waits on
/// each exchange). `local_now` reads this rank's clock (Clock::local_now, the clock `clock`
/// offsets; the tests shift it per rank, ranks of one machine sharing one clock).
ClockOffset synchronize_clock(Engine& engine, Clock& clock, int rounds = 16,
                              const std::function<double()>& local_now = &Clock::local_now);

}  // namespace comm
}  // namespace kdist
