// kdist_portability: every kernel kdist runs, on the default execution space, as a share of what
// this platform can do, measured in the same run (the performance-portability suite).
//
// Limits (per process; under mpiexec every rank measures at once and rank 0 reports), each
// measured before and after the kernels, the larger taken (the VM's rates drift within minutes):
//   copy_one, triad_one  STREAM-like copy / triad with this rank alone (perf/common/bandwidth.hpp) on
//                        arrays past the last-level cache (--stream-bytes, 256 MiB); copy is the
//                        best of the copy kernel (one element a thread, and copies_per_thread a thread
//                        as kdist's device copies) and Kokkos::deep_copy (cudaMemcpy on a GPU)
//   copy_all             copy with every rank at once (the per-rank share of the memory bus)
//   gemm_float, gemm_double  kdist::gemm (Kokkos Kernels, BLAS TPL or cuBLAS) at d = --gemm-d
//   communication        the all-reduce latency and bandwidth of a kdist_calibrate file (--calibration),
//                        in the JSON context
// On the default execution space, and on the host space too where they differ (rows "kernel@host").
// Kernels, each with its roofline (bytes moved, or flops, per call, as kdist counts them):
//   pack_upper d        read and write t(d) = d(d+1)/2 elements                     memory, copy_one
//   unpack_upper d      read t(d), write d^2                                          memory, copy_one
//   copy_upper d        a factor step's start: running's upper triangle into pending: read and
//                       write t(d) (the blend itself is the syrk's beta)              memory, copy_one
//   fused_copy n        a gradient into and out of a fusion buffer: 2 x (read n + write n)  memory, copy_one
//   adasum_pair n       partial sums (read 2 n) and apply (read 2 n, write n)         memory, copy_one
//   im2col geometry     read the input, write rows x patch (column-major, as nn::Conv2d) memory, copy_one
//   col2im geometry     its adjoint: read rows x patch, write the input                memory, copy_one
//   max_pool_forward b x c x h x w   nn::MaxPool2d(2): read x, write y and the argmax (n/4 each)
//                                                                                    memory, copy_one
//   max_pool_backward b x c x h x w  read dy and the argmax (n/4 each), write dx (n)  memory, copy_one
//   factor_product n x d  syrk: n d (d + 1) flops                                     compute, gemm_float
//   factor_update rows x n  K-FAC's factor step (FactorUpdate::running_average: syrk's beta
//                       blends into the upper triangle, no mirror) on the layer's layout:
//                       rows n (n + 1) flops over read X + read and write t(n)    roofline_float
//   precondition g x a  V = G^-1 [dW|db] A^-1: 2 (g^2 a + g a^2) flops                compute, gemm_float
//   inverse_cholesky d  d^3 flops (potrf d^3/3 + potri 2 d^3/3), double               compute, gemm_double
//   inverse_eigen d     (4/3 + 2 + 2) d^3 flops: tridiagonal reduction, back-transform,
//                       V diag(1/(lambda + gamma)) V^T; double                        compute, gemm_double
//   kfac_step mlp       one K-FAC iteration of the main job's MLP (784-256-128-10, 64 images):
//                       its factor products, inverses and preconditioning, flops as above;
//                       time = the iteration with K-FAC attached minus the one without  compute, gemm_float
// Sizes come from real models: the main job's MLP and CNN, and ResNet-50's factor dimensions.
// Each figure is the median of --reps calls after one warm-up. One row per kernel and size:
// time, achieved (GB/s or GFLOP/s), the limit, efficiency = achieved / limit (roofline_float:
// the attainable rate min(gemm_float, flops per byte x copy_one)). The memory limit is DRAM's: a
// row whose buffers fit in a cache can pass 1 (pbar.py counts it as 1). --json as every
// bench, with the limits and the platform in its context (perf/portability/pbar.py merges platforms).
// --smoke: tiny sizes, one repeat (ctest), so that the suite cannot rot.
#include <CLI/CLI.hpp>
#include <kdist/adasum/operator.hpp>
#include <kdist/core/cost_model.hpp>
#include <kdist/core/im2col.hpp>
#include <kdist/core/inverse.hpp>
#include <kdist/core/packed.hpp>
#include <kdist/core/products.hpp>
#include <kdist/kfac/impl/kernels.hpp>
#include <kdist/kfac/preconditioner.hpp>
#include <kdist/nn/activations.hpp>
#include <kdist/nn/dense.hpp>
#include <kdist/nn/init.hpp>

