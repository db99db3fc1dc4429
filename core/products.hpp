// Factor products A = X^T X * scale (K-FAC's Kronecker factors) and a gemm that takes the
// execution-space instance on both Kokkos Kernels 3.4 and 4.x. A FactorUpdate says how the
// product lands in A: replacing it in full (symmetric), or blended into its upper triangle as a
// running average (K-FAC's, inside the one syrk: no fresh factor, no blend pass, no mirror).
#pragma once

#include <kdist/config.hpp>
#include <kdist/core/impl/blas_host.hpp>
#include <kdist/core/packed.hpp>
#include <kdist/core/phase.hpp>
#include <kdist/core/views.hpp>

#include <KokkosBlas3_gemm.hpp>
#include <algorithm>
#include <string>
#include <type_traits>

#if KDIST_ENABLE_CUDA && defined(KOKKOS_ENABLE_CUDA)
#include <kdist/core/impl/cusolver_backend.hpp>
#endif

namespace kdist {
namespace impl {

/// Backend dispatch for the BLAS 3 calls Kokkos Kernels lacks or takes no instance for, on
/// upper triangles, column-major: syrk (C := alpha op(A) op(A)^T + beta C) and trsm (B := op(A)^-1
/// B for side 'L', B op(A)^-1 for 'R', non-unit diagonal). Host spaces call BLAS; the CUDA
/// specialisation calls cuBLAS on the instance's stream.
template <class ExecSpace, class T, class Enable = void>
struct Blas3 {
  static_assert(sizeof(T) == 0, "kdist: no BLAS backend (syrk, trsm) for this execution space");
};

template <class ExecSpace, class T>
struct Blas3<ExecSpace, T, std::enable_if_t<Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible>> {
  static void syrk(const ExecSpace& exec, char trans, int n, int k, T alpha, const T* A, int lda, T beta, T* C,
                   int ldc) {
    compat::fence(exec, "kdist: before BLAS syrk");
    host::syrk<T>('U', trans, n, k, alpha, A, lda, beta, C, ldc);
  }
  static void trsm(const ExecSpace& exec, char side, char trans, int m, int n, const T* A, int lda, T* B, int ldb) {
    compat::fence(exec, "kdist: before BLAS trsm");
    host::trsm<T>(side, 'U', trans, m, n, T(1), A, lda, B, ldb);
  }
};

#if KDIST_ENABLE_CUDA && defined(KOKKOS_ENABLE_CUDA)
template <class T>
struct Blas3<Kokkos::Cuda, T, void> {
  static void syrk(const Kokkos::Cuda& exec, char trans, int n, int k, T alpha, const T* A, int lda, T beta, T* C,
                   int ldc) {
    cusolver::syrk<T>(trans, n, k, alpha, A, lda, beta, C, ldc, exec.cuda_stream());
  }
  static void trsm(const Kokkos::Cuda& exec, char side, char trans, int m, int n, const T* A, int lda, T* B, int ldb) {
    cusolver::trsm<T>(side, trans, m, n, T(1), A, lda, B, ldb, exec.cuda_stream());
  }
};
#endif

/// The bias column of factor_product on a device space: A(j, d) := alpha * (column sum j of X) +
/// beta * A(j, d) (A(d, d) from the sum of `rows` ones; with beta 0 the old A is not read). A
/// team per column: a thread per column would walk all rows alone (50 176 for a 28 x 28
/// convolution at batch 64), neighbouring threads a column apart.
template <class ExecSpace, class XView, class AView>
void bias_column_teams(const ExecSpace& exec, const XView& X, const AView& A,
                       typename AView::non_const_value_type alpha, typename AView::non_const_value_type beta) {
  using T = typename AView::non_const_value_type;
  const int rows = static_cast<int>(X.extent(0)), d = static_cast<int>(X.extent(1));
  for_team_sums(
      "kdist::factor_product::bias", exec, d + 1, rows,
      KOKKOS_LAMBDA(const int j, const int r) { return j < d ? T(X(r, j)) : T(1); },
      KOKKOS_LAMBDA(const int j, const T sum) { A(j, d) = beta == T(0) ? alpha * sum : beta * A(j, d) + alpha * sum; });
}

}  // namespace impl

/// How factor_product writes its product F = scale * X^T X into A.
class FactorUpdate {
 public:
  /// A := F, in full symmetric storage (the default).
  static FactorUpdate replace() { return FactorUpdate(0.0, false); }
  /// The upper triangle of A := keep * A + (1 - keep) * F; the strictly lower triangle is neither
  /// read nor written. keep in [0, 1), else InvalidArgument.
  static FactorUpdate running_average(double keep) {
    if (!(keep >= 0 && keep < 1))
      impl::throw_invalid("kdist::FactorUpdate::running_average", "keep " + std::to_string(keep) + " is not in [0, 1)");
    return FactorUpdate(keep, true);
  }
  double keep() const noexcept { return keep_; }
  bool upper_only() const noexcept { return upper_only_; }

