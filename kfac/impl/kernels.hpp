// The preconditioner's element-wise kernels, as free functions: nvcc refuses an extended
// (KOKKOS_LAMBDA) lambda inside a private member function or a constructor.
#pragma once

#include <kdist/core/compat.hpp>
#include <kdist/core/impl/entries.hpp>
#include <kdist/core/packed.hpp>

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

/// The upper triangle (diagonal included) of D := that of S; both column-major, same size.
template <class Exec, class MV>
void copy_upper(const Exec& exec, const MV& D, const MV& S) {
  if constexpr (!kdist::impl::runs_on_host<Exec>()) {
    kdist::impl::copy_upper_entries(exec, "kdist::kfac::copy_upper", S, D);
  } else {
    Kokkos::parallel_for(
        "kdist::kfac::copy_upper", Kokkos::RangePolicy<Exec>(exec, 0, D.extent(0)), KOKKOS_LAMBDA(const int j) {
          // Column pointers (every matrix here is column-major), so the loop vectorises.
          auto* const d = &D(0, j);
          const auto* const s = &S(0, j);
          for (int i = 0; i <= j; ++i) d[i] = s[i];
        });
  }
}

// The gradient copies and the KL dot product below walk a row or a column per work item on the
// host (the loops vectorise); on a device that leaves a thread per output (10 to a few thousand),
// each walking all inputs alone, so there they run a thread per entry, the fastest index along
// memory (kdist/core/impl/entries.hpp). The *_entries variants are that device form.

/// gather_gradient, a thread per entry (i, j) of [weight | bias], j fastest.
template <class Exec, class MV, class GV, class BV>
void gather_gradient_entries(const Exec& exec, const MV& Wt, const GV& weight, const BV& b, bool bias) {
  const int outputs = static_cast<int>(weight.extent(0)), inputs = static_cast<int>(weight.extent(1));
  Kokkos::parallel_for(
      "kdist::kfac::gather_gradient", kdist::impl::entries<Kokkos::LayoutRight>(exec, outputs, inputs + (bias ? 1 : 0)),
      KOKKOS_LAMBDA(const int i, const int j) { Wt(j, i) = j < inputs ? weight(i, j) : b(i); });
}

/// Wᵀ := [weight | bias]ᵀ (the bias row only when `bias`): Wᵀ column-major a_dim x outputs,
/// weight row-major outputs x inputs, so both are walked along memory (a copy, no transpose):
/// the preconditioner works on Vᵀ = A⁻¹ Wᵀ G⁻¹ for this reason.
template <class Exec, class MV, class GV, class BV>
void gather_gradient(const Exec& exec, const MV& Wt, const GV& weight, const BV& b, bool bias) {
  if constexpr (!kdist::impl::runs_on_host<Exec>()) {
    gather_gradient_entries(exec, Wt, weight, b, bias);
  } else {
    const int inputs = static_cast<int>(weight.extent(1));
    Kokkos::parallel_for(
        "kdist::kfac::gather_gradient", Kokkos::RangePolicy<Exec>(exec, 0, weight.extent(0)),
        KOKKOS_LAMBDA(const int i) {
          auto* const w = &Wt(0, i);
          const auto* const g = &weight(i, 0);
          for (int j = 0; j < inputs; ++j) w[j] = g[j];
          if (bias) w[inputs] = b(i);
        });
  }
}

/// inner, a thread per entry, i fastest.
template <class Exec, class MV>
double inner_entries(const Exec& exec, const MV& V, const MV& W) {
  double dot = 0;
  Kokkos::parallel_reduce(
      "kdist::kfac::kl_dot",
      kdist::impl::entries<Kokkos::LayoutLeft>(exec, static_cast<int>(W.extent(0)), static_cast<int>(W.extent(1))),
      KOKKOS_LAMBDA(const int i, const int j, double& sum) { sum += double(V(i, j)) * double(W(i, j)); }, dot);
  return dot;
}