#include <Kokkos_Random.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "common/bandwidth.hpp"
#include "common/bench_mpi.hpp"
#include "common/mpi_main.hpp"

namespace {

// Everything below runs on one execution space, a template parameter: the default one, and the
// host one too where they differ (a CUDA build), its rows then named "kernel@host".
template <class Exec, class T>
using Matrix = Kokkos::View<T**, Kokkos::LayoutLeft, typename Exec::memory_space>;
template <class Exec, class T>
using Vector = Kokkos::View<T*, typename Exec::memory_space>;

struct Settings {
  int reps = 5;
  std::size_t stream_bytes = 256u << 20;
  int gemm_d = 2048;
  bool smoke = false;
  std::string platform = "this machine", json;
};

template <class Exec, class V>
void fill_random(const V& v, std::uint64_t seed) {
  Kokkos::Random_XorShift64_Pool<Exec> pool(seed);
  Kokkos::fill_random(v, pool, typename V::value_type(-1), typename V::value_type(1));
}

/// Median seconds of `reps` fenced calls after one warm-up.
template <class Exec>
double timed(int reps, const std::function<void()>& call) {
  Exec exec;
  std::vector<double> t;
  for (int r = 0; r <= reps; ++r) {
    exec.fence();
    const double t0 = kdist::Clock::local_now();
    call();
    exec.fence();
    if (r > 0) t.push_back(kdist::Clock::local_now() - t0);
  }
  return kdist_bench::median(t);
}

struct Limits {
  double copy_one = 0, triad_one = 0, copy_all = 0, gemm_float = 0, gemm_double = 0;
  double copy_kernel = 0, copy_wide = 0, deep_copy = 0;  ///< copy_one's candidates
  double of(const std::string& name) const {
    if (name == "copy_one") return copy_one;
    if (name == "gemm_float") return gemm_float;
    return gemm_double;
  }
  /// Each limit the larger of two measurements.
  static Limits best_of(const Limits& a, const Limits& b) {
    Limits l;
    l.copy_one = std::max(a.copy_one, b.copy_one);
    l.triad_one = std::max(a.triad_one, b.triad_one);
    l.copy_all = std::max(a.copy_all, b.copy_all);
    l.gemm_float = std::max(a.gemm_float, b.gemm_float);
    l.gemm_double = std::max(a.gemm_double, b.gemm_double);
    l.copy_kernel = std::max(a.copy_kernel, b.copy_kernel);
    l.copy_wide = std::max(a.copy_wide, b.copy_wide);
    l.deep_copy = std::max(a.deep_copy, b.deep_copy);
    return l;
  }
  nlohmann::json to_json() const {
    return {{"copy_one_GBs", copy_one / 1e9},        {"copy_kernel_GBs", copy_kernel / 1e9},
            {"copy_wide_GBs", copy_wide / 1e9},      {"deep_copy_GBs", deep_copy / 1e9},
            {"triad_one_GBs", triad_one / 1e9},      {"copy_all_GBs", copy_all / 1e9},
            {"gemm_float_GFLOPs", gemm_float / 1e9}, {"gemm_double_GFLOPs", gemm_double / 1e9}};
  }
};

template <class Exec, class T>
double gemm_rate(int d, int reps) {
  Matrix<Exec, T> A("A", d, d), B("B", d, d), C("C", d, d);
  fill_random<Exec>(A, 1);
  fill_random<Exec>(B, 2);
  Exec exec;
  const double t = timed<Exec>(reps, [&] { kdist::gemm(exec, "N", "N", T(1), A, B, T(0), C); });
  return 2.0 * d * d * static_cast<double>(d) / t;
}

template <class Exec>
Limits measure_limits(const Settings& s) {
  Limits l;
  const auto one = kdist_bench::measure_bandwidth<Exec>(s.stream_bytes, s.reps, MPI_COMM_WORLD, true);
  const auto all = kdist_bench::measure_bandwidth<Exec>(s.stream_bytes, s.reps, MPI_COMM_WORLD, false);
  l.copy_one = one.best_copy();
  l.copy_kernel = one.copy;
  l.copy_wide = one.copy_wide;
  l.deep_copy = one.deep_copy;
  l.triad_one = one.triad;
  l.copy_all = all.best_copy();
  l.gemm_float = gemm_rate<Exec, float>(s.gemm_d, s.reps);
  l.gemm_double = gemm_rate<Exec, double>(s.gemm_d, s.reps);
  return l;
}

/// One row: the kernel, its size, the work per call (bytes or flops) and the limit it is held to
/// (roofline_float: also the bytes a call moves).
struct Row {
  std::string kernel, size, limit;
  double seconds = 0, work = 0;
  bool memory = true;
  double bytes = 0;
};

template <class Exec>
class Suite {
  using Mem = typename Exec::memory_space;
  template <class T>
  using Matrix = ::Matrix<Exec, T>;
  template <class T>
  using Vector = ::Vector<Exec, T>;
  template <class V>
  static void fill_random(const V& v, std::uint64_t seed) {
    ::fill_random<Exec>(v, seed);
  }
  static double timed(int reps, const std::function<void()>& call) { return ::timed<Exec>(reps, call); }

