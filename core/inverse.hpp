// SPD inverse (A + damping I)^-1 and the symmetric eigendecomposition, on the caller's execution
// space: LAPACK on host spaces, cuSOLVER on CUDA (three-layer dispatch, ARCHITECTURE.md §4).
//
// Outputs must not share storage with A or with each other: checked on the byte spans, so an
// output shifted by one element or one column is rejected (InvalidArgument, A untouched).
//
// Failure contract: non-finite input, or a matrix that is not positive definite after damping,
// throws kdist::NumericalError naming the operation, the dimension, the damping and the LAPACK
// info; the input view is never written, the output's contents are then unspecified.
#pragma once

#include <kdist/config.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/impl/lapack_host.hpp>
#include <kdist/core/packed.hpp>
#include <kdist/core/phase.hpp>
#include <kdist/core/products.hpp>
#include <kdist/core/views.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#if KDIST_ENABLE_CUSOLVER && defined(KOKKOS_ENABLE_CUDA)
#include <kdist/core/impl/cusolver_backend.hpp>
#endif

namespace kdist {

enum class InverseMethod {
  cholesky,  ///< potrf + potri: about d^3 flops, the default
  eigen      ///< syevd, then Q diag(1/(lambda + damping)) Q^T: slower, robust to clustered spectra
};

namespace impl {

/// Result of a backend call: which LAPACK stage failed (nullptr if none) and its info.
struct LapackStatus {
  const char* stage = nullptr;
  int info = 0;
};

template <class ExecSpace, class T, class Enable = void>
struct DenseSolver {
  static_assert(sizeof(T) == 0, "kdist: no LAPACK backend for this execution space");
};

/// Host spaces: reference LAPACK interface (OpenBLAS here).
template <class ExecSpace, class T>
struct DenseSolver<ExecSpace, T,
                   std::enable_if_t<Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible>> {
  /// In place on the upper triangle of a column-major n x n matrix.
  static LapackStatus cholesky_inverse(const ExecSpace& exec, T* a, int n, int lda) {
    compat::fence(exec, "kdist::spd_inverse: before LAPACK");
    int info = host::potrf<T>('U', n, a, lda);
    if (info != 0) return {"potrf", info};
    info = host::potri<T>('U', n, a, lda);
    if (info != 0) return {"potri", info};
    return {};
  }
  /// In place: a := eigenvectors, w := eigenvalues (ascending).
  static LapackStatus syevd(const ExecSpace& exec, T* a, int n, int lda, T* w) {
    compat::fence(exec, "kdist::symmetric_eigen: before LAPACK");
    const host::SyevdWorkspace ws = host::syevd_workspace<T>('V', 'U', n);
    std::vector<T> work(static_cast<std::size_t>(ws.lwork));
    std::vector<int> iwork(static_cast<std::size_t>(ws.liwork > 0 ? ws.liwork : 1));
    const int info = host::syevd<T>('V', 'U', n, a, lda, w, work.data(), ws.lwork, iwork.data(), ws.liwork);
    return info != 0 ? LapackStatus{"syevd", info} : LapackStatus{};
  }
};

#if KDIST_ENABLE_CUSOLVER && defined(KOKKOS_ENABLE_CUDA)
/// CUDA: cuSOLVER on the instance's stream, workspace owned by a labelled Kokkos view.
template <class T>
struct DenseSolver<Kokkos::Cuda, T, void> {
  static LapackStatus cholesky_inverse(const Kokkos::Cuda& exec, T* a, int n, int lda) {
    const std::size_t bytes = cusolver::cholesky_inverse_workspace<T>(n, lda, exec.cuda_stream());
    Kokkos::View<char*, Kokkos::CudaSpace> ws(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kdist::spd_inverse::cusolver_workspace"), bytes);
    Kokkos::View<int, Kokkos::CudaSpace> info(Kokkos::view_alloc(exec, "kdist::spd_inverse::dev_info"));
    const int i = cusolver::cholesky_inverse<T>(a, n, lda, ws.data(), bytes, info.data(), exec.cuda_stream());
    return i != 0 ? LapackStatus{"cusolverDn potrf/potri", i} : LapackStatus{};
  }
  static LapackStatus syevd(const Kokkos::Cuda& exec, T* a, int n, int lda, T* w) {
    const std::size_t bytes = cusolver::syevd_workspace<T>(n, lda, exec.cuda_stream());
    Kokkos::View<char*, Kokkos::CudaSpace> ws(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kdist::symmetric_eigen::cusolver_workspace"), bytes);
    Kokkos::View<int, Kokkos::CudaSpace> info(Kokkos::view_alloc(exec, "kdist::symmetric_eigen::dev_info"));
    const int i = cusolver::syevd<T>(a, n, lda, w, ws.data(), bytes, info.data(), exec.cuda_stream());
    return i != 0 ? LapackStatus{"cusolverDn syevd", i} : LapackStatus{};
  }
};
#endif

/// Number of NaN/Inf entries of a rank-2 view.
template <class ExecSpace, class AV>
long long count_nonfinite(const ExecSpace& exec, const AV& A) {
  long long bad = 0;
  const int rows = static_cast<int>(A.extent(0));
  const int cols = static_cast<int>(A.extent(1));
  Kokkos::parallel_reduce(
      "kdist::count_nonfinite", Kokkos::RangePolicy<ExecSpace>(exec, 0, cols),
      KOKKOS_LAMBDA(const int j, long long& acc) {
        for (int i = 0; i < rows; ++i)
          if (!compat::isfinite(A(i, j))) ++acc;
      },
      bad);
  return bad;
}

template <class ExecSpace, class AV, class OV>
void check_square_pair(const char* func, const AV& A, const OV& out) {
  static_check_view<ExecSpace, AV>();
  static_check_view<ExecSpace, OV>();
  static_assert(compat::view_rank<AV>() == 2 && compat::view_rank<OV>() == 2, "kdist: matrices must be rank 2");
  using T = typename OV::non_const_value_type;
  static_assert(std::is_same<typename AV::non_const_value_type, T>::value, "kdist: value types differ");
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value, "kdist: float or double only");
  static_assert(std::is_same<typename OV::array_layout, Kokkos::LayoutLeft>::value,
                "kdist: the output matrix must be LayoutLeft (LAPACK works on it in place)");
  require_square(func, A);
  if (out.extent(0) != A.extent(0) || out.extent(1) != A.extent(1))
    throw_invalid(func, "output " + describe(out) + " must match input " + describe(A));
  require_contiguous(func, out);
  require_disjoint(func, A, out);
}

[[noreturn]] inline void throw_nonfinite(const char* func, long long n, double damping, long long bad,
                                         const std::string& label) {
  throw NumericalError(func, n, damping, 0,
                       "non-finite input (" + std::to_string(bad) + " NaN/Inf entries in '" + label + "')");
}

template <class ExecSpace, class AV>
void require_finite(const ExecSpace& exec, const char* func, const AV& A, double damping) {
  if (!std::isfinite(damping))
    throw NumericalError(func, static_cast<long long>(A.extent(0)), damping, 0, "non-finite damping");
  if (const long long bad = count_nonfinite(exec, A)) throw_nonfinite(func, A.extent(0), damping, bad, A.label());
}

}  // namespace impl

/// eigenvalues := ascending eigenvalues of the symmetric matrix A, Q := orthonormal eigenvectors
/// (columns). Reads only A's upper triangle; never writes A. A, Q and eigenvalues must not share
/// storage.
template <class ExecSpace, class AV, class WV, class QV>
void symmetric_eigen(const ExecSpace& exec, const AV& A, const WV& eigenvalues, const QV& Q) {
  constexpr const char* func = "kdist::symmetric_eigen";
  impl::check_square_pair<ExecSpace>(func, A, Q);
  impl::static_check_view<ExecSpace, WV>();
  static_assert(compat::view_rank<WV>() == 1, "kdist: eigenvalues must be rank 1");
  using T = typename QV::non_const_value_type;
  const int n = static_cast<int>(A.extent(0));
  if (static_cast<int>(eigenvalues.extent(0)) != n)
    impl::throw_invalid(func, "eigenvalues " + impl::describe(eigenvalues) + " must have " + std::to_string(n) +
                                  " entries for " + impl::describe(A));
  impl::require_contiguous(func, eigenvalues);
  impl::require_disjoint(func, A, eigenvalues);
  impl::require_disjoint(func, Q, eigenvalues);
  impl::require_finite(exec, func, A, 0.0);
  if (n == 0) return;
  Kokkos::deep_copy(exec, Q, A);
  const impl::LapackStatus st =
      impl::DenseSolver<ExecSpace, T>::syevd(exec, Q.data(), n, static_cast<int>(Q.stride(1)), eigenvalues.data());
  if (st.stage) throw NumericalError(func, n, 0.0, st.info, std::string(st.stage) + " did not converge");
}

/// inv := (A + damping I)^-1 for symmetric positive definite A, in full symmetric storage.
/// Reads only A's upper triangle; never writes A; A and inv must not share storage.
template <class ExecSpace, class AV, class IV>
void spd_inverse(const ExecSpace& exec, const AV& A, double damping, const IV& inv,
                 InverseMethod method = InverseMethod::cholesky) {
  using T = typename IV::non_const_value_type;
  using MemSpace = typename IV::memory_space;
  const char* func = method == InverseMethod::cholesky ? "kdist::spd_inverse(cholesky)" : "kdist::spd_inverse(eigen)";
  impl::check_square_pair<ExecSpace>(func, A, inv);
  Phase phase(func);
  const int n = static_cast<int>(A.extent(0));
  if (!std::isfinite(damping)) throw NumericalError(func, n, damping, 0, "non-finite damping");
  if (n == 0) return;
  const T gamma = static_cast<T>(damping);

  if (method == InverseMethod::cholesky) {
    // One pass: copy the upper triangle with damping, counting NaN/Inf on the way (OpenBLAS
    // potrf can return info = 0 on NaN, so this check must come before LAPACK).
    long long bad = 0;
    Kokkos::parallel_reduce(
        "kdist::spd_inverse::damp", Kokkos::RangePolicy<ExecSpace>(exec, 0, n),
        KOKKOS_LAMBDA(const int j, long long& acc) {
          // Branch-free loops so the compiler vectorises the copy and the count.
          int col_bad = 0;
          for (int i = 0; i < j; ++i) {
            const T a = A(i, j);
            inv(i, j) = a;
            col_bad += !compat::isfinite(a);
          }
          const T diag = A(j, j);
          inv(j, j) = diag + gamma;
          col_bad += !compat::isfinite(diag);
          for (int i = j + 1; i < n; ++i) col_bad += !compat::isfinite(A(i, j));
          acc += col_bad;
        },
        bad);
    if (bad) impl::throw_nonfinite(func, n, damping, bad, A.label());
    const impl::LapackStatus st =
        impl::DenseSolver<ExecSpace, T>::cholesky_inverse(exec, inv.data(), n, static_cast<int>(inv.stride(1)));
    if (st.stage)
      throw NumericalError(func, n, damping, st.info,
                           std::string(st.stage) + ": matrix is not positive definite after damping (leading minor " +
                               std::to_string(st.info) + ")");
    mirror_upper_to_lower(exec, inv);
    return;
  }

  impl::require_finite(exec, func, A, damping);
  Kokkos::View<T**, Kokkos::LayoutLeft, MemSpace> Q(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kdist::spd_inverse::Q"), n, n);
  Kokkos::View<T*, MemSpace> w(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kdist::spd_inverse::lambda"), n);
  symmetric_eigen(exec, A, w, Q);
  T wmin = 0;
  Kokkos::parallel_reduce(
      "kdist::spd_inverse::min_eig", Kokkos::RangePolicy<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(const int i, T& m) {
        if (w(i) + gamma < m) m = w(i) + gamma;
      },
      Kokkos::Min<T>(wmin));
  // Eigenvalues are exact only to about n * eps * |lambda_max|: below that the matrix is not
  // numerically positive definite and its inverse would be noise.
  T wmax = 0;
  {
    auto last = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), Kokkos::subview(w, std::make_pair(n - 1, n)));
    wmax = last(0) + gamma;
  }
  const T tol = static_cast<T>(n) * std::numeric_limits<T>::epsilon() * std::abs(wmax);
  if (!(wmin > tol))
    throw NumericalError(func, n, damping, 0,
                         "matrix is not positive definite after damping (smallest eigenvalue + damping = " +
                             std::to_string(static_cast<double>(wmin)) + ")");
  Kokkos::View<T**, Kokkos::LayoutLeft, MemSpace> W(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kdist::spd_inverse::Q_scaled"), n, n);
  Kokkos::parallel_for(
      "kdist::spd_inverse::scale", Kokkos::RangePolicy<ExecSpace>(exec, 0, n), KOKKOS_LAMBDA(const int j) {
        const T s = T(1) / (w(j) + gamma);
        for (int i = 0; i < n; ++i) W(i, j) = Q(i, j) * s;
      });
  gemm(exec, "N", "T", T(1), W, Q, T(0), inv);
  mirror_upper_to_lower(exec, inv);
}

template <class AV, class IV>
void spd_inverse(const AV& A, double damping, const IV& inv, InverseMethod method = InverseMethod::cholesky) {
  spd_inverse(typename IV::execution_space{}, A, damping, inv, method);
}
template <class AV, class WV, class QV>
void symmetric_eigen(const AV& A, const WV& eigenvalues, const QV& Q) {
  symmetric_eigen(typename QV::execution_space{}, A, eigenvalues, Q);
}

}  // namespace kdist