/// sum_ij V(i,j) W(i,j) in double.
template <class Exec, class MV>
double inner(const Exec& exec, const MV& V, const MV& W) {
  if constexpr (!kdist::impl::runs_on_host<Exec>()) {
    return inner_entries(exec, V, W);
  } else {
    // The host form: column by column (both column-major).
    const int rows = static_cast<int>(W.extent(0));
    double dot = 0;
    Kokkos::parallel_reduce(
        "kdist::kfac::kl_dot", Kokkos::RangePolicy<Exec>(exec, 0, W.extent(1)),
        KOKKOS_LAMBDA(const int j, double& sum) {
          const auto *const v = &V(0, j), *const w = &W(0, j);
          // Four partial sums: independent chains of additions, four times the one chain's rate.
          double c[4] = {0, 0, 0, 0};
          int i = 0;
          for (; i + 4 <= rows; i += 4)
            for (int q = 0; q < 4; ++q) c[q] += double(v[i + q]) * double(w[i + q]);
          for (; i < rows; ++i) c[0] += double(v[i]) * double(w[i]);
          sum += (c[0] + c[1]) + (c[2] + c[3]);
        },
        dot);
    return dot;
  }
}

/// Vᵀ (a x g, column-major) from the all-gathered row blocks of split preconditioning over inputs:
/// rank p's rows [p r, p r + n) lie column-major (leading dimension n = min(r, a - p r)) from
/// offset p r g; ranks past the last row sent nothing of use.
/// One element per index, i fastest: Vᵀ's writes are contiguous (coalesced on a GPU), and the
/// layers split this way have few columns, so a loop per column would leave a device idle.
template <class Exec, class VV, class MV>
void unblock_rows(const Exec& exec, const VV& gathered, int block_rows, const MV& Vt) {
  const long long a = static_cast<long long>(Vt.extent(0)), g = static_cast<long long>(Vt.extent(1)), r = block_rows;
  Kokkos::parallel_for(
      "kdist::kfac::unblock_rows", Kokkos::RangePolicy<Exec>(exec, 0, a * g), KOKKOS_LAMBDA(const long long k) {
        const long long j = k / a, i = k - j * a, i0 = i / r * r, n = a - i0 < r ? a - i0 : r;
        Vt(i, j) = gathered(i0 * g + j * n + (i - i0));
      });
}

/// scatter_gradient, a thread per entry (i, j) of [weight | bias], j fastest.
template <class Exec, class GV, class BV, class MV, class T>
void scatter_gradient_entries(const Exec& exec, const GV& weight, const BV& b, const MV& Vt, T nu, bool bias) {
  const int outputs = static_cast<int>(weight.extent(0)), inputs = static_cast<int>(weight.extent(1));
  Kokkos::parallel_for(
      "kdist::kfac::scatter_gradient",
      kdist::impl::entries<Kokkos::LayoutRight>(exec, outputs, inputs + (bias ? 1 : 0)),
      KOKKOS_LAMBDA(const int i, const int j) {
        if (j < inputs)
          weight(i, j) = nu * Vt(j, i);
        else
          b(i) = nu * Vt(inputs, i);
      });
}

/// [weight | bias] := nu V, from Vᵀ column-major (a_dim x outputs) into the row-major weight.
template <class Exec, class GV, class BV, class MV, class T>
void scatter_gradient(const Exec& exec, const GV& weight, const BV& b, const MV& Vt, T nu, bool bias) {
  if constexpr (!kdist::impl::runs_on_host<Exec>()) {
    scatter_gradient_entries(exec, weight, b, Vt, nu, bias);
  } else {
    const int inputs = static_cast<int>(weight.extent(1));
    Kokkos::parallel_for(
        "kdist::kfac::scatter_gradient", Kokkos::RangePolicy<Exec>(exec, 0, weight.extent(0)),
        KOKKOS_LAMBDA(const int i) {
          const auto* const v = &Vt(0, i);
          auto* const g = &weight(i, 0);
          for (int j = 0; j < inputs; ++j) g[j] = nu * v[j];
          if (bias) b(i) = nu * v[inputs];
        });
  }
}

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
