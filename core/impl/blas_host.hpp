// Host BLAS entry points kdist calls directly (Kokkos Kernels 3.4 has no syrk, and its trsm takes
// no execution space instance). Column-major,
// Fortran conventions; float and double are instantiated in blas_host.cpp.
#pragma once

namespace kdist {
namespace impl {
namespace host {

/// C := alpha * op(A) op(A)^T + beta * C on the `uplo` triangle; op = A ('N') or A^T ('T').
template <class T>
void syrk(char uplo, char trans, int n, int k, T alpha, const T* A, int lda, T beta, T* C, int ldc);

/// B := alpha * op(A)^-1 B (side 'L') or alpha * B op(A)^-1 (side 'R'), A triangular (`uplo`),
/// op = A ('N') or A^T ('T'), non-unit diagonal; B is m x n.
template <class T>
void trsm(char side, char uplo, char transa, int m, int n, T alpha, const T* A, int lda, T* B, int ldb);

/// C := alpha * op(A) op(B) + beta * C (used by benchmarks as the dgemm/sgemm baseline).
template <class T>
void gemm(char transa, char transb, int m, int n, int k, T alpha, const T* A, int lda, const T* B, int ldb, T beta,
          T* C, int ldc);

}  // namespace host
}  // namespace impl
}  // namespace kdist
