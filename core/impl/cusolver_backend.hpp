// cuSOLVER / cuBLAS calls behind kdist's SPD inverse, eigendecomposition and syrk on CUDA.
// This interface takes device pointers, a cudaStream_t and a caller-provided workspace (with a
// size query) and includes no Kokkos, so it compiles and links wherever the CUDA toolkit is,
// with or without a CUDA Kokkos (KDIST_CUDA_COMPILE_CHECK), and perf/gpu_smoke uses it directly.
// The Kokkos side (CUDA builds) owns the workspace views and passes the Kokkos stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace kdist {
namespace impl {
namespace cusolver {

/// Bytes of device workspace cholesky_inverse needs for an n x n matrix (lda >= n).
template <class T>
std::size_t cholesky_inverse_workspace(int n, int lda, cudaStream_t stream);

/// In place: A (upper triangle, column-major, device) := inverse via potrf + potri. Enqueued on
/// `stream`; synchronises the stream to read devInfo and returns it (0 = success, > 0 = the
/// leading minor of that order is not positive definite). `dev_info` is one device int.
template <class T>
int cholesky_inverse(T* A, int n, int lda, void* workspace, std::size_t workspace_bytes, int* dev_info,
                     cudaStream_t stream);

/// Bytes of device workspace syevd needs (eigenvalues and eigenvectors, upper triangle).
template <class T>
std::size_t syevd_workspace(int n, int lda, cudaStream_t stream);

/// In place: A := eigenvectors (columns), w := eigenvalues ascending. Returns devInfo.
template <class T>
int syevd(T* A, int n, int lda, T* w, void* workspace, std::size_t workspace_bytes, int* dev_info, cudaStream_t stream);

/// C (upper) := alpha op(A) op(A)^T + beta C; trans 'N' (A is n x k) or 'T' (A is k x n). Async.
template <class T>
void syrk(char trans, int n, int k, T alpha, const T* A, int lda, T beta, T* C, int ldc, cudaStream_t stream);

}  // namespace cusolver
}  // namespace impl
}  // namespace kdist
