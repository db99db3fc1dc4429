// The whole main() of the main job and of the workers study: MPI and Kokkos, the options
// (options.hpp), --resume's checkpoint (read once) and the per-rank batch (checkpoint.hpp), the
// data, then Job(settings, data).describe() and run(checkpoint). Every rank that ends with an error prints it, naming
// itself, and returns 1; a failure before the Engines exist (a bad option value, a missing data
// set or checkpoint on one rank) still reaches every rank, with the first failing rank's reason.
#pragma once

#include <mpi.h>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "../common/agree_on_start.hpp"
#include "trainer.hpp"

namespace fmnist {

/// A whole main(): Job is Trainer or derived from it; `title` heads --help. Returns the exit code.
template <class Job>
int run_program(int argc, char** argv, Program program, const char* title) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    CLI::App app{title};
    Settings s;
    // An option given twice takes the last value, so a wrapper's defaults (scripts/demo.sh) can be
    // overridden by arguments appended after them.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    add_options(app, s, program);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    bool train = true;
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {  // --help, an unknown option or a bad value
      train = false;
      rc = rank == 0 ? app.exit(e) : (e.get_exit_code() != 0 ? 2 : 0);
      const std::string hint = moved_option_hint(program, argc, argv);
      if (rank == 0 && !hint.empty()) std::fprintf(stderr, "%s\n", hint.c_str());
    }
    if (train) {
      resolve_defaults(s);
      s.batch_given = app.count("--batch") > 0;
      try {
        nn::FashionMnist data;
        std::unique_ptr<const kdist::StateReader> saved;
        examples::agree_on_start([&] {
          saved = open_checkpoint(s);
          resolve_batch(s, size, saved.get());
          data = nn::load_fashion_mnist(s.data);
        });
        Job job(s, data);
        if (rank == 0 && !s.quiet) std::printf("%s\n", job.describe().c_str());
        job.run(std::move(saved));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s (rank %d): %s\n", program_name(program), rank, e.what());
        rc = 1;
      }
    }
  }
  MPI_Finalize();
  return rc;
}

}  // namespace fmnist
