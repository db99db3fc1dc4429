#include "lapack_host.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

extern "C" {
void spotrf_(const char*, const int*, float*, const int*, int*);
void dpotrf_(const char*, const int*, double*, const int*, int*);
void spotri_(const char*, const int*, float*, const int*, int*);
void dpotri_(const char*, const int*, double*, const int*, int*);
void strtri_(const char*, const char*, const int*, float*, const int*, int*);
void dtrtri_(const char*, const char*, const int*, double*, const int*, int*);
void slauum_(const char*, const int*, float*, const int*, int*);
void dlauum_(const char*, const int*, double*, const int*, int*);
void strmm_(const char*, const char*, const char*, const char*, const int*, const int*, const float*, const float*,
            const int*, float*, const int*);
void dtrmm_(const char*, const char*, const char*, const char*, const int*, const int*, const double*, const double*,
            const int*, double*, const int*);
void ssyevd_(const char*, const char*, const int*, float*, const int*, float*, float*, const int*, int*, const int*,
             int*);
void dsyevd_(const char*, const char*, const int*, double*, const int*, double*, double*, const int*, int*, const int*,
             int*);
}

namespace kdist {
namespace impl {
namespace host {

template <>
int potrf<float>(char uplo, int n, float* A, int lda) {
  int info = 0;
  spotrf_(&uplo, &n, A, &lda, &info);
  return info;
}
template <>
int potrf<double>(char uplo, int n, double* A, int lda) {
  int info = 0;
  dpotrf_(&uplo, &n, A, &lda, &info);
  return info;
}
template <>
int potri<float>(char uplo, int n, float* A, int lda) {
  int info = 0;
  spotri_(&uplo, &n, A, &lda, &info);
  return info;
}
template <>
int potri<double>(char uplo, int n, double* A, int lda) {
  int info = 0;
  dpotri_(&uplo, &n, A, &lda, &info);
  return info;
}

namespace {

void trtri(int n, float* A, int lda, int* info) {
  strtri_("U", "N", &n, A, &lda, info);
}
void trtri(int n, double* A, int lda, int* info) {
  dtrtri_("U", "N", &n, A, &lda, info);
}
void lauum(int n, float* A, int lda, int* info) {
  slauum_("U", &n, A, &lda, info);
}
void lauum(int n, double* A, int lda, int* info) {
  dlauum_("U", &n, A, &lda, info);
}
void trmm(char side, int m, int n, float alpha, const float* A, int lda, float* B, int ldb) {
  strmm_(&side, "U", "N", "N", &m, &n, &alpha, A, &lda, B, &ldb);
}
void trmm(char side, int m, int n, double alpha, const double* A, int lda, double* B, int ldb) {
  dtrmm_(&side, "U", "N", "N", &m, &n, &alpha, A, &lda, B, &ldb);
}

// R^-1 in place (upper, non-unit): [R11 R12; 0 R22]^-1 = [R11^-1, -R11^-1 R12 R22^-1; 0, R22^-1].
// Returns trtri's info (the first zero diagonal, counted from R's start).
template <class T>
int triangular_inverse(int n, T* A, int lda) {
  int info = 0;
  if (n <= 128) {
    trtri(n, A, lda, &info);
    return info;
  }
  const int n1 = n / 2, n2 = n - n1;
  T* const R12 = A + static_cast<std::size_t>(n1) * static_cast<std::size_t>(lda);
  T* const R22 = R12 + n1;
  if ((info = triangular_inverse(n1, A, lda)) != 0) return info;
  if ((info = triangular_inverse(n2, R22, lda)) != 0) return info > 0 ? info + n1 : info;
  trmm('L', n1, n2, T(1), A, lda, R12, lda);
  trmm('R', n1, n2, T(-1), R22, lda, R12, lda);
  return 0;
}

}  // namespace

template <class T>
int potri_by_halves(int n, T* A, int lda) {
  int info = triangular_inverse(n, A, lda);
  if (info == 0) lauum(n, A, lda, &info);
  return info;
}
template int potri_by_halves<float>(int, float*, int);
template int potri_by_halves<double>(int, double*, int);

namespace {
// The query returns LWORK as a float: above 2^24 it is rounded, possibly below the minimum
// (n = 8235: 135679856 against 1 + 6n + 2n^2 = 135679861, and ssyevd then refuses with info -8).
// Take the larger of the query, rounded up, and the documented minimum (LAPACK's ?syevd).
SyevdWorkspace at_least_minimum(char jobz, int n, double lwork_query, int liwork_query) {
  const bool vectors = jobz == 'V' || jobz == 'v';
  const long long nn = n;
  const long long min_lwork = n <= 1 ? 1 : vectors ? 1 + 6 * nn + 2 * nn * nn : 2 * nn + 1;
  const long long min_liwork = n <= 1 || !vectors ? 1 : 3 + 5 * nn;
  const long long lwork = std::max(static_cast<long long>(std::ceil(lwork_query)), min_lwork);
  const long long liwork = std::max(static_cast<long long>(liwork_query), min_liwork);
  // No kdist error here: this file also links into the Kokkos-free gpu_smoke.
  if (lwork > std::numeric_limits<int>::max() || liwork > std::numeric_limits<int>::max()) return {-1, -1};
  return {static_cast<int>(lwork), static_cast<int>(liwork)};
}
}  // namespace

template <>
SyevdWorkspace syevd_workspace<float>(char jobz, char uplo, int n) {
  float wq = 0, aq = 0, w = 0;
  int iq = 0, lw = -1, liw = -1, info = 0, lda = n > 0 ? n : 1;
  ssyevd_(&jobz, &uplo, &n, &aq, &lda, &w, &wq, &lw, &iq, &liw, &info);
  return at_least_minimum(jobz, n, wq, iq);
}
template <>
SyevdWorkspace syevd_workspace<double>(char jobz, char uplo, int n) {
  double wq = 0, aq = 0, w = 0;
  int iq = 0, lw = -1, liw = -1, info = 0, lda = n > 0 ? n : 1;
  dsyevd_(&jobz, &uplo, &n, &aq, &lda, &w, &wq, &lw, &iq, &liw, &info);
  return at_least_minimum(jobz, n, wq, iq);
}
template <>
int syevd<float>(char jobz, char uplo, int n, float* A, int lda, float* w, float* work, int lwork, int* iwork,
                 int liwork) {
  int info = 0;
  ssyevd_(&jobz, &uplo, &n, A, &lda, w, work, &lwork, iwork, &liwork, &info);
  return info;
}
template <>
int syevd<double>(char jobz, char uplo, int n, double* A, int lda, double* w, double* work, int lwork, int* iwork,
                  int liwork) {
  int info = 0;
  dsyevd_(&jobz, &uplo, &n, A, &lda, w, work, &lwork, iwork, &liwork, &info);
  return info;
}

}  // namespace host
}  // namespace impl
}  // namespace kdist
