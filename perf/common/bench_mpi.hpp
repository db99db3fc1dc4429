// Timing helpers shared by the MPI benchmarks: every figure is the maximum over ranks (the
// slowest rank is what a collective costs), and the median over repeats after two warm-ups.
#pragma once

#include <mpi.h>
#include <kdist/core/timer.hpp>

#include "bench_table.hpp"

#include <functional>
#include <utility>
#include <vector>

namespace kdist_bench {

inline double max_over_ranks(double t) {
  double m = 0;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

/// Barrier, run f, max over ranks: `reps` such times after two warm-ups. `after(counted)`, if
/// given, runs untimed after each (a measurement to interleave with f's).
template <class F>
std::vector<double> time_samples(int reps, F&& f, int batch = 1, const std::function<void(bool)>& after = {}) {
  std::vector<double> s;
  for (int r = 0; r < reps + 2; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = kdist::Clock::local_now();
    for (int b = 0; b < batch; ++b) f();
    const double t = max_over_ranks(kdist::Clock::local_now() - t0) / batch;
    if (r >= 2) s.push_back(t);
    if (after) after(r >= 2);
  }
  return s;
}

/// The median of time_samples.
template <class F>
double time_median(int reps, F&& f, int batch = 1) {
  return median(time_samples(reps, std::forward<F>(f), batch));
}

}  // namespace kdist_bench