 public:
  explicit Suite(const Settings& s) : s_(s) {}

  void add(Row r) { rows_.push_back(std::move(r)); }

  /// Every row measured, held to `limits` (measured around them), into the table.
  void write(kdist_bench::Table& table, const Limits& limits, const std::string& suffix) const {
    for (const Row& r : rows_) {
      const double achieved = r.work / r.seconds / 1e9;
      const double limit =
          (r.limit == "roofline_float" ? std::min(limits.gemm_float, r.work / r.bytes * limits.copy_one)
                                       : limits.of(r.limit)) /
          1e9;
      table.row({r.kernel + suffix, r.size, r.seconds, achieved, r.memory ? "GB/s" : "GFLOP/s", r.limit, limit,
                 limit > 0 ? achieved / limit : 0.0});
    }
  }

  void packing(int d) {
    Matrix<float> full("full", d, d), back("back", d, d);
    Vector<float> packed("packed", kdist::packed_size(static_cast<std::size_t>(d)));
    fill_random(full, 3);
    Exec exec;
    const double t = static_cast<double>(packed.extent(0)) * sizeof(float), d2 = double(d) * d * sizeof(float);
    add({"pack_upper", std::to_string(d), "copy_one", timed(s_.reps, [&] { kdist::pack_upper(exec, full, packed); }),
         2 * t});
    add({"unpack_upper", std::to_string(d), "copy_one",
         timed(s_.reps, [&] { kdist::unpack_upper(exec, packed, back); }), t + d2});
  }

  void copy_upper(int d) {
    Matrix<float> P("P", d, d), F("F", d, d);
    fill_random(F, 4);
    Exec exec;
    add({"copy_upper", std::to_string(d), "copy_one",
         timed(s_.reps, [&] { kdist::kfac::impl::copy_upper(exec, P, F); }),
         2.0 * static_cast<double>(kdist::packed_size(static_cast<std::size_t>(d))) * sizeof(float)});
  }

  void fused_copy(std::size_t n) {
    Vector<float> grad("grad", n), buffer("buffer", 2 * n);
    fill_random(grad, 6);
    Exec exec;
    const auto slot = Kokkos::subview(buffer, std::make_pair(n / 2, n / 2 + n));
    add({"fused_copy", std::to_string(n), "copy_one",
         timed(s_.reps,
               [&] {
                 Kokkos::deep_copy(exec, slot, grad);
                 Kokkos::deep_copy(exec, grad, slot);
               }),
         4.0 * static_cast<double>(n) * sizeof(float)});
  }

  void adasum_pair(std::size_t n) {
    Vector<float> a("a", n), b("b", n);
    fill_random(a, 7);
    fill_random(b, 8);
    const std::vector<std::size_t> bounds{0, n};
    std::vector<double> partials(kdist::adasum::kPartials);
    Exec exec;
    add({"adasum_pair", std::to_string(n), "copy_one",
         timed(s_.reps,
               [&] {
                 kdist::adasum::partials(exec, a.data(), b.data(), 0, n, bounds, partials.data());
                 kdist::adasum::apply(exec, a.data(), a.data(), b.data(), 0, n, bounds, partials.data());
               }),
         5.0 * static_cast<double>(n) * sizeof(float)});
  }

