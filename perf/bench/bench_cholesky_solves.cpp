// A K-FAC factor applied to k columns every step and refreshed every `--every` steps, on the
// host: kept as its inverse (kdist::spd_inverse, potrf + potri; each step a gemm with it, as
// kfac-pytorch and kdist before Options::cholesky_solves) against kept as its Cholesky factor R
// (kdist::cholesky_factor, potrf alone; each step two triangular solves, cholesky_solve_left).
// A row per (d, k): the main job's factors as split over 2 ranks, and larger ones. Same thread
// count, alternating repeats, medians; the ratio is one period's time (one refresh and `every`
// applications) kept as the inverse over kept as R. Both results are checked to agree.
//   bench_cholesky_solves [--reps N] [--every K] [--json FILE]
#include <CLI/CLI.hpp>
#include <kdist/core/cholesky.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/bench_table.hpp"

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;
using Matrix = Kokkos::View<float**, Kokkos::LayoutLeft, Kokkos::HostSpace>;

struct Case {
  const char* name;
  int d, k;
};

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  Host().fence();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// A factor like K-FAC's: X^T X / rows of ReLU-like activations, d x d.
Matrix make_factor(int d, int rows) {
  std::mt19937_64 rng(static_cast<unsigned>(d));
  std::normal_distribution<float> normal;
  Matrix X("X", rows, d), F("F", d, d);
  for (std::size_t i = 0; i < X.size(); ++i) X.data()[i] = std::max(0.0f, normal(rng));
  kdist::gemm(Host(), "T", "N", 1.0f / static_cast<float>(rows), X, X, 0.0f, F);
  return F;
}

void run_case(const Case& c, int reps, int every, kdist_bench::Table& table) {
  const double damping = 0.3;
  const Matrix F = make_factor(c.d, 256);
  Matrix inv("inv", c.d, c.d), R("R", c.d, c.d), B("B", c.d, c.k), by_gemm("by_gemm", c.d, c.k),
      by_solves("by_solves", c.d, c.k);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  for (std::size_t i = 0; i < B.size(); ++i) B.data()[i] = normal(rng);
  kdist::InverseWorkspace<float, Kokkos::HostSpace> ws_inverse, ws_factor;
  std::vector<double> t_inverse, t_factor, t_gemm, t_solves;
  const auto inverse = [&] { return seconds([&] { kdist::spd_inverse(Host(), F, damping, inv, ws_inverse); }); };
  const auto factor = [&] { return seconds([&] { kdist::cholesky_factor(Host(), F, damping, R, ws_factor); }); };
  const auto gemm = [&] { return seconds([&] { kdist::gemm(Host(), "N", "N", 1.0f, inv, B, 0.0f, by_gemm); }); };
  const auto solves = [&] {
    Kokkos::deep_copy(by_solves, B);  // the preconditioner's solves run in place on a block it wrote
    return seconds([&] { kdist::cholesky_solve_left(Host(), R, by_solves); });
  };
  for (int r = 0; r < reps + 1; ++r) {  // repeat 0 is a warm-up; the order alternates
    const bool inverse_first = r % 2 == 0;
    double ti, tf, tg, ts;
    if (inverse_first) {
      ti = inverse(), tg = gemm(), tf = factor(), ts = solves();
    } else {
      tf = factor(), ts = solves(), ti = inverse(), tg = gemm();
    }
    if (r == 0) continue;
    t_inverse.push_back(ti), t_factor.push_back(tf), t_gemm.push_back(tg), t_solves.push_back(ts);
  }
  double diff = 0, mx = 0;
  for (int j = 0; j < c.k; ++j)
    for (int i = 0; i < c.d; ++i) {
      diff = std::max(diff, double(std::abs(by_gemm(i, j) - by_solves(i, j))));
      mx = std::max(mx, double(std::abs(by_gemm(i, j))));
    }
  if (!(diff <= 1e-3 * mx))
    throw std::runtime_error(std::string("bench_cholesky_solves: results differ for ") + c.name);
  const double ti = kdist_bench::median(t_inverse), tf = kdist_bench::median(t_factor);
  const double tg = kdist_bench::median(t_gemm), ts = kdist_bench::median(t_solves);
  table.row({c.name, c.d, c.k, ti * 1e3, tf * 1e3, tg * 1e3, ts * 1e3, (ti + every * tg) / (tf + every * ts)});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdist: a K-FAC factor kept as its inverse vs as its Cholesky factor"};
  int reps = 7, every = 10;
  std::string json;
  app.add_option("--reps", reps, "timed repeats per row (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--every", every, "applications per refresh (K-FAC's inverse_every)")->check(CLI::PositiveNumber);
  app.add_option("--json", json, "write the rows to this JSON file");
  CLI11_PARSE(app, argc, argv);

  Kokkos::ScopeGuard guard(argc, argv);
  kdist_bench::Table table("bench_cholesky_solves", {"factor", "d", "k", "inverse_ms", "cholesky_ms", "gemm_ms",
                                                     "solves_ms", "inverse/cholesky"});
  const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
  table.context("OPENBLAS_NUM_THREADS", threads ? threads : "default (all cores)");
  table.context("every", every);
  table.context("reps", reps);
  table.context("dtype", "float");
  std::printf(
      "# float; a period = one refresh + %d applications to k columns; OPENBLAS_NUM_THREADS=%s; medians of %d\n", every,
      threads ? threads : "default", reps);
  table.print_header();
  const Case cases[] = {
      {"cnn conv2 A (block of 16 outputs)", 401, 16},
      {"mlp fc1 A (block of 128 outputs)", 785, 128},
      {"cnn fc1 A (block of 64 outputs)", 1569, 64},
      {"2304, 256 columns", 2304, 256},
      {"4608, 256 columns", 4608, 256},
  };
  for (const Case& c : cases) run_case(c, reps, every, table);
  table.write_json(json);
  return 0;
}
