// Writes the cost-model calibration file the planners and placement read:
//   mpiexec -n P kdist_calibrate --out costs.json [--max-bytes N] [--reps R] [--in-flight K]
//                                [--inverse-max-d D] [--adasum-max-bytes N]
// The Adasum entries (both algorithms, for Algorithm::automatic's crossover: small_bytes_from)
// are measured at P >= 2 up to --adasum-max-bytes (0: skipped).
// Rank 0 reads an existing file (merged into) and writes the result. Whether it can is checked
// before measuring, and any failure of rank 0's is shared through the engine, so every rank
// exits non-zero with the same message instead of measuring in vain or waiting forever.
#include <CLI/CLI.hpp>
#include <kdist/adasum/allreduce.hpp>
#include <kdist/adasum/calibrate.hpp>
#include <kdist/comm/calibrate.hpp>
#include <kdist/comm/outcome.hpp>
#include <kdist/core/atomic_file.hpp>
#include <kdist/core/inverse_calibration.hpp>

#include <cstdio>
#include <string>

#include "common/mpi_main.hpp"

namespace {

/// Runs `step` on rank 0; if it throws, every rank throws (rank 0 its own error, the others a
/// RemoteError with its message: comm::agree_on_outcome_of), and mpi_main reports it with the rank.
template <class Step>
void on_root_or_fail_everywhere(kdist::comm::Engine& engine, Step&& step) {
  kdist::comm::agree_on_outcome_of(engine, "kdist_calibrate", [&] {
    if (engine.rank() == 0) step();
  });
}

void print_collective(const kdist::comm::Communicator& world, kdist::CostOp op, kdist::DType dt,
                      const kdist::CostModel& m) {
  if (world.rank() == 0)
    std::printf("%-10s %-8s ranks %d: alpha %.3g s, beta %.3g s/B (%.3g GB/s)\n", kdist::to_string(op),
                kdist::to_string(dt), world.size(), m.fit().alpha, m.fit().beta, 1e-9 / m.fit().beta);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdist cost-model calibration"};
  std::string out = "kdist_costs.json";
  kdist::comm::CalibrationOptions opt;
  int inverse_max_d = 8192;
  double budget = 60.0;
  std::size_t adasum_max_bytes = 1u << 20;
  app.add_option("--out", out, "calibration file to write (merged with an existing one)");
  app.add_option("--max-bytes", opt.max_bytes, "largest message (bytes)");
  app.add_option("--reps", opt.repeats, "timed repeats per size (median of max over ranks)");
  app.add_option("--in-flight", opt.in_flight,
                 "operations posted together per timed run, their mean recorded (oversubscribed ranks: 8)")
      ->check(CLI::PositiveNumber);
  app.add_option("--inverse-max-d", inverse_max_d, "largest SPD inverse dimension (0: skip)");
  app.add_option("--inverse-budget", budget, "seconds the inverse calibration may take");
  app.add_option("--adasum-max-bytes", adasum_max_bytes, "largest Adasum message (0: skip the Adasum entries)");
  return kdist_perf::mpi_main(argc, argv, app, "kdist_calibrate", [&](int) {
    kdist::comm::Communicator world(MPI_COMM_WORLD);
    kdist::comm::Engine engine(world);
    kdist::CostModelStore store;
    on_root_or_fail_everywhere(engine, [&] {
      kdist::check_file_writable(out, "checking --out before measuring");
      if (std::FILE* f = std::fopen(out.c_str(), "r")) {
        std::fclose(f);
        store = kdist::CostModelStore::load(out);
      }
    });
    for (auto op : {kdist::CostOp::allreduce, kdist::CostOp::broadcast})
      for (auto dt : {kdist::DType::float32, kdist::DType::float64}) {
        const auto m = kdist::comm::calibrate_collective(engine, op, dt, opt);
        store.set({op, dt, world.size(), world.kind()}, m);
        print_collective(world, op, dt, m);
      }
    if (adasum_max_bytes > 0 && world.size() > 1)
      for (auto dt : {kdist::DType::float32, kdist::DType::float64}) {
        kdist::comm::CalibrationOptions a = opt;
        a.max_bytes = adasum_max_bytes;
        const auto models = kdist::adasum::calibrate(engine, dt, a);
        store.set({kdist::CostOp::adasum, dt, world.size(), "world"}, models.first);
        store.set({kdist::CostOp::adasum, dt, world.size(), "world/doubling"}, models.second);
        if (world.rank() == 0)
          std::printf("adasum     %-8s ranks %d: recursive doubling below %zu bytes, VHDD from there\n",
                      kdist::to_string(dt), world.size(), kdist::adasum::small_bytes_from(store, dt, world.size()));
      }
    if (inverse_max_d > 0) {
      const auto m = kdist::calibrate_inverse(inverse_max_d, budget);
      store.set({kdist::CostOp::spd_inverse, kdist::DType::float64, 1, "local"}, m);
      if (world.rank() == 0)
        std::printf("spd_inverse float64: t = %.3g + %.3g d^3 s (%.1f GFLOP/s), up to d = %.0f\n", m.fit().alpha,
                    m.fit().beta, 1e-9 / m.fit().beta, std::cbrt(m.x().back()));
    }
    on_root_or_fail_everywhere(engine, [&] {
      store.save(out);
      std::printf("wrote %s (%zu models)\n", out.c_str(), store.size());
    });
  });
}