  void im2col(const kdist::Conv2dGeometry& g, const std::string& name) {
    Kokkos::View<float****, Kokkos::LayoutRight, Mem> x("x", g.batch, g.channels, g.height, g.width);
    Kokkos::View<float**, Kokkos::LayoutLeft, Mem> patches("patches", g.rows(), g.patch());  // as nn::Conv2d
    fill_random(x, 9);
    Exec exec;
    const double bytes = (static_cast<double>(x.size()) + static_cast<double>(patches.size())) * sizeof(float);
    add({"im2col", name, "copy_one", timed(s_.reps, [&] { kdist::im2col(exec, g, x, patches); }), bytes});
  }

  void col2im(const kdist::Conv2dGeometry& g, const std::string& name) {
    Kokkos::View<float**, Kokkos::LayoutLeft, Mem> patches("patches", g.rows(), g.patch());  // as nn::Conv2d
    Kokkos::View<float****, Kokkos::LayoutRight, Mem> dx("dx", g.batch, g.channels, g.height, g.width);
    fill_random(patches, 10);
    Exec exec;
    const double bytes = (static_cast<double>(dx.size()) + static_cast<double>(patches.size())) * sizeof(float);
    add({"col2im", name, "copy_one", timed(s_.reps, [&] { kdist::col2im(exec, g, patches, dx); }), bytes});
  }

  /// nn::MaxPool2d(2) forward and backward on a b x c x h x w input (h, w even).
  void max_pool(int b, int c, int h, int w) {
    using Tensor = kdist::nn::Tensor4<float, Mem>;
    Tensor x("x", b, c, h, w), y("y", b, c, h / 2, w / 2), dx("dx", b, c, h, w);
    fill_random(x, 11);
    kdist::nn::MaxPool2d<float, Mem> pool(2);
    Exec exec;
    const std::string size =
        std::to_string(b) + " x " + std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w);
    const double n = static_cast<double>(x.size()), bytes = (n + n / 2) * sizeof(float);  // int argmax
    add({"max_pool_forward", size, "copy_one", timed(s_.reps, [&] { pool.forward(exec, x, y); }), bytes});
    add({"max_pool_backward", size, "copy_one", timed(s_.reps, [&] { pool.backward(exec, y, dx); }), bytes});
  }

  void factor_product(int n, int d) {
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> X("X", n, d);
    Matrix<float> A("A", d, d);
    fill_random(X, 10);
    Exec exec;
    add({"factor_product", std::to_string(n) + "x" + std::to_string(d), "gemm_float",
         timed(s_.reps, [&] { kdist::factor_product(exec, X, A, 1.0f / static_cast<float>(n)); }),
         static_cast<double>(n) * d * (d + 1.0), false});
  }

  /// K-FAC's factor step on a layer's input (or output gradient) X, rows x cols, in the layout
  /// kdist::kfac gets it in: a Dense layer's row-major activations (with a bias, the factor's last
  /// column from the column sums), a convolution's column-major patches (their ones column, if any,
  /// already in X).
  template <class Layout>
  void factor_update(const std::string& name, int rows, int cols, bool bias) {
    Kokkos::View<float**, Layout, Mem> X("X", rows, cols);
    const int n = cols + (bias ? 1 : 0);
    Matrix<float> A("A", n, n);
    fill_random(X, 16);
    Exec exec;
    const auto update = kdist::FactorUpdate::running_average(0.95);
    const double triangle = static_cast<double>(kdist::packed_size(static_cast<std::size_t>(n)));
    add({"factor_update", name, "roofline_float",
         timed(s_.reps, [&] { kdist::factor_product(exec, X, A, 1.0f / static_cast<float>(rows), bias, update); }),
         2.0 * rows * triangle, false, (static_cast<double>(rows) * cols + 2.0 * triangle) * sizeof(float)});
  }

  void precondition(int g, int a) {
    // Transposed, as kdist::kfac computes it: Vᵀ = A^-1 (Wᵀ G^-1).
    Matrix<float> Gi("Ginv", g, g), W("Wt", a, g), Ai("Ainv", a, a), R("R", a, g), V("Vt", a, g);
    fill_random(Gi, 11);
    fill_random(W, 12);
    fill_random(Ai, 13);
    Exec exec;
    add({"precondition", std::to_string(g) + "x" + std::to_string(a), "gemm_float",
         timed(s_.reps,
               [&] {
                 kdist::gemm(exec, "N", "N", 1.0f, W, Gi, 0.0f, R);
                 kdist::gemm(exec, "N", "N", 1.0f, Ai, R, 0.0f, V);
               }),
         2.0 * (double(g) * g * a + double(g) * a * a), false});
  }

