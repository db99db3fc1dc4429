#include <kdist/comm/clock_sync.hpp>
#include <kdist/comm/communicator.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/phase.hpp>

#include <string>
#include <vector>

namespace kdist {
namespace comm {

using impl::check_mpi;

ClockOffset synchronize_clock(MPI_Comm user_comm, Clock& clock, int rounds) {
  if (rounds < 1)
    kdist::impl::throw_invalid("kdist::comm::synchronize_clock", "rounds must be >= 1, got " + std::to_string(rounds));
  Phase phase("kdist::comm::synchronize_clock");
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = -1, size = 1;
  check_mpi(MPI_Comm_rank(user_comm, &rank), "MPI_Comm_rank", rank);
  check_mpi(MPI_Comm_dup(user_comm, &comm), "MPI_Comm_dup", rank);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size", rank);
  ClockOffset result;
  try {
    constexpr int tag = 7;
    if (rank == 0) {
      // Answer each rank in turn: one outstanding exchange at a time keeps round trips short.
      for (int peer = 1; peer < size; ++peer) {
        for (int r = 0; r < rounds; ++r) {
          double ping = 0.0;
          check_mpi(MPI_Recv(&ping, 1, MPI_DOUBLE, peer, tag, comm, MPI_STATUS_IGNORE), "MPI_Recv", rank);
          const double t = Clock::local_now();
          check_mpi(MPI_Send(&t, 1, MPI_DOUBLE, peer, tag, comm), "MPI_Send", rank);
        }
      }
    } else {
      std::vector<ClockSample> samples;
      samples.reserve(static_cast<std::size_t>(rounds));
      for (int r = 0; r < rounds; ++r) {
        ClockSample s{};
        s.t_send = Clock::local_now();
        check_mpi(MPI_Send(&s.t_send, 1, MPI_DOUBLE, 0, tag, comm), "MPI_Send", rank);
        check_mpi(MPI_Recv(&s.t_remote, 1, MPI_DOUBLE, 0, tag, comm, MPI_STATUS_IGNORE), "MPI_Recv", rank);
        s.t_recv = Clock::local_now();
        samples.push_back(s);
      }
      result = estimate_clock_offset(samples);
    }
  } catch (...) {
    MPI_Comm_free(&comm);
    throw;
  }
  MPI_Comm_free(&comm);
  clock.set_offset(result.offset);
  return result;
}

}  // namespace comm
}  // namespace kdist
