// SPD inverse: kdist::spd_inverse against a direct LAPACK potrf + potri call and dgemm/sgemm on
// the same machine, same thread count, interleaved repeats, medians.
//   bench_inverse [--sizes 64,128,...] [--reps N] [--json FILE]
#include <CLI/CLI.hpp>
#include <kdist/core/impl/blas_host.hpp>
#include <kdist/core/impl/lapack_host.hpp>
#include <kdist/core/inverse.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>

#include "common/bench_table.hpp"

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
    // Alternate which goes first so neither always finds the other's data in cache.
    double tk = 0, tl = 0;
    if (r % 2) {
      tk = time_kdist();
      tl = time_lapack();
    } else {
      tl = time_lapack();
      tk = time_kdist();
    }
    const auto t0 = std::chrono::steady_clock::now();
    kdist::impl::host::gemm<T>('N', 'N', d, d, d, T(1), A.data(), d, B.data(), d, T(0), C.data(), d);
    const double tg = seconds_since(t0);
    if (r > 0) {
      t_kdist.push_back(tk);
      t_lapack.push_back(tl);
      t_gemm.push_back(tg);
    }
  }
  // Same answer as the baseline, or the timing means nothing.
  double diff = 0, mx = 0;
  for (int j = 0; j < d; ++j)
    for (int i = 0; i <= j; ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(inv(i, j) - work(i, j))));
      mx = std::max(mx, std::abs(static_cast<double>(work(i, j))));
    }
  if (diff > (sizeof(T) == 8 ? 1e-10 : 1e-3) * mx) throw std::runtime_error("kdist and LAPACK inverses differ");
  const double flops = double(d) * d * d;
  const double tk = kdist_bench::median(t_kdist), tl = kdist_bench::median(t_lapack), tg = kdist_bench::median(t_gemm);
  const double gk = flops / tk * 1e-9, gl = flops / tl * 1e-9, gg = 2 * flops / tg * 1e-9;
  table.row({d, sizeof(T) == 8 ? "double" : "float", tk, gk, gl, gg, gk / gg, gk / gl});
}

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
  CLI11_PARSE(app, argc, argv);

  Kokkos::ScopeGuard guard(argc, argv);
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