  void inverse(int d, kdist::InverseMethod method) {
    Matrix<double> F("F", d, d), A("A", d, d), inv("inv", d, d);
    fill_random(F, static_cast<std::uint64_t>(d));
    Exec exec;
    kdist::gemm(exec, "T", "N", 1.0 / d, F, F, 0.0, A);  // SPD, well conditioned with the damping
    kdist::InverseWorkspace<double, Mem> ws;
    const bool chol = method == kdist::InverseMethod::cholesky;
    add({chol ? "inverse_cholesky" : "inverse_eigen", std::to_string(d), "gemm_double",
         timed(s_.reps, [&] { kdist::spd_inverse(exec, A, 1e-2, inv, ws, method); }),
         (chol ? 1.0 : 4.0 / 3 + 4.0) * d * static_cast<double>(d) * d, false});
  }

  void kfac_step(int batch);

 private:
  const Settings& s_;
  std::vector<Row> rows_;
};

// The main job's MLP with K-FAC on every step (factors, inverses, preconditioning) against the same
// forward and backward without it; the difference is the preconditioner's work.
template <class Exec>
void Suite<Exec>::kfac_step(int batch) {
  using Dense = kdist::nn::Dense<float, Mem>;
  const std::vector<int> widths{784, 256, 128, 10};
  std::vector<Dense> layers;
  std::vector<kdist::nn::Tensor2<float, Mem>> acts{kdist::nn::Tensor2<float, Mem>("x", batch, widths[0])};
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    layers.emplace_back(widths[l], widths[l + 1], true);
    kdist::nn::he_init(Exec(), layers.back(), 20 + l);
    acts.emplace_back("a", batch, widths[l + 1]);
  }
  fill_random(acts[0], 14);
  kdist::nn::Tensor2<float, Mem> dy("dy", batch, widths.back());
  fill_random(dy, 15);
  std::vector<kdist::nn::Tensor2<float, Mem>> grads;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) grads.emplace_back("g", batch, widths[l]);
  std::vector<kdist::kfac::Layer> kl;
  for (const Dense& d : layers) kl.push_back(d.kfac_layer());
  kdist::kfac::Options o;
  o.factor_every = o.inverse_every = 1;
  o.damping = 1e-2;
  o.cholesky_solves =
      kdist::kfac::CholeskySolves::never;  // every factor inverted: the flops counted below, the runs on file
  kdist::comm::Engine kfac_engine{kdist::comm::Communicator(MPI_COMM_WORLD)};
  kdist::kfac::Preconditioner<float, Mem> kfac(kfac_engine, kl, o);
  Exec exec;
  auto iteration = [&](bool with_kfac) {
    for (std::size_t l = 0; l < layers.size(); ++l) layers[l].attach(with_kfac ? &kfac : nullptr, static_cast<int>(l));
    for (std::size_t l = 0; l < layers.size(); ++l) layers[l].forward(exec, acts[l], acts[l + 1]);
    for (std::size_t l = layers.size(); l-- > 0;)
      layers[l].backward(exec, l + 1 == layers.size() ? dy : grads[l + 1], grads[l]);
    if (!with_kfac) return;
    std::vector<typename kdist::kfac::Preconditioner<float, Mem>::Gradient> g;
    for (const Dense& d : layers) g.push_back(d.gradient());
    kfac.step(exec, g);
  };
  const double with = timed(s_.reps, [&] { iteration(true); }), without = timed(s_.reps, [&] { iteration(false); });
  double flops = 0;
  for (const auto& l : kl) {
    const double a = l.a_dim(), g = l.g_dim();
    flops += batch * (a * (a + 1) + g * (g + 1)) + a * a * a + g * g * g + 2 * (g * g * a + g * a * a);
  }
  add({"kfac_step", "mlp batch " + std::to_string(batch), "gemm_float", std::max(with - without, 1e-9), flops, false});
}

