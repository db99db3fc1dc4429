// Calibration of the SPD-inverse cost model (core/cost_model.hpp), run by the code that inverts
// on the execution space it uses: spd_inverse (Cholesky, double) on `exec` for d = 64, 128, ...
// up to max_d, each size timed `repeats` times (the instance is fenced before the clock is read)
// and kept as the median; it stops early when the next size (about 8x the cost) would overrun
// `budget_seconds`. The model is t = alpha + beta d^3, with x = d^3 in the table.
// Local: no communication; store it under {CostOp::spd_inverse, DType::float64, 1, "local"}.
#pragma once

#include <kdist/core/compat.hpp>
#include <kdist/core/cost_model.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/inverse.hpp>
#include <kdist/core/timer.hpp>

#include <Kokkos_Core.hpp>
#include <string>
#include <vector>

namespace kdist {

/// Throws InvalidArgument unless max_d >= 64, budget_seconds > 0 and repeats >= 1.
template <class ExecSpace>
CostModel calibrate_inverse(const ExecSpace& exec, int max_d, double budget_seconds, int repeats = 3) {
  if (max_d < 64 || !(budget_seconds > 0) || repeats < 1)
    impl::throw_invalid("kdist::calibrate_inverse",
                        "needs max_d >= 64, a positive budget and repeats >= 1, got max_d " + std::to_string(max_d) +
                            ", budget " + std::to_string(budget_seconds) + " s, repeats " + std::to_string(repeats));
  using Matrix = Kokkos::View<double**, Kokkos::LayoutLeft, typename ExecSpace::memory_space>;
  std::vector<double> xs, ts;
  const double start = Clock::local_now();
  for (int d = 64; d <= max_d; d *= 2) {
    Matrix A(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kdist::calibrate_inverse::A"), d, d);
    Matrix inv(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kdist::calibrate_inverse::inv"), d, d);
    Kokkos::deep_copy(exec, A, 0.0);
    Kokkos::parallel_for(
        "kdist::calibrate_inverse::diagonal", Kokkos::RangePolicy<ExecSpace>(exec, 0, d),
        KOKKOS_LAMBDA(const int i) { A(i, i) = 1.0 + i % 7; });
    compat::fence(exec, "kdist::calibrate_inverse: matrix ready");
    std::vector<double> samples;
    for (int r = 0; r < repeats; ++r) {
      const double t0 = Clock::local_now();
      spd_inverse(exec, A, 1e-3, inv);
      compat::fence(exec, "kdist::calibrate_inverse: inverse done");
      samples.push_back(Clock::local_now() - t0);
    }
    xs.push_back(double(d) * d * d);
    ts.push_back(impl::median(samples));
    if (Clock::local_now() - start + 8.0 * ts.back() * repeats > budget_seconds) break;
  }
  return CostModel::from_measurements(xs, ts);
}

/// On Kokkos::DefaultExecutionSpace (the device in a CUDA build).
CostModel calibrate_inverse(int max_d, double budget_seconds, int repeats = 3);

}  // namespace kdist
