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
        for (int i = 0; i < d; ++i) P(i, j) = xi * F(i, j) + (T(1) - xi) * fresh(i, j);
      });
}

/// W := [weight | bias] (the bias column only when `bias`).
template <class Exec, class MV, class GV, class BV>
void gather_gradient(const Exec& exec, const MV& W, const GV& weight, const BV& b, bool bias) {
  const int inputs = static_cast<int>(weight.extent(1));
  Kokkos::parallel_for(
      "kdist::kfac::gather_gradient", Kokkos::RangePolicy<Exec>(exec, 0, weight.extent(0)), KOKKOS_LAMBDA(const int i) {
        for (int j = 0; j < inputs; ++j) W(i, j) = weight(i, j);
        if (bias) W(i, inputs) = b(i);
      });
}

/// sum_ij V(i,j) W(i,j) in double.
template <class Exec, class MV>
double inner(const Exec& exec, const MV& V, const MV& W) {
  const int cols = static_cast<int>(W.extent(1));
  double dot = 0;
  Kokkos::parallel_reduce(
      "kdist::kfac::kl_dot", Kokkos::RangePolicy<Exec>(exec, 0, W.extent(0)),
      KOKKOS_LAMBDA(const int i, double& sum) {
        for (int j = 0; j < cols; ++j) sum += double(V(i, j)) * double(W(i, j));
      },
      dot);
  return dot;
}

/// [weight | bias] := nu V.
template <class Exec, class GV, class BV, class MV, class T>
void scatter_gradient(const Exec& exec, const GV& weight, const BV& b, const MV& V, T nu, bool bias) {
  const int inputs = static_cast<int>(weight.extent(1));
  Kokkos::parallel_for(
      "kdist::kfac::scatter_gradient", Kokkos::RangePolicy<Exec>(exec, 0, weight.extent(0)),
      KOKKOS_LAMBDA(const int i) {
        for (int j = 0; j < inputs; ++j) weight(i, j) = nu * V(i, j);
        if (bias) b(i) = nu * V(i, inputs);
      });
}

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