template <class Exec>
void run(Suite<Exec>& suite, const Settings& s) {
  // Factor dimensions: the MLP's A of layer 1 (785) and G (256); ResNet-50's 3x3x256 A (2305 with
  // the im2col column count 2304) and its largest, 4608 (3x3x512).
  const std::vector<int> dims = s.smoke ? std::vector<int>{33} : std::vector<int>{257, 785, 2304, 4608};
  for (int d : dims) suite.packing(d);
  for (int d : dims) suite.copy_upper(d);
  // Gradients: the MLP's 235 146 parameters; ResNet-50's fc weights (2 049 000) and all of it (25.6 M).
  const std::vector<std::size_t> ns =
      s.smoke ? std::vector<std::size_t>{1000} : std::vector<std::size_t>{235146, 2049000, 25557032};
  for (std::size_t n : ns) suite.fused_copy(n);
  for (std::size_t n : ns) suite.adasum_pair(n);
  if (s.smoke) {
    suite.im2col({2, 1, 8, 8, 3, 3, 1, 1}, "tiny");
    suite.col2im({2, 1, 8, 8, 5, 5, 1, 2}, "tiny 5x5");
    suite.max_pool(2, 3, 8, 8);
  } else {
    suite.im2col({64, 1, 28, 28, 5, 5, 1, 2}, "cnn conv1 (64 x 1x28x28, 5x5)");
    suite.im2col({64, 32, 14, 14, 5, 5, 1, 2}, "cnn conv2 (64 x 32x14x14, 5x5)");
    suite.im2col({8, 64, 56, 56, 3, 3, 1, 1}, "resnet50 layer1 3x3 (8 x 64x56x56)");
    suite.col2im({64, 16, 14, 14, 5, 5, 1, 2}, "cnn conv2 (64 x 16x14x14, 5x5)");
    suite.col2im({8, 64, 56, 56, 3, 3, 1, 1}, "resnet50 layer1 3x3 (8 x 64x56x56)");
    // The CNN's two pools, and ResNet-50's stem output (its pool is 3x3 stride 2; 2x2 here).
    suite.max_pool(64, 16, 28, 28);
    suite.max_pool(64, 32, 14, 14);
    suite.max_pool(8, 64, 112, 112);
  }
  const std::vector<std::pair<int, int>> products =
      s.smoke ? std::vector<std::pair<int, int>>{{16, 17}}
              : std::vector<std::pair<int, int>>{{64, 785}, {512, 785}, {1568, 2304}, {392, 4608}};
  for (const auto& p : products) suite.factor_product(p.first, p.second);
  // The main job's factors (64 images; conv patches with their ones column) and ResNet-50's 3x3
  // convolutions (no bias) at 8 images.
  using Left = Kokkos::LayoutLeft;
  using Right = Kokkos::LayoutRight;
  if (s.smoke) {
    suite.template factor_update<Right>("tiny dense 16x8+1", 16, 8, true);
    suite.template factor_update<Left>("tiny conv 32x10", 32, 10, false);
  } else {
    suite.template factor_update<Right>("mlp fc1 A 64x784+1", 64, 784, true);
    suite.template factor_update<Left>("cnn conv1 A 50176x26", 50176, 26, false);
    suite.template factor_update<Left>("cnn conv1 G 50176x16", 50176, 16, false);
    suite.template factor_update<Left>("cnn conv2 A 12544x401", 12544, 401, false);
    suite.template factor_update<Left>("cnn conv2 G 12544x32", 12544, 32, false);
    suite.template factor_update<Right>("cnn fc1 A 64x1568+1", 64, 1568, true);
    suite.template factor_update<Left>("resnet50 3x3x256 A 1568x2304", 1568, 2304, false);
    suite.template factor_update<Left>("resnet50 3x3x512 A 392x4608", 392, 4608, false);
  }
  const std::vector<std::pair<int, int>> layers =
      s.smoke ? std::vector<std::pair<int, int>>{{8, 17}}
              : std::vector<std::pair<int, int>>{{256, 785}, {256, 2304}, {512, 4608}, {2048, 2048}};
  for (const auto& p : layers) suite.precondition(p.first, p.second);
  const std::vector<int> inv = s.smoke ? std::vector<int>{24} : std::vector<int>{256, 785, 2048, 4608};
  for (int d : inv) suite.inverse(d, kdist::InverseMethod::cholesky);
  for (int d : inv)
    if (d <= 2048) suite.inverse(d, kdist::InverseMethod::eigen);
  suite.kfac_step(s.smoke ? 4 : 64);
}

