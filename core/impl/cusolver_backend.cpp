#include "cusolver_backend.hpp"

#include <kdist/core/error.hpp>

#include <cublas_v2.h>
#include <cusolverDn.h>

#include <mutex>
#include <sstream>
#include <string>

// Every cuSOLVER/cuBLAS/CUDA status is checked: the expression, file, line and status code go
// into the exception so a failure on a remote GPU node is diagnosable from the log alone.
#define KDIST_CUDA_STATUS_CHECK(kind, expr, ok)                                                        \
  do {                                                                                                 \
    const auto kdist_status_ = (expr);                                                                 \
    if (kdist_status_ != (ok))                                                                         \
      ::kdist::impl::cusolver::fail(kind, #expr, __FILE__, __LINE__, static_cast<int>(kdist_status_)); \
  } while (0)
#define KDIST_CUSOLVER_CHECK(expr) KDIST_CUDA_STATUS_CHECK("cuSOLVER", expr, CUSOLVER_STATUS_SUCCESS)
#define KDIST_CUBLAS_CHECK(expr) KDIST_CUDA_STATUS_CHECK("cuBLAS", expr, CUBLAS_STATUS_SUCCESS)
#define KDIST_CUDA_CHECK(expr) KDIST_CUDA_STATUS_CHECK("CUDA", expr, cudaSuccess)

namespace kdist {
namespace impl {
namespace cusolver {

[[noreturn]] void fail(const char* kind, const char* expr, const char* file, int line, int status) {
  std::ostringstream os;
  os << kind << " call failed: " << expr << " returned " << status << " at " << file << ":" << line;
  throw BackendError(os.str());
}

namespace {

// Lazily created handles, shared by the process; each call binds them to the caller's stream.
struct Handles {
  cusolverDnHandle_t solver = nullptr;
  cublasHandle_t blas = nullptr;
  std::mutex mutex;
};
Handles& handles() {
  static Handles h;
  static std::once_flag once;
  std::call_once(once, [] {
    KDIST_CUSOLVER_CHECK(cusolverDnCreate(&h.solver));
    KDIST_CUBLAS_CHECK(cublasCreate(&h.blas));
  });
  return h;
}

/// The shared solver handle, locked and bound to `stream` for one call's lifetime (the mutex is
/// not recursive: workspace checks come before it).
class BoundSolver {
 public:
  explicit BoundSolver(cudaStream_t stream) : h_(handles()), lock_(h_.mutex) {
    KDIST_CUSOLVER_CHECK(cusolverDnSetStream(h_.solver, stream));
  }
  cusolverDnHandle_t get() const { return h_.solver; }

 private:
  Handles& h_;
  std::lock_guard<std::mutex> lock_;
};

cublasFillMode_t upper() {
  return CUBLAS_FILL_MODE_UPPER;
}

void check_workspace(std::size_t have, std::size_t need, const char* op) {
  if (have < need) {
    std::ostringstream os;
    os << op << ": workspace of " << have << " bytes is smaller than the " << need << " bytes required";
    throw InvalidArgument(os.str());
  }
}

// Typed wrappers, so the templates below are written once.
cusolverStatus_t potrf_buf(cusolverDnHandle_t h, int n, float* A, int lda, int* lw) {
  return cusolverDnSpotrf_bufferSize(h, upper(), n, A, lda, lw);
}
cusolverStatus_t potrf_buf(cusolverDnHandle_t h, int n, double* A, int lda, int* lw) {
  return cusolverDnDpotrf_bufferSize(h, upper(), n, A, lda, lw);
}
cusolverStatus_t potri_buf(cusolverDnHandle_t h, int n, float* A, int lda, int* lw) {
  return cusolverDnSpotri_bufferSize(h, upper(), n, A, lda, lw);
}
cusolverStatus_t potri_buf(cusolverDnHandle_t h, int n, double* A, int lda, int* lw) {
  return cusolverDnDpotri_bufferSize(h, upper(), n, A, lda, lw);
}
cusolverStatus_t potrf(cusolverDnHandle_t h, int n, float* A, int lda, float* w, int lw, int* info) {
  return cusolverDnSpotrf(h, upper(), n, A, lda, w, lw, info);
}
cusolverStatus_t potrf(cusolverDnHandle_t h, int n, double* A, int lda, double* w, int lw, int* info) {
  return cusolverDnDpotrf(h, upper(), n, A, lda, w, lw, info);
}
cusolverStatus_t potri(cusolverDnHandle_t h, int n, float* A, int lda, float* w, int lw, int* info) {
  return cusolverDnSpotri(h, upper(), n, A, lda, w, lw, info);
}
cusolverStatus_t potri(cusolverDnHandle_t h, int n, double* A, int lda, double* w, int lw, int* info) {
  return cusolverDnDpotri(h, upper(), n, A, lda, w, lw, info);
}
cusolverStatus_t potrs(cusolverDnHandle_t h, int n, const float* A, int lda, float* B, int ldb, int* info) {
  return cusolverDnSpotrs(h, upper(), n, n, A, lda, B, ldb, info);
}
cusolverStatus_t potrs(cusolverDnHandle_t h, int n, const double* A, int lda, double* B, int ldb, int* info) {
  return cusolverDnDpotrs(h, upper(), n, n, A, lda, B, ldb, info);
}
cusolverStatus_t syevd_buf(cusolverDnHandle_t h, int n, const float* A, int lda, const float* w, int* lw) {
  return cusolverDnSsyevd_bufferSize(h, CUSOLVER_EIG_MODE_VECTOR, upper(), n, A, lda, w, lw);
}
cusolverStatus_t syevd_buf(cusolverDnHandle_t h, int n, const double* A, int lda, const double* w, int* lw) {
  return cusolverDnDsyevd_bufferSize(h, CUSOLVER_EIG_MODE_VECTOR, upper(), n, A, lda, w, lw);
}
cusolverStatus_t syevd_run(cusolverDnHandle_t h, int n, float* A, int lda, float* w, float* wk, int lw, int* info) {
  return cusolverDnSsyevd(h, CUSOLVER_EIG_MODE_VECTOR, upper(), n, A, lda, w, wk, lw, info);
}
cusolverStatus_t syevd_run(cusolverDnHandle_t h, int n, double* A, int lda, double* w, double* wk, int lw, int* info) {
  return cusolverDnDsyevd(h, CUSOLVER_EIG_MODE_VECTOR, upper(), n, A, lda, w, wk, lw, info);
}
cublasStatus_t syrk_run(cublasHandle_t h, cublasOperation_t op, int n, int k, const float* alpha, const float* A,
                        int lda, const float* beta, float* C, int ldc) {
  return cublasSsyrk(h, upper(), op, n, k, alpha, A, lda, beta, C, ldc);
}
cublasStatus_t syrk_run(cublasHandle_t h, cublasOperation_t op, int n, int k, const double* alpha, const double* A,
                        int lda, const double* beta, double* C, int ldc) {
  return cublasDsyrk(h, upper(), op, n, k, alpha, A, lda, beta, C, ldc);
}

cublasStatus_t trsm_run(cublasHandle_t h, cublasSideMode_t side, cublasOperation_t op, int m, int n, const float* alpha,
                        const float* A, int lda, float* B, int ldb) {
  return cublasStrsm(h, side, upper(), op, CUBLAS_DIAG_NON_UNIT, m, n, alpha, A, lda, B, ldb);
}
cublasStatus_t trsm_run(cublasHandle_t h, cublasSideMode_t side, cublasOperation_t op, int m, int n,
                        const double* alpha, const double* A, int lda, double* B, int ldb) {
  return cublasDtrsm(h, side, upper(), op, CUBLAS_DIAG_NON_UNIT, m, n, alpha, A, lda, B, ldb);
}

}  // namespace

template <class T>
std::size_t cholesky_inverse_workspace(int n, int lda, cudaStream_t stream) {
  const BoundSolver s(stream);
  int lw_f = 0, lw_i = 0;
  KDIST_CUSOLVER_CHECK(potrf_buf(s.get(), n, static_cast<T*>(nullptr), lda, &lw_f));
  KDIST_CUSOLVER_CHECK(potri_buf(s.get(), n, static_cast<T*>(nullptr), lda, &lw_i));
  return static_cast<std::size_t>(lw_f > lw_i ? lw_f : lw_i) * sizeof(T);
}

template <class T>
void cholesky_inverse(T* A, int n, int lda, void* workspace, std::size_t bytes, int* dev_info, cudaStream_t stream) {
  check_workspace(bytes, cholesky_inverse_workspace<T>(n, lda, stream), "kdist::cusolver::cholesky_inverse");
  const BoundSolver s(stream);
  const int lw = static_cast<int>(bytes / sizeof(T));
  T* work = static_cast<T*>(workspace);
  KDIST_CUSOLVER_CHECK(potrf(s.get(), n, A, lda, work, lw, dev_info));
  KDIST_CUSOLVER_CHECK(potri(s.get(), n, A, lda, work, lw, dev_info + 1));
}

template <class T>
std::size_t cholesky_solve_workspace(int n, int lda, cudaStream_t stream) {
  const BoundSolver s(stream);
  int lw = 0;
  KDIST_CUSOLVER_CHECK(potrf_buf(s.get(), n, static_cast<T*>(nullptr), lda, &lw));
  return static_cast<std::size_t>(lw) * sizeof(T);
}

template <class T>
void cholesky_solve_inverse(T* A, int n, int lda, T* B, int ldb, void* workspace, std::size_t bytes, int* dev_info,
                            cudaStream_t stream) {
  check_workspace(bytes, cholesky_solve_workspace<T>(n, lda, stream), "kdist::cusolver::cholesky_solve_inverse");
  const BoundSolver s(stream);
  KDIST_CUSOLVER_CHECK(
      potrf(s.get(), n, A, lda, static_cast<T*>(workspace), static_cast<int>(bytes / sizeof(T)), dev_info));
  KDIST_CUSOLVER_CHECK(potrs(s.get(), n, A, lda, B, ldb, dev_info + 1));
}

template <class T>
void cholesky_factor(T* A, int n, int lda, void* workspace, std::size_t bytes, int* dev_info, cudaStream_t stream) {
  check_workspace(bytes, cholesky_solve_workspace<T>(n, lda, stream), "kdist::cusolver::cholesky_factor");
  const BoundSolver s(stream);
  KDIST_CUDA_CHECK(cudaMemsetAsync(dev_info + 1, 0, sizeof(int), stream));
  KDIST_CUSOLVER_CHECK(
      potrf(s.get(), n, A, lda, static_cast<T*>(workspace), static_cast<int>(bytes / sizeof(T)), dev_info));
}

template <class T>
std::size_t syevd_workspace(int n, int lda, cudaStream_t stream) {
  const BoundSolver s(stream);
  int lw = 0;
  KDIST_CUSOLVER_CHECK(syevd_buf(s.get(), n, static_cast<const T*>(nullptr), lda, static_cast<const T*>(nullptr), &lw));
  return static_cast<std::size_t>(lw) * sizeof(T);
}

template <class T>
void syevd(T* A, int n, int lda, T* w, void* workspace, std::size_t bytes, int* dev_info, cudaStream_t stream) {
  check_workspace(bytes, syevd_workspace<T>(n, lda, stream), "kdist::cusolver::syevd");
  const BoundSolver s(stream);
  KDIST_CUSOLVER_CHECK(
      syevd_run(s.get(), n, A, lda, w, static_cast<T*>(workspace), static_cast<int>(bytes / sizeof(T)), dev_info));
}

template <class T>
void syrk(char trans, int n, int k, T alpha, const T* A, int lda, T beta, T* C, int ldc, cudaStream_t stream) {
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  KDIST_CUBLAS_CHECK(cublasSetStream(h.blas, stream));
  const cublasOperation_t op = (trans == 'T' || trans == 't') ? CUBLAS_OP_T : CUBLAS_OP_N;
  KDIST_CUBLAS_CHECK(syrk_run(h.blas, op, n, k, &alpha, A, lda, &beta, C, ldc));
}

template <class T>
void trsm(char side, char transa, int m, int n, T alpha, const T* A, int lda, T* B, int ldb, cudaStream_t stream) {
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  KDIST_CUBLAS_CHECK(cublasSetStream(h.blas, stream));
  const cublasSideMode_t sm = (side == 'R' || side == 'r') ? CUBLAS_SIDE_RIGHT : CUBLAS_SIDE_LEFT;
  const cublasOperation_t op = (transa == 'T' || transa == 't') ? CUBLAS_OP_T : CUBLAS_OP_N;
  KDIST_CUBLAS_CHECK(trsm_run(h.blas, sm, op, m, n, &alpha, A, lda, B, ldb));
}

#define KDIST_INSTANTIATE_CUSOLVER(T)                                                                     \
  template std::size_t cholesky_inverse_workspace<T>(int, int, cudaStream_t);                             \
  template void cholesky_inverse<T>(T*, int, int, void*, std::size_t, int*, cudaStream_t);                \
  template std::size_t cholesky_solve_workspace<T>(int, int, cudaStream_t);                               \
  template void cholesky_solve_inverse<T>(T*, int, int, T*, int, void*, std::size_t, int*, cudaStream_t); \
  template std::size_t syevd_workspace<T>(int, int, cudaStream_t);                                        \
  template void syevd<T>(T*, int, int, T*, void*, std::size_t, int*, cudaStream_t);                       \
  template void cholesky_factor<T>(T*, int, int, void*, std::size_t, int*, cudaStream_t);                 \
  template void syrk<T>(char, int, int, T, const T*, int, T, T*, int, cudaStream_t);                      \
  template void trsm<T>(char, char, int, int, T, const T*, int, T*, int, cudaStream_t);
KDIST_INSTANTIATE_CUSOLVER(float)
KDIST_INSTANTIATE_CUSOLVER(double)
#undef KDIST_INSTANTIATE_CUSOLVER

}  // namespace cusolver
}  // namespace impl
}  // namespace kdist
