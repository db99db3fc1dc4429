// STREAM-like memory bandwidth on an execution space, the limit the memory-bound kernels are held
// against (bench_adasum's traffic bound; the portability suite's roofline). Three kernels on
// arrays of n elements of float, bytes counted as STREAM counts them:
//   copy   c[i] = a[i]               2 n elements moved (read a, write c), one element a thread
//   copy_wide  the same copy as kdist's device copies run it: copies_per_thread elements a
//          thread, loads before stores (kdist/core/impl/entries.hpp, for_copies)
//   read   s += a[i]                 n                  (a reduction: nothing written; 16 elements a tree
//                                                         per step, so the dependent adds do not bound it)
//   triad  a[i] = b[i] + q c[i]      3 n
//   deep_copy  Kokkos::deep_copy(c, a)  2 n  (the space's own copy, cudaMemcpy on a GPU: an H200 ran
//                                          it at 2.2x the copy kernel's rate on arrays past its L2)
// Every rank of `comm` runs the kernels at the same time (a barrier before each repeat), so on one
// node the figure is per rank with all of them sharing the memory bus, as MPI ranks do when they
// run a collective; with `alone` only rank 0 runs them while the others wait, the one-core figure.
// The result is rank 0's (bytes per second, the median of `reps` after one warm-up) on every rank.
// The working set is what the caller names: pass the size of the buffer a kernel under test
// touches, so that the bound uses the rate of the cache level that buffer lives in. Arrays under
// 1 MiB are swept repeatedly within one timing (at least 1 MiB per kernel), so that the timer and
// the launch do not stand in for the bandwidth.
#pragma once

#include <mpi.h>
#include <Kokkos_Core.hpp>
#include <kdist/core/impl/entries.hpp>
#include <kdist/core/timer.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "bench_table.hpp"

namespace kdist_bench {

struct Bandwidth {
  double copy = 0, read = 0, triad = 0, deep_copy = 0, copy_wide = 0;  ///< bytes per second
  /// The best plain copy measured: either kernel or the space's deep_copy.
  double best_copy() const { return std::max({copy, copy_wide, deep_copy}); }
};

namespace impl {
template <class Exec, class Kernel>
double stream_rate(const Exec& exec, double bytes, int sweeps, int reps, MPI_Comm comm, bool run, Kernel&& kernel) {
  std::vector<double> rates;
  for (int r = 0; r < reps + 1; ++r) {
    MPI_Barrier(comm);
    if (!run) continue;
    const double t0 = kdist::Clock::local_now();
    for (int k = 0; k < sweeps; ++k) kernel();
    exec.fence();
    const double t = kdist::Clock::local_now() - t0;
    if (r > 0) rates.push_back(sweeps * bytes / std::max(t, 1e-9));
  }
  return rates.empty() ? 0.0 : median(rates);
}
}  // namespace impl

template <class Exec = Kokkos::DefaultExecutionSpace>
Bandwidth measure_bandwidth(std::size_t array_bytes, int reps, MPI_Comm comm, bool alone = false) {
  using View = Kokkos::View<float*, typename Exec::memory_space>;
  const std::size_t n = std::max<std::size_t>(array_bytes / sizeof(float) / 16, 1) * 16;
  const int sweeps = static_cast<int>(std::max<std::size_t>(1, (std::size_t(1) << 20) / (n * sizeof(float))));
  View a("kdist_bench::stream_a", n), b("kdist_bench::stream_b", n), c("kdist_bench::stream_c", n);
  Kokkos::deep_copy(a, 1.0f);
  Kokkos::deep_copy(b, 2.0f);
  Kokkos::deep_copy(c, 0.5f);
  Exec exec;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const bool run = !alone || rank == 0;
  const double e = static_cast<double>(n) * sizeof(float);
  const auto policy = Kokkos::RangePolicy<Exec>(exec, 0, n);
  Bandwidth bw;
  bw.copy = impl::stream_rate(exec, 2 * e, sweeps, reps, comm, run, [&] {
    Kokkos::parallel_for(
        "kdist_bench::stream_copy", policy, KOKKOS_LAMBDA(const std::size_t i) { c(i) = a(i); });
  });
  float sink = 0;
  bw.read = impl::stream_rate(exec, e, sweeps, reps, comm, run, [&] {
    float s = 0;
    Kokkos::parallel_reduce(
        "kdist_bench::stream_read", Kokkos::RangePolicy<Exec>(exec, 0, n / 16),
        KOKKOS_LAMBDA(const std::size_t j, float& acc) {
          const float* p = &a(16 * j);
          float q[8];
          for (int k = 0; k < 8; ++k) q[k] = p[k] + p[k + 8];
          acc += ((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7]));
        },
        s);
    sink += s;
  });
  bw.triad = impl::stream_rate(exec, 3 * e, sweeps, reps, comm, run, [&] {
    Kokkos::parallel_for(
        "kdist_bench::stream_triad", policy, KOKKOS_LAMBDA(const std::size_t i) { a(i) = b(i) + 0.5f * c(i); });
  });
  bw.deep_copy = impl::stream_rate(exec, 2 * e, sweeps, reps, comm, run, [&] { Kokkos::deep_copy(exec, c, a); });
  bw.copy_wide = impl::stream_rate(exec, 2 * e, sweeps, reps, comm, run, [&] {
    kdist::impl::for_copies(
        "kdist_bench::stream_copy_wide", exec, static_cast<std::int64_t>(n),
        KOKKOS_LAMBDA(const std::int64_t i) { return i; }, KOKKOS_LAMBDA(const std::int64_t i) { return a(i); },
        KOKKOS_LAMBDA(const std::int64_t i, const float v) { c(i) = v; });
  });
  if (sink < 0) bw.read = 0;  // keeps the reduction's result alive
  double out[5] = {bw.copy, bw.read, bw.triad, bw.deep_copy, bw.copy_wide};
  MPI_Bcast(out, 5, MPI_DOUBLE, 0, comm);
  return {out[0], out[1], out[2], out[3], out[4]};
}

}  // namespace kdist_bench
