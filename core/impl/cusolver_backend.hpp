// cuSOLVER / cuBLAS calls behind kdist's SPD inverse, eigendecomposition and syrk on CUDA.
// This interface takes device pointers, a cudaStream_t and a caller-provided workspace (with a
// size query) and includes no Kokkos, so it compiles and links wherever the CUDA toolkit is,
// with or without a CUDA Kokkos (KDIST_CUDA_COMPILE_CHECK), and perf/gpu_smoke uses it directly.
// The Kokkos side (CUDA builds) owns the workspace views and passes the Kokkos stream.
//
// Every call is asynchronous: it enqueues its work on `stream` and returns; LAPACK's info values
// stay in device memory (`dev_info`) until the caller copies them back, together with whatever
// else it needs, and synchronises once (kdist::spd_inverse reads them with the NaN/Inf count and
// the extreme eigenvalues). The size queries and the handle binding do not synchronise.
// Argument errors (a workspace smaller than its query) throw InvalidArgument; failed cuSOLVER /
// cuBLAS / CUDA calls throw BackendError with the expression, file, line and status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace kdist {
namespace impl {
namespace cusolver {

/// Bytes of device workspace cholesky_inverse needs for an n x n matrix (lda >= n).
template <class T>
std::size_t cholesky_inverse_workspace(int n, int lda, cudaStream_t stream);

/// In place: A (upper triangle, column-major, device) := inverse via potrf + potri, enqueued on
/// `stream`. `dev_info` is two device ints: [0] := potrf's info (0 = success, k > 0 = the
/// leading minor of order k is not positive definite), [1] := potri's. potri runs whatever potrf
/// found, so read [0] first: when it is not 0, A and [1] are meaningless.
template <class T>
void cholesky_inverse(T* A, int n, int lda, void* workspace, std::size_t workspace_bytes, int* dev_info,
                      cudaStream_t stream);

/// Bytes of device workspace cholesky_solve_inverse needs (potrf's; potrs takes none).
template <class T>
std::size_t cholesky_solve_workspace(int n, int lda, cudaStream_t stream);

/// B := A^-1 in full, through potrf and potrs with B's n columns as right-hand sides: B must hold
/// the identity on entry (ldb >= n); A (upper triangle, column-major) := its Cholesky factor.
/// dev_info[0] := potrf's info, [1] := potrs'. Enqueued on `stream`. The alternative to
/// cholesky_inverse's potri (trtri + lauum, many small steps): two triangular solves with n
/// right-hand sides, gemm-rich; gpu_smoke times the two side by side.
template <class T>
void cholesky_solve_inverse(T* A, int n, int lda, T* B, int ldb, void* workspace, std::size_t workspace_bytes,
                            int* dev_info, cudaStream_t stream);

/// In place: A (upper triangle, column-major) := R, its Cholesky factor (A = R^T R), by potrf
/// alone; dev_info[0] := potrf's info, dev_info[1] := 0. Workspace: cholesky_solve_workspace's.
/// Enqueued on `stream`.
template <class T>
void cholesky_factor(T* A, int n, int lda, void* workspace, std::size_t workspace_bytes, int* dev_info,
                     cudaStream_t stream);

/// B := alpha op(A)^-1 B (side 'L') or alpha B op(A)^-1 (side 'R'), A upper triangular with a
/// non-unit diagonal, op = A ('N') or A^T ('T'), B m x n; cuBLAS on `stream`. Async.
template <class T>
void trsm(char side, char transa, int m, int n, T alpha, const T* A, int lda, T* B, int ldb, cudaStream_t stream);

/// Bytes of device workspace syevd needs (eigenvalues and eigenvectors, upper triangle).
template <class T>
std::size_t syevd_workspace(int n, int lda, cudaStream_t stream);

/// In place: A := eigenvectors (columns), w := eigenvalues ascending, dev_info[0] := info (one
/// device int). Enqueued on `stream`.
template <class T>
void syevd(T* A, int n, int lda, T* w, void* workspace, std::size_t workspace_bytes, int* dev_info,
           cudaStream_t stream);

/// C (upper) := alpha op(A) op(A)^T + beta C; trans 'N' (A is n x k) or 'T' (A is k x n). Async.
template <class T>
void syrk(char trans, int n, int k, T alpha, const T* A, int lda, T beta, T* C, int ldc, cudaStream_t stream);

}  // namespace cusolver
}  // namespace impl
}  // namespace kdist
