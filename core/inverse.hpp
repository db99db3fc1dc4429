// SPD inverse (A + damping I)^-1 and the symmetric eigendecomposition, on the caller's execution
// space: LAPACK on host spaces, cuSOLVER on CUDA (three-layer dispatch, docs/architecture.md §4).
//
//   spd_inverse(exec, A, damping, inv [, workspace] [, method])   cholesky (default) or eigen
//   symmetric_eigen(exec, A, eigenvalues, Q [, workspace])
// Both read only A's upper triangle and never write A. Outputs are LayoutLeft and contiguous
// and must not share storage with A or with each other (checked on the byte spans: an output
// shifted by one element or one column is rejected with InvalidArgument, A untouched).
// Scratch comes from an InverseWorkspace (core/inverse_workspace.hpp): pass one to reuse it
// across calls, so that a call of a size seen before allocates nothing; without one a temporary
// is made (on CUDA a Cholesky inverse from order 512 keeps its factor there: one n x n matrix).
// Each call synchronises `exec` once, to read back the NaN/Inf count, the backends' info and
// (eigen method) the extreme eigenvalues; the final mirror kernel stays enqueued.
//
// Failure contract: non-finite input, or a matrix that is not positive definite after damping,
// throws kdist::NumericalError naming the operation, the dimension, the damping and the LAPACK
// info; the input view is never written, the output's contents are then unspecified.
#pragma once

#include <kdist/config.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/impl/lapack_host.hpp>
#include <kdist/core/inverse_workspace.hpp>
#include <kdist/core/packed.hpp>
#include <kdist/core/phase.hpp>
#include <kdist/core/products.hpp>
#include <kdist/core/views.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#if KDIST_ENABLE_CUSOLVER && defined(KOKKOS_ENABLE_CUDA)
#include <kdist/core/impl/cusolver_backend.hpp>
#endif

