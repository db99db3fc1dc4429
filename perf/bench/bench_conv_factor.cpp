// Conv2d factor A on the host: kdist::kfac's kernel-row shifts from the input X
// (kfac/impl/conv_shifts.hpp) against the syrk on patches a forward pass already formed
// (conv2d_a_factor_from_patches: what nn::Conv2d's hook ran before; kfac-pytorch forms the same
// product as a gemm), both as K-FAC's running average, same thread count, alternating repeats,
// medians; im2col of the whole batch timed beside them (conv2d_a_factor from X paid it too). A
// row per convolution (the main job's CNN and ResNet-like 3 x 3 layers); the ratio is the syrk's
// time over the shifts'. conv2d_a_factor takes the shifts where a row's `dispatch` says so
// (conv2d_a_factor_prefers_input); the first row shows why not everywhere.
//   bench_conv_factor [--reps N] [--json FILE]
#include <CLI/CLI.hpp>
#include <kdist/kfac/factors.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/bench_table.hpp"

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;
using Matrix = Kokkos::View<float**, Kokkos::LayoutLeft, Kokkos::HostSpace>;

struct Case {
  const char* name;
  kdist::Conv2dGeometry g;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_case(const Case& c, int reps, kdist_bench::Table& table) {
  const kdist::Conv2dGeometry& g = c.g;
  const kdist::kfac::Conv2d layer(g.channels, 32, g.kernel_h, g.kernel_w, 1, g.padding, true);
  Kokkos::View<float****, Kokkos::LayoutRight, Kokkos::HostSpace> X("X", g.batch, g.channels, g.height, g.width);
  std::mt19937_64 rng(g.channels * 131 + g.height);
  std::normal_distribution<float> normal;
  for (std::size_t i = 0; i < X.size(); ++i) X.data()[i] = std::max(0.0f, normal(rng));  // ReLU outputs
  const int n = layer.a_dim();
  Matrix A_shifts("A_shifts", n, n), A_patches("A_patches", n, n);
  const auto update = kdist::FactorUpdate::running_average(0.95);
  kdist::kfac::FactorWorkspace<float, Kokkos::HostSpace> ws_shifts, ws_patches;
  const int m = kdist::kfac::impl::shift_columns(g);
  const auto time_shifts = [&] {
    const auto scratch = ws_shifts.impl_rows(Host(), int(kdist::kfac::impl::shift_scratch_entries(g) / m), m);
    const auto t0 = std::chrono::steady_clock::now();
    kdist::kfac::impl::conv2d_a_factor_by_shifts(Host(), layer, g, X, A_shifts, scratch, update);
    Host().fence();
    return seconds_since(t0);
  };
  // The baseline as a layer that already formed its patches runs it: the syrk alone (im2col timed
  // on its own beside it; conv2d_a_factor from X paid both).
  // With the ones column nn::Conv2d appends (ā: the bias row comes out of the one syrk).
  const auto P = ws_patches.impl_rows(Host(), g.rows(), g.patch() + 1);
  Kokkos::deep_copy(Kokkos::subview(P, Kokkos::ALL(), g.patch()), 1.0f);
  const auto time_im2col = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    kdist::im2col(Host(), g, X, Kokkos::subview(P, Kokkos::ALL(), std::make_pair(0, g.patch())));
    Host().fence();
    return seconds_since(t0);
  };
  const auto time_syrk = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    kdist::kfac::conv2d_a_factor_from_patches(Host(), layer, g, P, A_patches, update);
    Host().fence();
    return seconds_since(t0);
  };
  std::vector<double> t_shifts, t_syrk, t_im2col;
  for (int r = 0; r < reps + 1; ++r) {  // repeat 0 is a warm-up; the order alternates
    const double ti = time_im2col();
    const double a = r % 2 ? time_shifts() : time_syrk();
    const double b = r % 2 ? time_syrk() : time_shifts();
    if (r == 0) continue;
    t_im2col.push_back(ti);
    t_shifts.push_back(r % 2 ? a : b);
    t_syrk.push_back(r % 2 ? b : a);
  }
  // Both blended the same batch into the same start (0) the same number of times.
  double diff = 0, mx = 0;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i <= j; ++i) {
      diff = std::max(diff, double(std::abs(A_shifts(i, j) - A_patches(i, j))));
      mx = std::max(mx, double(std::abs(A_patches(i, j))));
    }
  if (diff > 1e-4 * mx) throw std::runtime_error(std::string("bench_conv_factor: the factors differ for ") + c.name);
  const double ts = kdist_bench::median(t_shifts), tp = kdist_bench::median(t_syrk);
  const bool dispatch = kdist::kfac::conv2d_a_factor_prefers_input<Host>(layer, g);
  table.row(
      {c.name, n, dispatch ? "shifts" : "patches", kdist_bench::median(t_im2col) * 1e3, tp * 1e3, ts * 1e3, tp / ts});
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdist Conv2d factor A: kernel-row shifts vs the patches' syrk"};
  int reps = 7;
  std::string json;
  app.add_option("--reps", reps, "timed repeats per row (median reported)");
  app.add_option("--json", json, "write the rows to this JSON file");
  CLI11_PARSE(app, argc, argv);

  Kokkos::ScopeGuard guard(argc, argv);
  kdist_bench::Table table("bench_conv_factor",
                           {"conv", "a_dim", "dispatch", "im2col_ms", "syrk_ms", "shifts_ms", "syrk/shifts"});
  const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
  table.context("OPENBLAS_NUM_THREADS", threads ? threads : "default (all cores)");
  table.context("update", "running_average(0.95), float");
  table.context("reps", reps);
  std::printf(
      "# Conv2d factor A, float: syrk on formed patches vs kernel-row shifts from the input; "
      "OPENBLAS_NUM_THREADS=%s; medians of %d\n",
      threads ? threads : "default", reps);
  table.print_header();
  // batch, channels, height, width, kernel h x w, stride, padding
  const Case cases[] = {
      {"cnn conv1 64x1x28x28 5x5", {64, 1, 28, 28, 5, 5, 1, 2}},
      {"cnn conv2 64x16x14x14 5x5", {64, 16, 14, 14, 5, 5, 1, 2}},
      {"64x2x28x28 5x5", {64, 2, 28, 28, 5, 5, 1, 2}},
      {"64x4x28x28 3x3", {64, 4, 28, 28, 3, 3, 1, 1}},
      {"64x4x28x28 5x5", {64, 4, 28, 28, 5, 5, 1, 2}},
      {"64x8x14x14 3x3", {64, 8, 14, 14, 3, 3, 1, 1}},
      {"64x16x28x28 3x3", {64, 16, 28, 28, 3, 3, 1, 1}},
      {"64x32x14x14 3x3", {64, 32, 14, 14, 3, 3, 1, 1}},
      {"8x64x56x56 3x3 (resnet50 layer1)", {8, 64, 56, 56, 3, 3, 1, 1}},
  };
  for (const Case& c : cases) run_case(c, reps, table);
  table.write_json(json);
  return 0;
}
