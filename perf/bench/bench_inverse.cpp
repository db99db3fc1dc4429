// SPD inverse: kdist::spd_inverse against a direct LAPACK potrf + potri call and dgemm/sgemm on
// the same machine, same thread count, interleaved repeats, medians. With --cuda (CUDA builds):
// kdist::spd_inverse on device views against a direct cuSOLVER potrf + potri on a copy of the
// damped matrix, each timed to its stream's end.
//   bench_inverse [--sizes 64,128,...] [--reps N] [--cuda] [--json FILE]
#include <CLI/CLI.hpp>
#include <kdist/core/impl/blas_host.hpp>
#include <kdist/core/impl/lapack_host.hpp>
#include <kdist/core/inverse.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "common/bench_table.hpp"

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// {a(), b()}, b timed first on even repeats: neither always finds the other's data in cache.
template <class A, class B>
std::pair<double, double> in_turn(int repeat, const A& a, const B& b) {
  if (repeat % 2) {
    const double ta = a();
    return {ta, b()};
  }
  const double tb = b();
  return {a(), tb};
}

// Same answer as the baseline (upper triangles of host views), or the timing means nothing.
template <class V>
void require_same_upper(const V& inv, const V& baseline, const char* what) {
  using T = typename V::non_const_value_type;
  double diff = 0, mx = 0;
  for (int j = 0; j < static_cast<int>(inv.extent(1)); ++j)
    for (int i = 0; i <= j; ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(inv(i, j) - baseline(i, j))));
      mx = std::max(mx, std::abs(static_cast<double>(baseline(i, j))));
    }
  if (diff > (sizeof(T) == 8 ? 1e-10 : 1e-3) * mx)
    throw std::runtime_error(std::string("kdist and ") + what + " inverses differ");
}

template <class T>
void run_size(int d, int reps, double damping, kdist_bench::Table& table) {
  using M = Kokkos::View<T**, Kokkos::LayoutLeft, Kokkos::HostSpace>;
  M B("B", d, d), A("A", d, d), inv("inv", d, d), work("work", d, d), C("C", d, d);
  std::mt19937_64 rng(d);
  std::normal_distribution<double> g;
  for (int j = 0; j < d; ++j)
    for (int i = 0; i < d; ++i) B(i, j) = static_cast<T>(g(rng));
  // A = B B^T / d + I: SPD and well conditioned.
  kdist::impl::host::syrk<T>('U', 'N', d, d, T(1) / d, B.data(), d, T(0), A.data(), d);
  for (int j = 0; j < d; ++j) {
    A(j, j) += T(1);
    for (int i = j + 1; i < d; ++i) A(i, j) = A(j, i);
  }
  std::vector<double> t_kdist, t_lapack, t_gemm;
  kdist::InverseWorkspace<T, Kokkos::HostSpace> workspace("bench_inverse::workspace");  // as a caller would
  auto time_kdist = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    kdist::spd_inverse(Host(), A, damping, inv, workspace);
    return seconds_since(t0);
  };
  auto time_lapack = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(work.data(), A.data(), sizeof(T) * d * d);
    for (int i = 0; i < d; ++i) work(i, i) += static_cast<T>(damping);
    if (kdist::impl::host::potrf<T>('U', d, work.data(), d) || kdist::impl::host::potri<T>('U', d, work.data(), d))
      throw std::runtime_error("LAPACK baseline failed");
    return seconds_since(t0);
  };
  for (int r = 0; r < reps + 1; ++r) {  // repeat 0 is a warm-up
    const auto [tk, tl] = in_turn(r, time_kdist, time_lapack);
    const auto t0 = std::chrono::steady_clock::now();
    kdist::impl::host::gemm<T>('N', 'N', d, d, d, T(1), A.data(), d, B.data(), d, T(0), C.data(), d);
    const double tg = seconds_since(t0);
    if (r > 0) {
      t_kdist.push_back(tk);
      t_lapack.push_back(tl);
      t_gemm.push_back(tg);
    }
  }
  require_same_upper(inv, work, "LAPACK");
  const double flops = double(d) * d * d;
  const double tk = kdist_bench::median(t_kdist), tl = kdist_bench::median(t_lapack), tg = kdist_bench::median(t_gemm);
  const double gk = flops / tk * 1e-9, gl = flops / tl * 1e-9, gg = 2 * flops / tg * 1e-9;
  table.row({d, sizeof(T) == 8 ? "double" : "float", tk, gk, gl, gg, gk / gg, gk / gl});
}

