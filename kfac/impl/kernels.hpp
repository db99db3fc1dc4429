// The preconditioner's element-wise kernels, as free functions: nvcc refuses an extended
// (KOKKOS_LAMBDA) lambda inside a private member function or a constructor.
#pragma once

#include <kdist/core/compat.hpp>

#include <Kokkos_Core.hpp>

namespace kdist {
namespace kfac {
namespace impl {

template <class Exec, class MV>
void fill_identity(const Exec& exec, const MV& F) {
  using T = typename MV::non_const_value_type;
  Kokkos::parallel_for(
      "kdist::kfac::identity", Kokkos::RangePolicy<Exec>(exec, 0, F.extent(0)),
      KOKKOS_LAMBDA(const int i) { F(i, i) = T(1); });
}

/// NaN/Inf on the diagonal of a fresh factor: the sums of squares of every input value.
template <class Exec, class MV>
int count_nonfinite_diagonal(const Exec& exec, const MV& A) {
  int bad = 0;
  Kokkos::parallel_reduce(
      "kdist::kfac::check_factor", Kokkos::RangePolicy<Exec>(exec, 0, A.extent(0)),
      KOKKOS_LAMBDA(const int i, int& count) { count += compat::isfinite(A(i, i)) ? 0 : 1; }, bad);
  return bad;
}

/// P := xi F + (1 - xi) fresh.
template <class Exec, class MV, class FV, class T>
void blend(const Exec& exec, const MV& P, const MV& F, const FV& fresh, T xi) {
  const int d = static_cast<int>(P.extent(0));
  Kokkos::parallel_for(
      "kdist::kfac::running_average", Kokkos::RangePolicy<Exec>(exec, 0, d), KOKKOS_LAMBDA(const int j) {
        // Column pointers (every matrix here is column-major), so the loop vectorises.
        T* const p = &P(0, j);
        const T *const f = &F(0, j), *const n = &fresh(0, j);
        for (int i = 0; i < d; ++i) p[i] = xi * f[i] + (T(1) - xi) * n[i];
      });
}

/// Rows per work item of the row-major <-> column-major gradient copies: a block of rows is read
/// along the rows while its column-major writes (or reads) stay within a few cache lines per
/// column; element by element, every column-major access was a cache line of its own.
constexpr int gradient_rows_per_item = 16;

/// W := [weight | bias] (the bias column only when `bias`); W column-major, weight row-major.
template <class Exec, class MV, class GV, class BV>
void gather_gradient(const Exec& exec, const MV& W, const GV& weight, const BV& b, bool bias) {
  const int inputs = static_cast<int>(weight.extent(1)), rows = static_cast<int>(weight.extent(0));
  constexpr int block = gradient_rows_per_item;
  Kokkos::parallel_for(
      "kdist::kfac::gather_gradient", Kokkos::RangePolicy<Exec>(exec, 0, (rows + block - 1) / block),
      KOKKOS_LAMBDA(const int t) {
        const int i0 = t * block, i1 = i0 + block < rows ? i0 + block : rows;
        for (int j = 0; j < inputs; ++j)
          for (int i = i0; i < i1; ++i) W(i, j) = weight(i, j);
        if (bias)
          for (int i = i0; i < i1; ++i) W(i, inputs) = b(i);
      });
}

/// sum_ij V(i,j) W(i,j) in double, column by column (both column-major).
template <class Exec, class MV>
double inner(const Exec& exec, const MV& V, const MV& W) {
  const int rows = static_cast<int>(W.extent(0));
  double dot = 0;
  Kokkos::parallel_reduce(
      "kdist::kfac::kl_dot", Kokkos::RangePolicy<Exec>(exec, 0, W.extent(1)),
      KOKKOS_LAMBDA(const int j, double& sum) {
        const auto *const v = &V(0, j), *const w = &W(0, j);
        double column = 0;
        for (int i = 0; i < rows; ++i) column += double(v[i]) * double(w[i]);
        sum += column;
      },
      dot);
  return dot;
}

/// [weight | bias] := nu V (V column-major, weight row-major), in blocks of rows as gather_gradient.
template <class Exec, class GV, class BV, class MV, class T>
void scatter_gradient(const Exec& exec, const GV& weight, const BV& b, const MV& V, T nu, bool bias) {
  const int inputs = static_cast<int>(weight.extent(1)), rows = static_cast<int>(weight.extent(0));
  constexpr int block = gradient_rows_per_item;
  Kokkos::parallel_for(
      "kdist::kfac::scatter_gradient", Kokkos::RangePolicy<Exec>(exec, 0, (rows + block - 1) / block),
      KOKKOS_LAMBDA(const int t) {
        const int i0 = t * block, i1 = i0 + block < rows ? i0 + block : rows;
        for (int j = 0; j < inputs; ++j)
          for (int i = i0; i < i1; ++i) weight(i, j) = nu * V(i, j);
        if (bias)
          for (int i = i0; i < i1; ++i) b(i) = nu * V(i, inputs);
      });
}

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