namespace kdist {

enum class InverseMethod {
  cholesky,  ///< potrf + potri (cuSOLVER from order 512: potrf + potrs on the identity), the default
  eigen      ///< syevd, then Q diag(1/(lambda + damping)) Q^T: slower, robust to clustered spectra
};

/// "cholesky", "eigen".
inline const char* to_string(InverseMethod m) {
  return m == InverseMethod::eigen ? "eigen" : "cholesky";
}

namespace impl {

/// Backend dispatch. Each backend enqueues its work on the instance and writes LAPACK's info
/// values into `info` (two ints in the workspace's memory space: stage 1, stage 2); the caller
/// reads them back once, with everything else it needs (InverseWorkspace::impl_read_status).
/// *_bytes() is the work space a call needs, taken from the workspace.
template <class ExecSpace, class T, class Enable = void>
struct DenseSolver {
  static_assert(sizeof(T) == 0, "kdist: no LAPACK backend for this execution space");
};

/// Host spaces: reference LAPACK interface (OpenBLAS here).
template <class ExecSpace, class T>
struct DenseSolver<ExecSpace, T,
                   std::enable_if_t<Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible>> {
  static constexpr const char* factor_stage = "potrf";
  static constexpr const char* invert_stage = "potri (trtri by halves, lauum)";
  static constexpr const char* eigen_stage = "syevd";
  /// From this order on the inverse goes through potrs (0: never; the host's potri is as fast).
  static constexpr int solve_from = 0;

  static std::size_t cholesky_inverse_bytes(const ExecSpace&, int, int) { return 0; }
  /// In place on the upper triangle of a column-major n x n matrix: info = {potrf, potri}.
  static void cholesky_inverse(const ExecSpace& exec, T* a, int n, int lda, void*, std::size_t, int* info) {
    compat::fence(exec, "kdist::spd_inverse: before LAPACK");
    info[0] = host::potrf<T>('U', n, a, lda);
    info[1] = info[0] == 0 ? host::potri_by_halves<T>(n, a, lda) : 0;
  }
  static std::size_t cholesky_factor_bytes(const ExecSpace&, int, int) { return 0; }
  /// In place on the upper triangle: a := R (a = R^T R); info = {potrf, 0}.
  static void cholesky_factor(const ExecSpace& exec, T* a, int n, int lda, void*, std::size_t, int* info) {
    compat::fence(exec, "kdist::cholesky_factor: before LAPACK");
    info[0] = host::potrf<T>('U', n, a, lda);
    info[1] = 0;
  }
  /// LAPACK's work array followed by its integer work array.
  static std::size_t syevd_bytes(const ExecSpace&, int n, int) {
    const host::SyevdWorkspace ws = host::syevd_workspace<T>('V', 'U', n);
    if (ws.lwork < 0)
      throw_invalid("kdist::symmetric_eigen",
                    "dimension " + std::to_string(n) + " needs a LAPACK workspace beyond int elements");
    return sizeof(T) * static_cast<std::size_t>(ws.lwork) +
           sizeof(int) * static_cast<std::size_t>(ws.liwork > 0 ? ws.liwork : 1);
  }
  /// In place: a := eigenvectors, w := eigenvalues (ascending); info = {syevd, 0}.
  static void syevd(const ExecSpace& exec, T* a, int n, int lda, T* w, void* scratch, std::size_t, int* info) {
    compat::fence(exec, "kdist::symmetric_eigen: before LAPACK");
    const host::SyevdWorkspace ws = host::syevd_workspace<T>('V', 'U', n);
    T* work = static_cast<T*>(scratch);
    int* iwork = reinterpret_cast<int*>(static_cast<char*>(scratch) + sizeof(T) * static_cast<std::size_t>(ws.lwork));
    info[0] = host::syevd<T>('V', 'U', n, a, lda, w, work, ws.lwork, iwork, ws.liwork);
    info[1] = 0;
  }
};

#if KDIST_ENABLE_CUSOLVER && defined(KOKKOS_ENABLE_CUDA)
/// CUDA: cuSOLVER on the instance's stream, asynchronous; devInfo stays on the device until the
/// caller's one read-back.
template <class T>
struct DenseSolver<Kokkos::Cuda, T, void> {
  static constexpr const char* factor_stage = "cusolverDn potrf";
  static constexpr const char* invert_stage = "cusolverDn potri";
  static constexpr const char* solve_stage = "cusolverDn potrs";
  static constexpr const char* eigen_stage = "cusolverDn syevd";
  /// potrf + potrs against the identity beat potri from order 512 on an H200 (1.1x at 512, 1.3x
  /// at 1024, 1.4-1.6x at 2048-8192; 0.9x at 256): docs/performance.md, "GPU kit".
  static constexpr int solve_from = 512;

