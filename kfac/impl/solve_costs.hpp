// Which factor keeps its Cholesky factor R instead of its inverse (Options::cholesky_solves).
//
// A factor the preconditioning applies to whole columns can be kept either way. Over one inverse
// period (a refresh, then inverse_every applications to k columns), keeping R saves potri at the
// refresh (potrf + potri against potrf alone) and costs two triangular solves in place of one
// product at each application:
//   keep R  <=>  inverse_every * (t_solves(d, k) - t_product(d, k)) < t_potri(d).
// The flops say the solves cost the product's, but the BLAS does not always: OpenBLAS 0.3.21's
// AVX-512 kernels run gemm at twice trsm's rate, its SSE3 ones at the same (docs/performance.md).
// measured (opt-in) times both on the execution space, at d0 = min(d, 512) and k0 = min(k,
// 256), scaled by (d / d0)^3 for potri and (d / d0)^2 (k / k0) for the products; every rank then
// takes the slowest rank's figures, so every rank decides alike. A few tens of milliseconds at
// construction; the choice may differ between runs near the balance (a saved state converts).
#pragma once

#include <kdist/comm/engine.hpp>
#include <kdist/core/cholesky.hpp>
#include <kdist/core/cost_model.hpp>
#include <kdist/core/inverse.hpp>
#include <kdist/core/products.hpp>
#include <kdist/core/timer.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kdist {
namespace kfac {
namespace impl {

/// A factor of order d applied to k columns (left: R^-1 R^-T X, X d x k) or rows (right: X R^-1
/// R^-T, X k x d) every step: the cases the preconditioning has.
struct SolveCase {
  int d = 0, k = 0;
  bool left = true;
};

/// Seconds, as measured (or scaled to the case).
struct SolveTimes {
  double potri = 0, product = 0, solves = 0;
};

inline bool keeps_cholesky_at(const SolveTimes& t, int inverse_every) {
  return inverse_every * (t.solves - t.product) < t.potri;
}

inline SolveCase measured_case(const SolveCase& c) {
  return {std::min(c.d, 512), std::min(c.k, 256), c.left};
}

inline SolveTimes scaled(const SolveTimes& t, const SolveCase& measured, const SolveCase& c) {
  const double r = double(c.d) / measured.d, s = r * r * double(c.k) / measured.k;
  return {t.potri * r * r * r, t.product * s, t.solves * s};
}

// Median of `reps` runs of f, each ended by a fence; `reset` (untimed) before each.
template <class Exec, class Reset, class F>
double median_seconds(const Exec& exec, int reps, Reset&& reset, F&& f) {
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    reset();
    compat::fence(exec, "kdist::kfac::solve_costs: ready");
    const double t0 = Clock::local_now();
    f();
    compat::fence(exec, "kdist::kfac::solve_costs: done");
    samples.push_back(Clock::local_now() - t0);
  }
  return kdist::impl::median(std::move(samples));
}

/// The three times of one case on exec (T, memory space M), on a diagonally dominant matrix.
template <class T, class M>
SolveTimes measure_solve_times(const typename M::execution_space& exec, const SolveCase& c, int reps = 3) {
  using Matrix = Kokkos::View<T**, Kokkos::LayoutLeft, M>;
  using Exec = typename M::execution_space;
  const int d = c.d, rows = c.left ? d : c.k, cols = c.left ? c.k : d;
  Matrix A("kdist::kfac::solve_costs::A", d, d), inv("kdist::kfac::solve_costs::inverse", d, d);
  Matrix R("kdist::kfac::solve_costs::R", d, d), X("kdist::kfac::solve_costs::X", rows, cols);
  Matrix Y("kdist::kfac::solve_costs::Y", rows, cols);
  Kokkos::parallel_for(
      "kdist::kfac::solve_costs::fill", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {d, d}),
      KOKKOS_LAMBDA(const int i, const int j) { A(i, j) = i == j ? T(d + 1) : T(1) / T(2 + (i + j) % 7); });
  InverseWorkspace<T, M> ws;
  const auto nothing = [] {};
  const auto fill_x = [&] { Kokkos::deep_copy(exec, X, T(1)); };
  SolveTimes t;
  const double both = median_seconds(exec, reps, nothing, [&] { spd_inverse(exec, A, 0.0, inv, ws); });
  const double potrf = median_seconds(exec, reps, nothing, [&] { cholesky_factor(exec, A, 0.0, R, ws); });
  t.potri = std::max(0.0, both - potrf);
  t.product = median_seconds(exec, reps, fill_x, [&] {
    if (c.left)
      gemm(exec, "N", "N", T(1), inv, X, T(0), Y);
    else
      gemm(exec, "N", "N", T(1), X, inv, T(0), Y);
  });
  t.solves = median_seconds(exec, reps, fill_x, [&] {
    if (c.left)
      cholesky_solve_left(exec, R, X);
    else
      cholesky_solve_right(exec, X, R);
  });
  return t;
}

/// Per case: keep R? Each distinct measured case is timed once here, the times all-reduced (max)
/// over the engine's ranks. Collective: the all-reduce's label carries inverse_every and every
/// case, so ranks that pass different ones get the Engine's disagreement error on every rank, not
/// a choice taken from mixed times; a rank whose timing throws fails the Engine, so its peers
/// raise RemoteError instead of waiting.
template <class T, class M>
std::vector<bool> choose_cholesky(comm::Engine& engine, const typename M::execution_space& exec,
                                  const std::vector<SolveCase>& cases, int inverse_every) {
  std::map<std::pair<std::pair<int, int>, bool>, std::size_t> index;  // measured case -> slot in `times`
  std::vector<SolveCase> measured;
  for (const SolveCase& c : cases) {
    const SolveCase m = measured_case(c);
    if (index.emplace(std::make_pair(std::make_pair(m.d, m.k), m.left), measured.size()).second) measured.push_back(m);
  }
  std::string label = "kfac cholesky solve costs, inverses every " + std::to_string(inverse_every) + ":";
  for (const SolveCase& c : cases)
    label += " " + std::to_string(c.d) + "x" + std::to_string(c.k) + (c.left ? "L" : "R");
  std::vector<double> times;
  try {
    for (const SolveCase& m : measured) {
      const SolveTimes t = measure_solve_times<T, M>(exec, m);
      times.insert(times.end(), {t.potri, t.product, t.solves});
    }
  } catch (...) {
    engine.fail(std::current_exception());
    throw;
  }
  times = engine.allreduce_values(std::move(times), comm::ReduceOp::max, label);
  std::vector<bool> keep;
  for (const SolveCase& c : cases) {
    const SolveCase m = measured_case(c);
    const std::size_t i = 3 * index.at(std::make_pair(std::make_pair(m.d, m.k), m.left));
    keep.push_back(keeps_cholesky_at(scaled({times[i], times[i + 1], times[i + 2]}, m, c), inverse_every));
  }
  return keep;
}

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
