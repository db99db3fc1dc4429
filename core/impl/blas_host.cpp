#include "blas_host.hpp"

extern "C" {
void ssyrk_(const char*, const char*, const int*, const int*, const float*, const float*, const int*, const float*,
            float*, const int*);
void dsyrk_(const char*, const char*, const int*, const int*, const double*, const double*, const int*, const double*,
            double*, const int*);
void strsm_(const char*, const char*, const char*, const char*, const int*, const int*, const float*, const float*,
            const int*, float*, const int*);
void dtrsm_(const char*, const char*, const char*, const char*, const int*, const int*, const double*, const double*,
            const int*, double*, const int*);
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*);
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*, const int*,
            const double*, const int*, const double*, double*, const int*);
}

namespace kdist {
namespace impl {
namespace host {

template <>
void syrk<float>(char uplo, char trans, int n, int k, float alpha, const float* A, int lda, float beta, float* C,
                 int ldc) {
  ssyrk_(&uplo, &trans, &n, &k, &alpha, A, &lda, &beta, C, &ldc);
}
template <>
void syrk<double>(char uplo, char trans, int n, int k, double alpha, const double* A, int lda, double beta, double* C,
                  int ldc) {
  dsyrk_(&uplo, &trans, &n, &k, &alpha, A, &lda, &beta, C, &ldc);
}
template <>
void trsm<float>(char side, char uplo, char transa, int m, int n, float alpha, const float* A, int lda, float* B,
                 int ldb) {
  const char diag = 'N';
  strsm_(&side, &uplo, &transa, &diag, &m, &n, &alpha, A, &lda, B, &ldb);
}
template <>
void trsm<double>(char side, char uplo, char transa, int m, int n, double alpha, const double* A, int lda, double* B,
                  int ldb) {
  const char diag = 'N';
  dtrsm_(&side, &uplo, &transa, &diag, &m, &n, &alpha, A, &lda, B, &ldb);
}
template <>
void gemm<float>(char ta, char tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
                 float beta, float* C, int ldc) {
  sgemm_(&ta, &tb, &m, &n, &k, &alpha, A, &lda, B, &ldb, &beta, C, &ldc);
}
template <>
void gemm<double>(char ta, char tb, int m, int n, int k, double alpha, const double* A, int lda, const double* B,
                  int ldb, double beta, double* C, int ldc) {
  dgemm_(&ta, &tb, &m, &n, &k, &alpha, A, &lda, B, &ldb, &beta, C, &ldc);
}

}  // namespace host
}  // namespace impl
}  // namespace kdist