#if KDIST_ENABLE_CUSOLVER && defined(KOKKOS_ENABLE_CUDA)
// The same matrix on the GPU: kdist (copy with damping, NaN count, cuSOLVER, mirror, one read-back)
// against the copy and cuSOLVER's potrf + potri alone. Ratio: the baseline's time over kdist's.
template <class T>
void run_size_device(int d, int reps, double damping, kdist_bench::Table& table) {
  using Dev = Kokkos::View<T**, Kokkos::LayoutLeft, Kokkos::CudaSpace>;
  const Kokkos::Cuda exec;
  Dev A("A", d, d), damped("damped", d, d), inv("inv", d, d), work("work", d, d);
  {
    std::mt19937_64 rng(d);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    auto h = Kokkos::create_mirror_view(A);
    // Symmetric, off-diagonal entries in (-1, 1), diagonal d: SPD by Gershgorin, made in O(d^2).
    for (int j = 0; j < d; ++j)
      for (int i = 0; i <= j; ++i) h(i, j) = h(j, i) = static_cast<T>(i == j ? double(d) : u(rng));
    Kokkos::deep_copy(A, h);
    for (int i = 0; i < d; ++i) h(i, i) += static_cast<T>(damping);
    Kokkos::deep_copy(damped, h);
  }
  kdist::InverseWorkspace<T, Kokkos::CudaSpace> workspace("bench_inverse::workspace");
  const std::size_t bytes = kdist::impl::cusolver::cholesky_inverse_workspace<T>(d, d, exec.cuda_stream());
  Kokkos::View<char*, Kokkos::CudaSpace> scratch("scratch", bytes);
  Kokkos::View<int*, Kokkos::CudaSpace> info("info", 2);
  auto time_kdist = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    kdist::spd_inverse(exec, A, damping, inv, workspace);
    exec.fence();
    return seconds_since(t0);
  };
  auto time_cusolver = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    Kokkos::deep_copy(exec, work, damped);
    kdist::impl::cusolver::cholesky_inverse<T>(work.data(), d, d, scratch.data(), bytes, info.data(),
                                               exec.cuda_stream());
    exec.fence();
    return seconds_since(t0);
  };
  std::vector<double> t_kdist, t_raw;
  for (int r = 0; r < reps + 1; ++r) {  // repeat 0 is a warm-up
    const auto [tk, tr] = in_turn(r, time_kdist, time_cusolver);
    if (r > 0) {
      t_kdist.push_back(tk);
      t_raw.push_back(tr);
    }
  }
  const auto h_info = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), info);
  if (h_info(0) || h_info(1)) throw std::runtime_error("cuSOLVER baseline failed");
  require_same_upper(Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), inv),
                     Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), work), "cuSOLVER");
  const double tk = kdist_bench::median(t_kdist), tr = kdist_bench::median(t_raw);
  const double flops = double(d) * d * d;
  table.row({d, sizeof(T) == 8 ? "double" : "float", tk, flops / tk * 1e-9, tr, flops / tr * 1e-9, tr / tk});
}

bool run_device(const std::vector<int>& sizes, int reps, double damping, const std::string& json) {
  kdist_bench::Table table("bench_inverse_device",
                           {"d", "type", "kdist_s", "kdist_GFLOPs", "potri_s", "potri_GFLOPs", "kdist/potri"});
  table.context("flops", "d^3 per inverse");
  table.context("baseline", "copy of the damped matrix + cusolverDn potrf + potri, to the stream's end");
  table.context("reps", reps);
  std::printf("# SPD inverse on the GPU: kdist::spd_inverse against cuSOLVER potrf + potri; medians of %d\n", reps);
  table.print_header();
  for (int d : sizes) {
    run_size_device<float>(d, reps, damping, table);
    run_size_device<double>(d, reps, damping, table);
  }
  table.write_json(json);
  return true;
}
#else
bool run_device(const std::vector<int>&, int, double, const std::string&) {
  std::fprintf(stderr, "bench_inverse: --cuda needs a CUDA build with cuSOLVER\n");
  return false;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdist SPD inverse vs direct LAPACK potrf+potri and gemm"};
  std::vector<int> sizes{64, 128, 256, 512, 1024, 2048, 4096};
  int reps = 5;
  double damping = 1e-3;
  std::string json;
  app.add_option("--sizes", sizes, "matrix dimensions d")->delimiter(',');
  app.add_option("--reps", reps, "timed repeats per size (median reported)");
  app.add_option("--damping", damping, "damping added to the diagonal");
  app.add_option("--json", json, "write the rows to this JSON file");
  bool cuda = false;
  app.add_flag("--cuda", cuda, "kdist on the GPU against cuSOLVER potrf + potri (CUDA builds)");
  CLI11_PARSE(app, argc, argv);

  Kokkos::ScopeGuard guard(argc, argv);
  if (cuda) return run_device(sizes, reps, damping, json) ? 0 : 2;
  kdist_bench::Table table("bench_inverse", {"d", "type", "kdist_s", "kdist_GFLOPs", "lapack_GFLOPs", "gemm_GFLOPs",
                                             "kdist/gemm", "kdist/lapack"});
  const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
  table.context("OPENBLAS_NUM_THREADS", threads ? threads : "default (all cores)");
  table.context("flops", "d^3 per inverse, 2 d^3 per gemm");
  table.context("reps", reps);
  std::printf("# SPD inverse (Cholesky) GFLOP/s at d^3 flops; OPENBLAS_NUM_THREADS=%s; medians of %d\n",
              threads ? threads : "default", reps);
  table.print_header();
  for (int d : sizes) {
    const int r = d >= 2048 ? std::max(1, std::min(reps, 3)) : reps;
    run_size<float>(d, r, damping, table);
    run_size<double>(d, r, damping, table);
  }
  table.write_json(json);
  return 0;
}
