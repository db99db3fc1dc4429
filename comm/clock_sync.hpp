// Clock synchronisation: estimates each rank's offset to rank 0 by ping-pong (Cristian's
// algorithm, best of `rounds` exchanges) and installs it in the rank's Clock.
#pragma once

#include <kdist/core/timer.hpp>

#include <mpi.h>

namespace kdist {
namespace comm {

/// Collective over `comm`. Returns this rank's offset (0 +- 0 on rank 0) and sets it on `clock`.
/// Talks on a duplicate of `comm`, never on `comm` itself.
ClockOffset synchronize_clock(MPI_Comm comm, Clock& clock, int rounds = 16);

}  // namespace comm
}  // namespace kdist