// One execution space: its limits around every kernel (in the JSON context under its name: both
// measurements and the larger of each, which the rows are held to).
template <class Exec>
void on_space(const Settings& s, kdist_bench::Table& table, int rank, const std::string& suffix,
              nlohmann::json& limits_context) {
  const Limits before = measure_limits<Exec>(s);
  Suite<Exec> suite(s);
  run<Exec>(suite, s);
  const Limits after = measure_limits<Exec>(s);
  const Limits limits = Limits::best_of(before, after);
  nlohmann::json context = limits.to_json();
  context["before"] = before.to_json();
  context["after"] = after.to_json();
  limits_context[Exec::name()] = context;
  if (rank == 0)
    std::printf(
        "# %s on %s: copy %.1f GB/s alone (kernel %.1f, %d a thread %.1f, deep_copy %.1f; %.1f with every rank), "
        "triad %.1f GB/s, gemm %.1f / %.1f GFLOP/s (float / double); the better of before and after the kernels\n",
        s.platform.c_str(), Exec::name(), limits.copy_one / 1e9, limits.copy_kernel / 1e9,
        kdist::impl::copies_per_thread, limits.copy_wide / 1e9, limits.deep_copy / 1e9, limits.copy_all / 1e9,
        limits.triad_one / 1e9, limits.gemm_float / 1e9, limits.gemm_double / 1e9);
  suite.write(table, limits, suffix);
}

// The all-reduce models of a kdist_calibrate file, for the context: the communication limits.
nlohmann::json communication_limits(const std::string& path) {
  nlohmann::json out = nlohmann::json::array();
  if (path.empty()) return out;
  const kdist::CostModelStore store = kdist::CostModelStore::load(path);  // checks the file, names errors
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in);  // named: a range-for over a temporary's member dangles
  for (const auto& e : doc.at("entries"))
    if (e.at("op") == "allreduce")
      out.push_back({{"dtype", e.at("dtype")},
                     {"ranks", e.at("ranks")},
                     {"latency_s", e.at("alpha")},
                     {"bandwidth_GBs", e.at("beta").get<double>() > 0 ? 1e-9 / e.at("beta").get<double>() : 0.0}});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdist performance portability: every kernel as a share of this platform's measured limit"};
  Settings s;
  std::string calibration;
  app.add_option("--reps", s.reps, "timed calls per figure (median)")->check(CLI::PositiveNumber);
  app.add_option("--stream-bytes", s.stream_bytes, "bandwidth arrays, past the last-level cache");
  app.add_option("--gemm-d", s.gemm_d, "gemm dimension of the compute limit")->check(CLI::PositiveNumber);
  app.add_option("--platform", s.platform, "name of this platform in the JSON (perf/portability/pbar.py's column)");
  app.add_option("--calibration", calibration, "kdist_calibrate file: its all-reduce models join the limits");
  app.add_flag("--smoke", s.smoke, "tiny sizes, one repeat (ctest)");
  app.add_option("--json", s.json, "write the rows to this JSON file");
  return kdist_perf::mpi_main(argc, argv, app, "kdist_portability", [&](int rank) {
    if (s.smoke) {
      s.reps = 1;
      s.stream_bytes = 1u << 20;
      s.gemm_d = 64;
    }
    kdist_bench::Table table("kdist_portability",
                             {"kernel", "size", "seconds", "achieved", "unit", "limit", "limit_value", "efficiency"});
    table.set_print(rank == 0);
    table.context("platform", s.platform);
    table.context("execution_space", Kokkos::DefaultExecutionSpace::name());
    table.context("communication", communication_limits(calibration));
    if (rank == 0) table.print_header();
    nlohmann::json limits = nlohmann::json::object();
    on_space<Kokkos::DefaultExecutionSpace>(s, table, rank, "", limits);
    if (!std::is_same<Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace>::value)
      on_space<Kokkos::DefaultHostExecutionSpace>(s, table, rank, "@host", limits);
    table.context("limits", limits);
    if (rank == 0) table.write_json(s.json);
  });
}
