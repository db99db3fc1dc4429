#include "lapack_host.hpp"

extern "C" {
void spotrf_(const char*, const int*, float*, const int*, int*);
void dpotrf_(const char*, const int*, double*, const int*, int*);
void spotri_(const char*, const int*, float*, const int*, int*);
void dpotri_(const char*, const int*, double*, const int*, int*);
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

template <>
SyevdWorkspace syevd_workspace<float>(char jobz, char uplo, int n) {
  float wq = 0, aq = 0, w = 0;
  int iq = 0, lw = -1, liw = -1, info = 0, lda = n > 0 ? n : 1;
  ssyevd_(&jobz, &uplo, &n, &aq, &lda, &w, &wq, &lw, &iq, &liw, &info);
  return {static_cast<int>(wq) + 1, iq};
}
template <>
SyevdWorkspace syevd_workspace<double>(char jobz, char uplo, int n) {
  double wq = 0, aq = 0, w = 0;
  int iq = 0, lw = -1, liw = -1, info = 0, lda = n > 0 ? n : 1;
  dsyevd_(&jobz, &uplo, &n, &aq, &lda, &w, &wq, &lw, &iq, &liw, &info);
  return {static_cast<int>(wq) + 1, iq};
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
