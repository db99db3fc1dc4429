// The Cholesky factor of an SPD matrix, and solves with it, on the caller's execution space:
// LAPACK and BLAS on host spaces, cuSOLVER and cuBLAS on CUDA.
//
//   cholesky_factor(exec, A, damping, R, workspace)   R := upper R with R^T R = A + damping I
//   cholesky_solve_left(exec, R, X)                   X := (R^T R)^-1 X   (X is n x k)
//   cholesky_solve_right(exec, X, R)                  X := X (R^T R)^-1   (X is m x n)
// Where a matrix's inverse is only ever applied to whole columns (or rows), R serves instead of
// the inverse: potrf alone is a third of potrf + potri's flops, and the two triangular solves
// cost the flops of the product with the inverse (K-FAC's preconditioner keeps R so:
// Options::cholesky_solves, docs/performance.md).
//
// cholesky_factor reads only A's upper triangle and never writes A; it writes R into the upper
// triangle of R (LayoutLeft, contiguous, not sharing storage with A) and leaves the strict lower
// triangle unspecified; the solves read R's upper triangle only. Failures as spd_inverse's:
// non-finite input or a matrix not positive definite after damping throws NumericalError naming
// the operation, the dimension, the damping and potrf's info. One synchronisation of `exec` per
// factor (to read the info back); the solves stay enqueued on a device (host BLAS fences first).
#pragma once

#include <kdist/core/inverse.hpp>
#include <kdist/core/products.hpp>

#include <algorithm>
#include <string>

namespace kdist {
namespace impl {

/// R square, X LayoutLeft with `along` rows (left solve) or columns (right solve) = R's order.
template <class ExecSpace, class RV, class XV>
void check_solve(const char* func, const RV& R, const XV& X, bool left) {
  static_check_view<ExecSpace, RV>();
  static_check_view<ExecSpace, XV>();
  static_assert(compat::view_rank<RV>() == 2 && compat::view_rank<XV>() == 2, "kdist: matrices must be rank 2");
  static_assert(std::is_same<typename RV::non_const_value_type, typename XV::value_type>::value,
                "kdist: R and X must hold the same value type, X non-const");
  static_assert(std::is_same<typename RV::array_layout, Kokkos::LayoutLeft>::value &&
                    std::is_same<typename XV::array_layout, Kokkos::LayoutLeft>::value,
                "kdist: R and X must be LayoutLeft (BLAS works on them in place)");
  require_square(func, R);
  const std::size_t along = left ? X.extent(0) : X.extent(1);
  if (along != R.extent(0))
    throw_invalid(func, "X " + describe(X) + " does not fit R " + describe(R) + (left ? " (rows)" : " (columns)"));
  require_disjoint(func, R, X);
}

template <class ExecSpace, class RV, class XV>
void cholesky_solve(const ExecSpace& exec, const char* func, const RV& R, const XV& X, bool left) {
  using T = typename XV::non_const_value_type;
  check_solve<ExecSpace>(func, R, X, left);
  const int m = static_cast<int>(X.extent(0)), n = static_cast<int>(X.extent(1));
  if (m == 0 || n == 0) return;
  const int ldr = static_cast<int>(R.stride(1)), ldx = std::max(static_cast<int>(X.stride(1)), m);
  // Left: R^T Z = X, then R X' = Z. Right: Y R = X, then X' R^T = Y.
  Blas3<ExecSpace, T>::trsm(exec, left ? 'L' : 'R', left ? 'T' : 'N', m, n, R.data(), ldr, X.data(), ldx);
  Blas3<ExecSpace, T>::trsm(exec, left ? 'L' : 'R', left ? 'N' : 'T', m, n, R.data(), ldr, X.data(), ldx);
}

}  // namespace impl

/// R := the upper Cholesky factor of A + damping I (R^T R = A + damping I). Reads A's upper
/// triangle only; R's strict lower triangle is left unspecified. One synchronisation of `exec`.
template <class ExecSpace, class AV, class RV, class WT, class WsMem>
void cholesky_factor(const ExecSpace& exec, const AV& A, double damping, const RV& R,
                     InverseWorkspace<WT, WsMem>& workspace) {
  constexpr const char* func = "kdist::cholesky_factor";
  using T = typename RV::non_const_value_type;
  using Solver = impl::DenseSolver<ExecSpace, T>;
  impl::static_check_workspace<WT, T, ExecSpace, WsMem>();
  impl::check_square_pair<ExecSpace>(func, A, R);
  Phase phase(func);
  const int n = static_cast<int>(A.extent(0));
  if (!std::isfinite(damping)) throw NumericalError(func, n, damping, 0, "non-finite damping");
  if (n == 0) return;
  const auto bad = workspace.impl_nonfinite(exec);
  impl::copy_upper_counting_nonfinite(exec, "kdist::cholesky_factor::damp", A, static_cast<T>(damping), R, bad);
  impl::identity_if_nonfinite(exec, bad, R);
  const int ldr = static_cast<int>(R.stride(1));
  const std::size_t bytes = Solver::cholesky_factor_bytes(exec, n, ldr);
  Solver::cholesky_factor(exec, R.data(), n, ldr, workspace.impl_solver_scratch(exec, bytes), bytes,
                          workspace.impl_info(exec).data());
  const impl::SolverStatus st = workspace.impl_read_status(exec);
  if (st.nonfinite) impl::throw_nonfinite(func, n, damping, st.nonfinite, A.label());
  if (st.info[0] != 0)
    throw NumericalError(func, n, damping, st.info[0],
                         std::string(Solver::factor_stage) +
                             ": matrix is not positive definite after damping (leading minor " +
                             std::to_string(st.info[0]) + ")");
}

/// The same with a workspace made for this one call.
template <class ExecSpace, class AV, class RV>
void cholesky_factor(const ExecSpace& exec, const AV& A, double damping, const RV& R) {
  InverseWorkspace<typename RV::non_const_value_type, typename RV::memory_space> workspace;
  cholesky_factor(exec, A, damping, R, workspace);
}

/// X := (R^T R)^-1 X, in place, R from cholesky_factor (n x n), X n x k.
template <class ExecSpace, class RV, class XV>
void cholesky_solve_left(const ExecSpace& exec, const RV& R, const XV& X) {
  impl::cholesky_solve(exec, "kdist::cholesky_solve_left", R, X, true);
}

/// X := X (R^T R)^-1, in place, R from cholesky_factor (n x n), X m x n.
template <class ExecSpace, class XV, class RV>
void cholesky_solve_right(const ExecSpace& exec, const XV& X, const RV& R) {
  impl::cholesky_solve(exec, "kdist::cholesky_solve_right", R, X, false);
}

}  // namespace kdist