 private:
  FactorUpdate(double keep, bool upper_only) : keep_(keep), upper_only_(upper_only) {}
  double keep_;
  bool upper_only_;
};

/// A = scale * X^T X for X of shape rows x d (LayoutLeft or LayoutRight, read in place).
/// With `bias`, A is (d+1) x (d+1) and equals scale * [X 1]^T [X 1]: the extra row/column holds
/// scale times the column sums of X and the corner holds scale * rows (1 for scale = 1/rows).
/// No ones column is materialised. A is LayoutLeft, full symmetric storage (or, with
/// FactorUpdate::running_average, the upper triangle blended), and must not share storage with X
/// (InvalidArgument, X untouched).
template <class ExecSpace, class XView, class AView>
void factor_product(const ExecSpace& exec, const XView& X, const AView& A, typename AView::non_const_value_type scale,
                    bool bias = false, const FactorUpdate& update = FactorUpdate::replace()) {
  using T = typename AView::non_const_value_type;
  using XLayout = typename XView::array_layout;
  constexpr const char* func = "kdist::factor_product";
  impl::static_check_view<ExecSpace, XView>();
  impl::static_check_view<ExecSpace, AView>();
  static_assert(compat::view_rank<XView>() == 2 && compat::view_rank<AView>() == 2, "kdist: X and A must be rank 2");
  static_assert(std::is_same<typename XView::non_const_value_type, T>::value, "kdist: X and A value types differ");
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value, "kdist: float or double only");
  static_assert(std::is_same<XLayout, Kokkos::LayoutLeft>::value || std::is_same<XLayout, Kokkos::LayoutRight>::value,
                "kdist::factor_product: X must be LayoutLeft or LayoutRight");
  static_assert(std::is_same<typename AView::array_layout, Kokkos::LayoutLeft>::value,
                "kdist::factor_product: A must be LayoutLeft");
  const int rows = static_cast<int>(X.extent(0));
  const int d = static_cast<int>(X.extent(1));
  const int n = d + (bias ? 1 : 0);
  impl::require_square(func, A);
  if (static_cast<int>(A.extent(0)) != n)
    impl::throw_invalid(func, "factor " + impl::describe(A) + " must be " + std::to_string(n) + " x " +
                                  std::to_string(n) + " for X " + impl::describe(X) + (bias ? " with bias" : ""));
  impl::require_disjoint(func, X, A);
  if (n == 0) return;
  // F lands as alpha X^T X + beta A: syrk's own beta, so the blend costs no pass of its own.
  const T alpha = static_cast<T>((1.0 - update.keep()) * static_cast<double>(scale));
  const T beta = static_cast<T>(update.keep());
  const int ldc = std::max<int>(1, static_cast<int>(A.stride(1)));
  if (d > 0) {
    // A region of its own: Kokkos Tools see BLAS / cuBLAS calls only through regions.
    Phase syrk_phase("kdist::factor_product::syrk");
    if (std::is_same<XLayout, Kokkos::LayoutLeft>::value) {
      // X is column-major rows x d: A = X^T X is syrk('T').
      const int lda = std::max<int>(1, static_cast<int>(X.stride(1)));
      impl::Blas3<ExecSpace, T>::syrk(exec, 'T', d, rows, alpha, X.data(), std::max(lda, rows), beta, A.data(), ldc);
    } else {
      // X row-major is X^T column-major (d x rows): A = (X^T)(X^T)^T is syrk('N').
      const int lda = std::max<int>(std::max(1, d), static_cast<int>(X.stride(0)));
      impl::Blas3<ExecSpace, T>::syrk(exec, 'N', d, rows, alpha, X.data(), lda, beta, A.data(), ldc);
    }
  }
  if constexpr (!impl::runs_on_host<ExecSpace>()) {
    if (bias) impl::bias_column_teams(exec, X, A, alpha, beta);
  } else if (bias) {
    // Upper part of the bias column (scaled column sums of X) and the corner; with beta 0 the
    // old A is not read (it may hold anything), as in BLAS.
    Kokkos::parallel_for(
        "kdist::factor_product::bias", Kokkos::RangePolicy<ExecSpace>(exec, 0, n), KOKKOS_LAMBDA(const int j) {
          T sum = static_cast<T>(rows);
          if (j < d) {
            sum = 0;
            for (int r = 0; r < rows; ++r) sum += X(r, j);
          }
          A(j, d) = beta == T(0) ? alpha * sum : beta * A(j, d) + alpha * sum;
        });
  }
  if (!update.upper_only()) mirror_upper_to_lower(exec, A);
}

template <class XView, class AView>
void factor_product(const XView& X, const AView& A, typename AView::non_const_value_type scale, bool bias = false,
                    const FactorUpdate& update = FactorUpdate::replace()) {
  factor_product(typename AView::execution_space{}, X, A, scale, bias, update);
}

/// C := alpha op(A) op(B) + beta C through Kokkos Kernels, on `exec` (3.4 has no instance
/// overload: there the instance is fenced and the call runs on the default instance).
template <class ExecSpace, class AV, class BV, class CV>
void gemm(const ExecSpace& exec, const char transA[], const char transB[], typename CV::const_value_type alpha,
          const AV& A, const BV& B, typename CV::const_value_type beta, const CV& C) {
#if KOKKOS_VERSION >= 40100
  KokkosBlas::gemm(exec, transA, transB, alpha, A, B, beta, C);
#else
  compat::fence(exec, "kdist::gemm: Kokkos Kernels 3.4 has no instance overload");
  KokkosBlas::gemm(transA, transB, alpha, A, B, beta, C);
#endif
}

}  // namespace kdist
