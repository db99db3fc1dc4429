// The main() of kdist's MPI programs (the MPI benchmarks, kdist_calibrate, kdist_portability):
// MPI_Init_thread (MPI_THREAD_FUNNELED), a Kokkos::ScopeGuard (which takes its --kokkos-*
// arguments out of argv), CLI11 parsing of the rest, the program's body, MPI_Finalize. A rank's
// exit status:
//   --help           the help on rank 0 only; 0 on every rank
//   a parse error    CLI11's message on rank 0 only; CLI11's code for it (non-zero) on every rank
//   an exception     "[rank r] PROGRAM: what" on stderr of the rank that threw it; 1
//   otherwise        0
// The caller builds the CLI::App (its options bound to its own variables) before calling; nothing
// in it may need MPI or Kokkos until it parses.
#pragma once

#include <mpi.h>
#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>

#include <cstdio>
#include <exception>

namespace kdist_perf {

/// Runs `body(rank)` (rank in MPI_COMM_WORLD) once `app` has parsed argv; returns main's status.
template <class Body>
int mpi_main(int argc, char** argv, CLI::App& app, const char* program, Body&& body) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      app.parse(argc, argv);
      body(rank);
    } catch (const CLI::ParseError& e) {
      rc = rank == 0 ? app.exit(e) : e.get_exit_code();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] %s: %s\n", rank, program, e.what());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}

}  // namespace kdist_perf
