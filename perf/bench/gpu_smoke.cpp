// GPU smoke test, run when a GPU machine is lent (it only compiles and links elsewhere): inverts
// random SPD matrices with kdist's cuSOLVER backend (potrf + potri, and the potrf + potrs
// alternative with identity right-hand sides) and with host LAPACK, compares them and times all
// three for d = 256 ... 8192, checks potrf's info on an indefinite matrix, and checks syevd.
// Needs no Kokkos. The last column, potri_s / potrs_s, says which backend route is faster.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "../../core/impl/blas_host.hpp"
#include "../../core/impl/cusolver_backend.hpp"
#include "../../core/impl/lapack_host.hpp"
#if KDIST_COMPILE_CHECK_NCCL
#include "../../comm/impl/nccl_backend.hpp"
#endif

namespace cs = kdist::impl::cusolver;
namespace host = kdist::impl::host;

#define SMOKE_CUDA(expr)                                                                                  \
  do {                                                                                                    \
    cudaError_t e_ = (expr);                                                                              \
    if (e_ != cudaSuccess) {                                                                              \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 2;                                                                                           \
    }                                                                                                     \
  } while (0)

template <class T>
int smoke(int d) {
  std::vector<T> B(static_cast<std::size_t>(d) * d), A(B.size()), ref(B.size()), got(B.size());
  std::mt19937_64 rng(d);
  std::normal_distribution<double> g;
  for (auto& x : B) x = static_cast<T>(g(rng));
  host::syrk<T>('U', 'N', d, d, T(1) / d, B.data(), d, T(0), A.data(), d);
  for (int i = 0; i < d; ++i) A[static_cast<std::size_t>(i) * d + i] += T(1);
  ref = A;
  auto t0 = std::chrono::steady_clock::now();
  if (host::potrf<T>('U', d, ref.data(), d) || host::potri<T>('U', d, ref.data(), d)) return 3;
  const double t_cpu = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  cudaStream_t stream;
  SMOKE_CUDA(cudaStreamCreate(&stream));
  T* dA = nullptr;
  int* dinfo = nullptr;
  void* ws = nullptr;
  SMOKE_CUDA(cudaMalloc(&dA, sizeof(T) * A.size()));
  SMOKE_CUDA(cudaMalloc(&dinfo, 2 * sizeof(int)));  // potrf's info, potri's info
  const std::size_t bytes = cs::cholesky_inverse_workspace<T>(d, d, stream);
  SMOKE_CUDA(cudaMalloc(&ws, bytes));
  double t_gpu = 1e30;
  int info[2] = {0, 0};
  for (int rep = 0; rep < 3; ++rep) {  // first repeat includes handle creation
    SMOKE_CUDA(cudaMemcpyAsync(dA, A.data(), sizeof(T) * A.size(), cudaMemcpyHostToDevice, stream));
    SMOKE_CUDA(cudaStreamSynchronize(stream));
    t0 = std::chrono::steady_clock::now();
    cs::cholesky_inverse<T>(dA, d, d, ws, bytes, dinfo, stream);  // asynchronous: one read-back below
    SMOKE_CUDA(cudaMemcpyAsync(info, dinfo, sizeof(info), cudaMemcpyDeviceToHost, stream));
    SMOKE_CUDA(cudaStreamSynchronize(stream));
    t_gpu = std::min(t_gpu, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double mx = 0;
  for (int j = 0; j < d; ++j)
    for (int i = 0; i <= j; ++i) mx = std::max(mx, std::abs(double(ref[static_cast<std::size_t>(j) * d + i])));
  // max |got - ref| over the upper triangle of the device matrix at `src`.
  const auto upper_diff = [&](const T* src, double& diff) {
    if (cudaMemcpy(got.data(), src, sizeof(T) * A.size(), cudaMemcpyDeviceToHost) != cudaSuccess) return false;
    diff = 0;
    for (int j = 0; j < d; ++j)
      for (int i = 0; i <= j; ++i) {
        const std::size_t k = static_cast<std::size_t>(j) * d + i;
        diff = std::max(diff, std::abs(double(got[k]) - double(ref[k])));
      }
    return true;
  };
  double diff = 0;
  if (!upper_diff(dA, diff)) return 2;

  // The potrs route on the same matrix, timed the same way: B starts as the identity.
  T* dB = nullptr;
  SMOKE_CUDA(cudaMalloc(&dB, sizeof(T) * A.size()));
  std::vector<T> eye(A.size(), T(0));
  for (int i = 0; i < d; ++i) eye[static_cast<std::size_t>(i) * d + i] = T(1);
  double t_solve = 1e30;
  int solve_info[2] = {0, 0};
  for (int rep = 0; rep < 3; ++rep) {
    SMOKE_CUDA(cudaMemcpyAsync(dA, A.data(), sizeof(T) * A.size(), cudaMemcpyHostToDevice, stream));
    SMOKE_CUDA(cudaMemcpyAsync(dB, eye.data(), sizeof(T) * A.size(), cudaMemcpyHostToDevice, stream));
    SMOKE_CUDA(cudaStreamSynchronize(stream));
    t0 = std::chrono::steady_clock::now();
    cs::cholesky_solve_inverse<T>(dA, d, d, dB, d, ws, bytes, dinfo, stream);  // potrf's workspace <= bytes
    SMOKE_CUDA(cudaMemcpyAsync(solve_info, dinfo, sizeof(solve_info), cudaMemcpyDeviceToHost, stream));
    SMOKE_CUDA(cudaStreamSynchronize(stream));
    t_solve = std::min(t_solve, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double solve_diff = 0;
  if (!upper_diff(dB, solve_diff)) return 2;
  cudaFree(dB);
  // An indefinite matrix through the same buffers: potrf's info names the failing minor.
  std::vector<T> indefinite(A.size(), T(0));
  for (int i = 0; i < d; ++i) indefinite[static_cast<std::size_t>(i) * d + i] = i == d / 2 ? T(-1) : T(1);
  SMOKE_CUDA(cudaMemcpyAsync(dA, indefinite.data(), sizeof(T) * A.size(), cudaMemcpyHostToDevice, stream));
  cs::cholesky_inverse<T>(dA, d, d, ws, bytes, dinfo, stream);
  int bad_info[2] = {0, 0};
  SMOKE_CUDA(cudaMemcpyAsync(bad_info, dinfo, sizeof(bad_info), cudaMemcpyDeviceToHost, stream));
  SMOKE_CUDA(cudaStreamSynchronize(stream));
  if (bad_info[0] != d / 2 + 1) std::printf("indefinite d=%d: potrf info %d, expected %d\n", d, bad_info[0], d / 2 + 1);
  const double flops = double(d) * d * d;
  const double tol = (sizeof(T) == 8 ? 1e-10 : 1e-3) * mx;
  const bool ok = info[0] == 0 && info[1] == 0 && solve_info[0] == 0 && solve_info[1] == 0 &&
                  bad_info[0] == d / 2 + 1 && diff <= tol && solve_diff <= tol;
  std::printf("%8d %7s %12.4g %12.4g %12.4g %12.1f %12.1f %10.3g %10.3g %10.2f %s\n", d,
              sizeof(T) == 8 ? "double" : "float", t_gpu, t_solve, t_cpu, flops / t_gpu * 1e-9, flops / t_cpu * 1e-9,
              diff / mx, solve_diff / mx, t_gpu / t_solve, ok ? "ok" : "MISMATCH");
  cudaFree(ws);
  cudaFree(dinfo);
  cudaFree(dA);
  cudaStreamDestroy(stream);
  return ok ? 0 : 1;
}

template <class T>
int smoke_syevd(int d) {
  std::vector<T> A(static_cast<std::size_t>(d) * d, T(0));
  for (int i = 0; i < d; ++i) A[static_cast<std::size_t>(i) * d + i] = T(i + 1);  // spectrum 1..d
  cudaStream_t stream;
  SMOKE_CUDA(cudaStreamCreate(&stream));
  T *dA = nullptr, *dw = nullptr;
  int* dinfo = nullptr;
  void* ws = nullptr;
  SMOKE_CUDA(cudaMalloc(&dA, sizeof(T) * A.size()));
  SMOKE_CUDA(cudaMalloc(&dw, sizeof(T) * d));
  SMOKE_CUDA(cudaMalloc(&dinfo, sizeof(int)));
  SMOKE_CUDA(cudaMemcpy(dA, A.data(), sizeof(T) * A.size(), cudaMemcpyHostToDevice));
  const std::size_t bytes = cs::syevd_workspace<T>(d, d, stream);
  SMOKE_CUDA(cudaMalloc(&ws, bytes));
  cs::syevd<T>(dA, d, d, dw, ws, bytes, dinfo, stream);
  int info = 0;
  SMOKE_CUDA(cudaMemcpyAsync(&info, dinfo, sizeof(int), cudaMemcpyDeviceToHost, stream));
  SMOKE_CUDA(cudaStreamSynchronize(stream));
  std::vector<T> w(d);
  SMOKE_CUDA(cudaMemcpy(w.data(), dw, sizeof(T) * d, cudaMemcpyDeviceToHost));
  double err = 0;
  for (int i = 0; i < d; ++i) err = std::max(err, std::abs(double(w[i]) - (i + 1)));
  std::printf("syevd d=%d info=%d max eigenvalue error %.3g %s\n", d, info, err,
              info == 0 && err < 1e-3 * d ? "ok" : "FAIL");
  cudaFree(ws);
  cudaFree(dinfo);
  cudaFree(dw);
  cudaFree(dA);
  cudaStreamDestroy(stream);
  return info == 0 && err < 1e-3 * d ? 0 : 1;
}

#if KDIST_COMPILE_CHECK_NCCL
// One-rank NCCL all-reduce (sum and average) and a self send/recv through kdist's NCCL unit.
int smoke_nccl() {
  namespace nc = kdist::comm::nccl;
  const std::size_t n = 1 << 20;
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 97);
  cudaStream_t stream;
  SMOKE_CUDA(cudaStreamCreate(&stream));
  float *a = nullptr, *b = nullptr;
  SMOKE_CUDA(cudaMalloc(&a, n * sizeof(float)));
  SMOKE_CUDA(cudaMalloc(&b, n * sizeof(float)));
  SMOKE_CUDA(cudaMemcpy(a, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  nc::Comm comm(nc::make_unique_id(), 1, 0);
  comm.allreduce(a, b, n, nc::DType::float32, nc::Reduce::sum, stream);
  comm.group_start();
  comm.send(b, n, nc::DType::float32, 0, stream);
  comm.recv(a, n, nc::DType::float32, 0, stream);
  comm.group_end();
  SMOKE_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> back(n);
  SMOKE_CUDA(cudaMemcpy(back.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost));
  bool ok = true;
  for (std::size_t i = 0; i < n; ++i) ok = ok && back[i] == host[i];
  std::printf("nccl one-rank allreduce + self send/recv of %zu floats: %s\n", n, ok ? "ok" : "MISMATCH");
  cudaFree(a);
  cudaFree(b);
  cudaStreamDestroy(stream);
  return ok ? 0 : 1;
}
#endif

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("gpu_smoke: no CUDA device\n");
    return 77;
  }
  int failures = 0;
  std::printf("%8s %7s %12s %12s %12s %12s %12s %10s %10s %10s\n", "d", "type", "potri_s", "potrs_s", "lapack_s",
              "potri_GF", "lapack_GF", "rel_diff", "potrs_diff", "potri/potrs");
  for (int d = 256; d <= 8192; d *= 2) {
    failures += smoke<double>(d);
    failures += smoke<float>(d);
  }
  failures += smoke_syevd<double>(256);
  failures += smoke_syevd<float>(256);
#if KDIST_COMPILE_CHECK_NCCL
  failures += smoke_nccl();
#endif
  std::printf("gpu_smoke: %s\n", failures ? "FAILED" : "all ok");
  return failures ? 1 : 0;
}