  static std::size_t cholesky_inverse_bytes(const Kokkos::Cuda& exec, int n, int lda) {
    return cusolver::cholesky_inverse_workspace<T>(n, lda, exec.cuda_stream());
  }
  static void cholesky_inverse(const Kokkos::Cuda& exec, T* a, int n, int lda, void* scratch, std::size_t bytes,
                               int* info) {
    cusolver::cholesky_inverse<T>(a, n, lda, scratch, bytes, info, exec.cuda_stream());
  }
  static std::size_t cholesky_solve_bytes(const Kokkos::Cuda& exec, int n, int lda) {
    return cusolver::cholesky_solve_workspace<T>(n, lda, exec.cuda_stream());
  }
  /// b := a^-1 (b holds the identity on entry), a := its Cholesky factor: info = {potrf, potrs}.
  static void cholesky_solve(const Kokkos::Cuda& exec, T* a, int n, int lda, T* b, int ldb, void* scratch,
                             std::size_t bytes, int* info) {
    cusolver::cholesky_solve_inverse<T>(a, n, lda, b, ldb, scratch, bytes, info, exec.cuda_stream());
  }
  static std::size_t cholesky_factor_bytes(const Kokkos::Cuda& exec, int n, int lda) {
    return cusolver::cholesky_solve_workspace<T>(n, lda, exec.cuda_stream());
  }
  static void cholesky_factor(const Kokkos::Cuda& exec, T* a, int n, int lda, void* scratch, std::size_t bytes,
                              int* info) {
    cusolver::cholesky_factor<T>(a, n, lda, scratch, bytes, info, exec.cuda_stream());
  }
  static std::size_t syevd_bytes(const Kokkos::Cuda& exec, int n, int lda) {
    return cusolver::syevd_workspace<T>(n, lda, exec.cuda_stream());
  }
  static void syevd(const Kokkos::Cuda& exec, T* a, int n, int lda, T* w, void* scratch, std::size_t bytes, int* info) {
    cusolver::syevd<T>(a, n, lda, w, scratch, bytes, info, exec.cuda_stream());
  }
};
#endif

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

template <class WT, class T, class ExecSpace, class WsMem>
constexpr void static_check_workspace() {
  static_assert(std::is_same<WT, T>::value, "kdist: the workspace's value type must be the matrices' value type");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, WsMem>::accessible,
                "kdist: the workspace's memory space is not accessible from the execution space");
}

[[noreturn]] inline void throw_nonfinite(const char* func, long long n, double damping, long long bad,
                                         const std::string& label) {
  throw NumericalError(func, n, damping, 0,
                       "non-finite input (" + std::to_string(bad) + " NaN/Inf entries in '" + label + "')");
}

/// copy_upper_counting_nonfinite's device kernel, one thread per entry of the triangle.
template <class ExecSpace, class AV, class MV, class CV>
void copy_upper_counting_entries(const ExecSpace& exec, const char* label, const AV& A,
                                 typename MV::non_const_value_type gamma, const MV& M, const CV& count) {
  using T = typename MV::non_const_value_type;
  Kokkos::parallel_reduce(
      label, upper_entries(exec, static_cast<int>(A.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t k, long long& acc) {
        int i, j;
        upper_entry(k, i, j);
        const T a = A(i, j);
        M(i, j) = i == j ? a + gamma : a;
        acc += compat::isfinite(a) ? 0 : 1;
      },
      count);
}

/// One pass over A's upper triangle: M's := A's, plus gamma on the diagonal, while count() := the
/// number of NaN/Inf entries in it (OpenBLAS potrf may return info = 0 on a NaN). Neither A's nor
/// M's lower triangle is touched: every backend reads the upper one only. Enqueued.
template <class ExecSpace, class AV, class MV, class CV>
void copy_upper_counting_nonfinite(const ExecSpace& exec, const char* label, const AV& A,
                                   typename MV::non_const_value_type gamma, const MV& M, const CV& count) {
  using T = typename MV::non_const_value_type;
  const int n = static_cast<int>(A.extent(0));
  if constexpr (!runs_on_host<ExecSpace>()) {
    copy_upper_counting_entries(exec, label, A, gamma, M, count);
  } else {
    Kokkos::parallel_reduce(
        label, Kokkos::RangePolicy<ExecSpace>(exec, 0, n),
        KOKKOS_LAMBDA(const int j, long long& acc) {
          // Branch-free loops so the compiler vectorises the copy and the count.
          int col_bad = 0;
          for (int i = 0; i < j; ++i) {
            const T a = A(i, j);
            M(i, j) = a;
            col_bad += !compat::isfinite(a);
          }
          const T diag = A(j, j);
          M(j, j) = diag + gamma;
          col_bad += !compat::isfinite(diag);
          acc += col_bad;
        },
        count);
  }
}

/// M := I when count() > 0, so that no backend ever sees a NaN (OpenBLAS potrf may return
/// info = 0 on one; an iterative eigensolver need not stop on one). Enqueued: the count is only
/// read back, with the backend's info, after the backend ran.
template <class ExecSpace, class CV, class MV>
void identity_if_nonfinite(const ExecSpace& exec, const CV& count, const MV& M) {
  const int n = static_cast<int>(M.extent(0));
  using T = typename MV::non_const_value_type;
  if constexpr (!runs_on_host<ExecSpace>()) {
    Kokkos::parallel_for(
        "kdist::identity_if_nonfinite", entries<typename MV::array_layout>(exec, n, n),
        KOKKOS_LAMBDA(const int i, const int j) {
          if (count() != 0) M(i, j) = i == j ? T(1) : T(0);
        });
  } else {
    Kokkos::parallel_for(
        "kdist::identity_if_nonfinite", Kokkos::RangePolicy<ExecSpace>(exec, 0, n), KOKKOS_LAMBDA(const int j) {
          if (count() == 0) return;
          for (int i = 0; i < n; ++i) M(i, j) = i == j ? T(1) : T(0);
        });
  }
}

/// Enqueues the Cholesky inverse of A + gamma I into inv's upper triangle (potri's route) or into
/// all of inv (potrs' route, from Solver::solve_from on: the factor then lives in the workspace's
/// first matrix), counting A's NaN/Inf into the workspace. Returns the name of the second stage.
template <class ExecSpace, class AV, class IV, class Workspace>
const char* enqueue_cholesky_inverse(const ExecSpace& exec, const AV& A, typename IV::non_const_value_type gamma,
                                     const IV& inv, Workspace& ws) {
  using T = typename IV::non_const_value_type;
  using Solver = DenseSolver<ExecSpace, T>;
  const int n = static_cast<int>(A.extent(0));
  const bool by_solve = Solver::solve_from > 0 && n >= Solver::solve_from;
  // The matrix cuSOLVER / LAPACK factors in place: inv itself, or the workspace's for potrs.
  using Matrix = typename Workspace::matrix_type;  // inv is LayoutLeft and contiguous (checked)
  const Matrix M = by_solve ? ws.impl_matrix(exec, 0, n) : Matrix(inv.data(), n, n);
  const auto bad = ws.impl_nonfinite(exec);
  copy_upper_counting_nonfinite(exec, "kdist::spd_inverse::damp", A, gamma, M, bad);
  identity_if_nonfinite(exec, bad, M);
  const int ldm = static_cast<int>(M.stride(1));
  if constexpr (Solver::solve_from > 0) {
    if (by_solve) {
      Kokkos::parallel_for(
          "kdist::spd_inverse::identity", entries<typename IV::array_layout>(exec, n, n),
          KOKKOS_LAMBDA(const int i, const int j) { inv(i, j) = i == j ? T(1) : T(0); });
      const std::size_t bytes = Solver::cholesky_solve_bytes(exec, n, ldm);
      Solver::cholesky_solve(exec, M.data(), n, ldm, inv.data(), static_cast<int>(inv.stride(1)),
                             ws.impl_solver_scratch(exec, bytes), bytes, ws.impl_info(exec).data());
      return Solver::solve_stage;
    }
  }
  const std::size_t bytes = Solver::cholesky_inverse_bytes(exec, n, ldm);
  Solver::cholesky_inverse(exec, M.data(), n, ldm, ws.impl_solver_scratch(exec, bytes), bytes,
                           ws.impl_info(exec).data());
  return Solver::invert_stage;
}

/// Enqueues Q := A's upper triangle (counting NaN/Inf into the workspace), then syevd:
/// w := eigenvalues ascending, Q := eigenvectors. Nothing is read back.
template <class ExecSpace, class AV, class WV, class QV, class Workspace>
void enqueue_eigen(const ExecSpace& exec, const AV& A, const WV& w, const QV& Q, Workspace& ws) {
  using T = typename QV::non_const_value_type;
  const int n = static_cast<int>(A.extent(0));
  const auto bad = ws.impl_nonfinite(exec);
  copy_upper_counting_nonfinite(exec, "kdist::symmetric_eigen::copy", A, T(0), Q, bad);
  identity_if_nonfinite(exec, bad, Q);
  using Solver = DenseSolver<ExecSpace, T>;
  const int lda = static_cast<int>(Q.stride(1));
  const std::size_t bytes = Solver::syevd_bytes(exec, n, lda);
  Solver::syevd(exec, Q.data(), n, lda, w.data(), ws.impl_solver_scratch(exec, bytes), bytes,
                ws.impl_info(exec).data());
}

}  // namespace impl

/// eigenvalues := ascending eigenvalues of the symmetric matrix A, Q := orthonormal eigenvectors
/// (columns). Reads only A's upper triangle; never writes A. A, Q and eigenvalues must not share
/// storage. The workspace holds the backend's scratch (see InverseWorkspace).
template <class ExecSpace, class AV, class WV, class QV, class WT, class WsMem>
void symmetric_eigen(const ExecSpace& exec, const AV& A, const WV& eigenvalues, const QV& Q,
                     InverseWorkspace<WT, WsMem>& workspace) {
  constexpr const char* func = "kdist::symmetric_eigen";
  using T = typename QV::non_const_value_type;
  impl::static_check_workspace<WT, T, ExecSpace, WsMem>();
  impl::check_square_pair<ExecSpace>(func, A, Q);
  impl::static_check_view<ExecSpace, WV>();
  static_assert(compat::view_rank<WV>() == 1, "kdist: eigenvalues must be rank 1");
  static_assert(std::is_same<typename WV::value_type, T>::value, "kdist: eigenvalues must be non-const, of Q's type");
  const int n = static_cast<int>(A.extent(0));
  if (static_cast<int>(eigenvalues.extent(0)) != n)
    impl::throw_invalid(func, "eigenvalues " + impl::describe(eigenvalues) + " must have " + std::to_string(n) +
                                  " entries for " + impl::describe(A));
  impl::require_contiguous(func, eigenvalues);
  impl::require_disjoint(func, A, eigenvalues);
  impl::require_disjoint(func, Q, eigenvalues);
  Phase phase(func);
  if (n == 0) return;
  impl::enqueue_eigen(exec, A, eigenvalues, Q, workspace);
  const impl::SolverStatus st = workspace.impl_read_status(exec);
  if (st.nonfinite) impl::throw_nonfinite(func, n, 0.0, st.nonfinite, A.label());
  if (st.info[0] != 0)
    throw NumericalError(func, n, 0.0, st.info[0],
                         std::string(impl::DenseSolver<ExecSpace, T>::eigen_stage) + " did not converge");
}

/// inv := (A + damping I)^-1 for symmetric positive definite A, in full symmetric storage.
/// Reads only A's upper triangle; never writes A; A and inv must not share storage. Scratch
/// comes from `workspace`, which grows on demand; one synchronisation of `exec` per call.
template <class ExecSpace, class AV, class IV, class WT, class WsMem>
void spd_inverse(const ExecSpace& exec, const AV& A, double damping, const IV& inv,
                 InverseWorkspace<WT, WsMem>& workspace, InverseMethod method = InverseMethod::cholesky) {
  using T = typename IV::non_const_value_type;
  using Solver = impl::DenseSolver<ExecSpace, T>;
  impl::static_check_workspace<WT, T, ExecSpace, WsMem>();
  const char* func = method == InverseMethod::cholesky ? "kdist::spd_inverse(cholesky)" : "kdist::spd_inverse(eigen)";
  impl::check_square_pair<ExecSpace>(func, A, inv);
  Phase phase(func);
  const int n = static_cast<int>(A.extent(0));
  if (!std::isfinite(damping)) throw NumericalError(func, n, damping, 0, "non-finite damping");
  if (n == 0) return;
  const T gamma = static_cast<T>(damping);

  if (method == InverseMethod::cholesky) {
    const char* second_stage = impl::enqueue_cholesky_inverse(exec, A, gamma, inv, workspace);
    const impl::SolverStatus st = workspace.impl_read_status(exec);
    if (st.nonfinite) impl::throw_nonfinite(func, n, damping, st.nonfinite, A.label());
    for (int stage = 0; stage < 2; ++stage)
      if (st.info[stage] != 0)
        throw NumericalError(func, n, damping, st.info[stage],
                             std::string(stage == 0 ? Solver::factor_stage : second_stage) +
                                 ": matrix is not positive definite after damping (leading minor " +
                                 std::to_string(st.info[stage]) + ")");
    // potrs' columns are symmetric only to rounding: the upper triangle mirrored keeps every
    // inverse exactly symmetric, as the packed broadcast of a placed inverse assumes.
    mirror_upper_to_lower(exec, inv);
    return;
  }

  // Eigen method: inv = Q diag(1 / (lambda + damping)) Q^T, everything enqueued before the one
  // read-back; on failure the output is unspecified anyway.
  const auto Q = workspace.impl_matrix(exec, 0, n);
  const auto W = workspace.impl_matrix(exec, 1, n);
  const auto w = workspace.impl_eigenvalues(exec, n);
  impl::enqueue_eigen(exec, A, w, Q, workspace);
  if constexpr (!impl::runs_on_host<ExecSpace>())
    Kokkos::parallel_for(
        "kdist::spd_inverse::scale", impl::entries<typename std::decay_t<decltype(W)>::array_layout>(exec, n, n),
        KOKKOS_LAMBDA(const int i, const int j) { W(i, j) = Q(i, j) * (T(1) / (w(j) + gamma)); });
  else
    Kokkos::parallel_for(
        "kdist::spd_inverse::scale", Kokkos::RangePolicy<ExecSpace>(exec, 0, n), KOKKOS_LAMBDA(const int j) {
          const T s = T(1) / (w(j) + gamma);
          for (int i = 0; i < n; ++i) W(i, j) = Q(i, j) * s;
        });
  gemm(exec, "N", "T", T(1), W, Q, T(0), inv);
  const impl::SolverStatus st = workspace.impl_read_status(exec, w, gamma);
  if (st.nonfinite) impl::throw_nonfinite(func, n, damping, st.nonfinite, A.label());
  if (st.info[0] != 0)
    throw NumericalError(func, n, damping, st.info[0], std::string(Solver::eigen_stage) + " did not converge");
  // Eigenvalues come ascending. They are exact only to about n * eps * |lambda_max|: below that
  // the matrix is not numerically positive definite and its inverse would be noise.
  const T wmin = static_cast<T>(st.lowest);
  const T tol = static_cast<T>(n) * std::numeric_limits<T>::epsilon() * std::abs(static_cast<T>(st.highest));
  if (!(wmin > tol))
    throw NumericalError(func, n, damping, 0,
                         "matrix is not positive definite after damping (smallest eigenvalue + damping = " +
                             std::to_string(static_cast<double>(wmin)) +
                             ", not above the tolerance n eps |largest| = " + std::to_string(static_cast<double>(tol)) +
                             ")");
  mirror_upper_to_lower(exec, inv);
}

/// The same with a workspace made for this one call.
template <class ExecSpace, class AV, class IV>
void spd_inverse(const ExecSpace& exec, const AV& A, double damping, const IV& inv,
                 InverseMethod method = InverseMethod::cholesky) {
  InverseWorkspace<typename IV::non_const_value_type, typename IV::memory_space> workspace;
  spd_inverse(exec, A, damping, inv, workspace, method);
}
template <class ExecSpace, class AV, class WV, class QV>
void symmetric_eigen(const ExecSpace& exec, const AV& A, const WV& eigenvalues, const QV& Q) {
  InverseWorkspace<typename QV::non_const_value_type, typename QV::memory_space> workspace;
  symmetric_eigen(exec, A, eigenvalues, Q, workspace);
}

/// Overloads on the output view's default execution space.
template <class AV, class IV>
void spd_inverse(const AV& A, double damping, const IV& inv, InverseMethod method = InverseMethod::cholesky) {
  spd_inverse(typename IV::execution_space{}, A, damping, inv, method);
}
template <class AV, class IV, class WT, class WsMem>
void spd_inverse(const AV& A, double damping, const IV& inv, InverseWorkspace<WT, WsMem>& workspace,
                 InverseMethod method = InverseMethod::cholesky) {
  spd_inverse(typename IV::execution_space{}, A, damping, inv, workspace, method);
}
template <class AV, class WV, class QV>
void symmetric_eigen(const AV& A, const WV& eigenvalues, const QV& Q) {
  symmetric_eigen(typename QV::execution_space{}, A, eigenvalues, Q);
}

}  // namespace kdist
