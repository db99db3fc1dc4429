// kfac::Preconditioner against a dense double reference written here with naive loops: the
// global batch is split over the ranks, so every rank count must give the same preconditioned
// gradients; every strategy, placement and fusion planner too. Also the Kronecker-factored
// Fisher block at vanishing damping, the state round trip, and every bad input on every rank.
#include <kdist/kfac/preconditioner.hpp>

#include <mpi.h>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <vector>

#include "test_space.hpp"

using namespace kdist;
using namespace kdist::kfac;
using kdist_test::TestExec;
using kdist_test::TestMem;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Deterministic data: the same global value on every rank for (step, layer, what, index).
double value(int step, int layer, int what, long long i) {
  const double x = std::sin(0.37 * (i + 1) + 1.3 * step + 2.1 * layer + 0.7 * what);
  return x + 0.25 * std::cos(1.7 * i + 0.3 * what);
}

using Mat = std::vector<std::vector<double>>;
Mat zeros(int r, int c) {
  return Mat(static_cast<std::size_t>(r), std::vector<double>(static_cast<std::size_t>(c), 0.0));
}
Mat identity(int d) {
  Mat m = zeros(d, d);
  for (int i = 0; i < d; ++i) m[i][i] = 1;
  return m;
}
Mat matmul(const Mat& a, const Mat& b) {
  Mat c = zeros(static_cast<int>(a.size()), static_cast<int>(b[0].size()));
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t k = 0; k < b.size(); ++k)
      for (std::size_t j = 0; j < b[0].size(); ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}
// Gauss-Jordan with partial pivoting.
Mat inverse(Mat a) {
  const int n = static_cast<int>(a.size());
  Mat inv = identity(n);
  for (int c = 0; c < n; ++c) {
    int p = c;
    for (int r = c + 1; r < n; ++r)
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    std::swap(a[c], a[p]);
    std::swap(inv[c], inv[p]);
    const double s = a[c][c];
    for (int j = 0; j < n; ++j) a[c][j] /= s, inv[c][j] /= s;
    for (int r = 0; r < n; ++r)
      if (r != c) {
        const double f = a[r][c];
        for (int j = 0; j < n; ++j) a[r][j] -= f * a[c][j], inv[r][j] -= f * inv[c][j];
      }
  }
  return inv;
}

// ---- the network and its data -------------------------------------------------------------

constexpr int kBatch = 12;  // global samples per step: divisible by 1, 2, 3 and 4
struct ConvShape {
  int h = 5, w = 6;
};

std::vector<Layer> network() {
  return {Conv2d(2, 3, 3, 2, 2, 1, true), Dense(7, 4, true), Dense(4, 3, false)};
}

// Global activation rows of a layer: Dense rows x in; Conv2d the naive im2col patches, with the
// ones column when the layer has a bias.
Mat activation_rows(const Layer& L, int step, int l) {
  Mat rows;
  if (L.kind() == LayerKind::dense) {
    for (int r = 0; r < kBatch; ++r) {
      std::vector<double> row;
      for (int j = 0; j < L.inputs(); ++j) row.push_back(value(step, l, 0, r * L.inputs() + j));
      if (L.bias()) row.push_back(1);
      rows.push_back(row);
    }
    return rows;
  }
  const ConvShape s;
  const int C = L.in_channels(), oh = L.out_h(s.h), ow = L.out_w(s.w);
  for (int b = 0; b < kBatch; ++b)
    for (int i = 0; i < oh; ++i)
      for (int j = 0; j < ow; ++j) {
        std::vector<double> row;
        for (int c = 0; c < C; ++c)
          for (int p = 0; p < L.kernel_h(); ++p)
            for (int q = 0; q < L.kernel_w(); ++q) {
              const int y = i * L.stride() - L.padding() + p, x = j * L.stride() - L.padding() + q;
              const bool in = y >= 0 && y < s.h && x >= 0 && x < s.w;
              row.push_back(in ? value(step, l, 0, ((b * C + c) * s.h + y) * s.w + x) : 0.0);
            }
        if (L.bias()) row.push_back(1);
        rows.push_back(row);
      }
  return rows;
}

// Per-sample output gradient g-hat (the gradient of the summed loss) of global row/location r.
double ghat(int step, int l, long long index) {
  return 0.5 * value(step, l, 1, index);
}

Mat reference_a(const Layer& L, int step, int l) {
  const Mat rows = activation_rows(L, step, l);
  Mat A = zeros(L.a_dim(), L.a_dim());
  for (const auto& r : rows)
    for (int i = 0; i < L.a_dim(); ++i)
      for (int j = 0; j < L.a_dim(); ++j) A[i][j] += r[i] * r[j] / static_cast<double>(rows.size());
  return A;
}

// Dense: G = ghat^T ghat / N. Conv2d: G = sum over samples and locations of ghat ghat^T / B.
Mat reference_g(const Layer& L, int step, int l) {
  const ConvShape s;
  const int S = L.kind() == LayerKind::dense ? 1 : L.out_h(s.h) * L.out_w(s.w);
  const int d = L.g_dim();
  Mat G = zeros(d, d);
  for (int b = 0; b < kBatch; ++b)
    for (int loc = 0; loc < S; ++loc)
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) {
          // NCHW index of (b, channel, location) for Conv2d; row-major (b, channel) for Dense.
          const long long ii = (static_cast<long long>(b) * d + i) * S + loc;
          const long long jj = (static_cast<long long>(b) * d + j) * S + loc;
          G[i][j] += ghat(step, l, ii) * ghat(step, l, jj) / kBatch;
        }
  return G;
}

double grad_value(int step, int l, int i, int j) {
  return value(step, l, 2, i * 31 + j);
}

// ---- what the ranks pass ------------------------------------------------------------------

template <class T>
using DeviceMatrixR = Kokkos::View<T**, Kokkos::LayoutRight, TestMem>;
template <class T>
using Device4 = Kokkos::View<T****, Kokkos::LayoutRight, TestMem>;

struct Share {
  int first, count;
};
Share share() {
  const int P = world_size(), r = world_rank();
  return {r * kBatch / P, kBatch / P};
}

template <class T>
Device4<T> conv_input(const Layer& L, int step, int l) {
  const ConvShape s;
  const Share sh = share();
  Device4<T> x("x", sh.count, L.in_channels(), s.h, s.w);
  auto h = Kokkos::create_mirror_view(x);
  for (int b = 0; b < sh.count; ++b)
    for (int c = 0; c < L.in_channels(); ++c)
      for (int y = 0; y < s.h; ++y)
        for (int z = 0; z < s.w; ++z)
          h(b, c, y, z) =
              static_cast<T>(value(step, l, 0, (((sh.first + b) * L.in_channels() + c) * s.h + y) * s.w + z));
  Kokkos::deep_copy(x, h);
  return x;
}

// Local gradients of the mean loss over this rank's samples: g-hat / (local samples).
template <class T>
Device4<T> conv_output_grad(const Layer& L, int step, int l) {
  const ConvShape s;
  const Share sh = share();
  const int oh = L.out_h(s.h), ow = L.out_w(s.w), d = L.g_dim();
  Device4<T> g("dy", sh.count, d, oh, ow);
  auto h = Kokkos::create_mirror_view(g);
  for (int b = 0; b < sh.count; ++b)
    for (int c = 0; c < d; ++c)
      for (int loc = 0; loc < oh * ow; ++loc)
        h(b, c, loc / ow, loc % ow) =
            static_cast<T>(ghat(step, l, ((static_cast<long long>(sh.first + b) * d + c) * oh * ow) + loc) / sh.count);
  Kokkos::deep_copy(g, h);
  return g;
}

template <class T>
DeviceMatrixR<T> dense_input(const Layer& L, int step, int l) {
  const Share sh = share();
  return kdist_test::device_matrix<T, Kokkos::LayoutRight>(
      "x", sh.count, L.inputs(), [&](int r, int j) { return value(step, l, 0, (sh.first + r) * L.inputs() + j); });
}
template <class T>
DeviceMatrixR<T> dense_output_grad(const Layer& L, int step, int l) {
  const Share sh = share();
  return kdist_test::device_matrix<T, Kokkos::LayoutRight>("dy", sh.count, L.g_dim(), [&](int r, int j) {
    return ghat(step, l, static_cast<long long>(sh.first + r) * L.g_dim() + j) / sh.count;
  });
}

template <class T>
using Grad = typename Preconditioner<T, TestMem>::Gradient;

template <class T>
std::vector<Grad<T>> gradients(const std::vector<Layer>& layers, int step) {
  std::vector<Grad<T>> g;
  for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
    const Layer& L = layers[static_cast<std::size_t>(l)];
    Grad<T> x;
    x.weight = kdist_test::device_matrix<T, Kokkos::LayoutRight>(
        "dW", L.outputs(), L.inputs(), [&](int i, int j) { return grad_value(step, l, i, j); });
    if (L.bias())
      x.bias = kdist_test::device_vector<T>("db", [&] {
        std::vector<T> v;
        for (int i = 0; i < L.outputs(); ++i) v.push_back(static_cast<T>(grad_value(step, l, i, 99)));
        return v;
      }());
    g.push_back(x);
  }
  return g;
}

template <class T>
void run_hooks(Preconditioner<T, TestMem>& kfac, const std::vector<Layer>& layers, int step) {
  TestExec exec;
  const int L = static_cast<int>(layers.size());
  for (int l = 0; l < L; ++l) {
    if (layers[static_cast<std::size_t>(l)].kind() == LayerKind::dense)
      kfac.on_forward(exec, l, dense_input<T>(layers[static_cast<std::size_t>(l)], step, l));
    else
      kfac.on_forward(exec, l, conv_input<T>(layers[static_cast<std::size_t>(l)], step, l));
  }
  for (int l = L - 1; l >= 0; --l) {
    if (layers[static_cast<std::size_t>(l)].kind() == LayerKind::dense)
      kfac.on_backward(exec, l, dense_output_grad<T>(layers[static_cast<std::size_t>(l)], step, l));
    else
      kfac.on_backward(exec, l, conv_output_grad<T>(layers[static_cast<std::size_t>(l)], step, l));
  }
}

// Flattened [dW | db] per layer after each step.
template <class T>
std::vector<std::vector<double>> train(Preconditioner<T, TestMem>& kfac, const std::vector<Layer>& layers, int first,
                                       int steps) {
  std::vector<std::vector<double>> out;
  for (int s = first; s < first + steps; ++s) {
    run_hooks(kfac, layers, s);
    auto g = gradients<T>(layers, s);
    kfac.step(TestExec(), g);
    std::vector<double> flat;
    for (const auto& x : g) {
      const auto w = kdist_test::to_host(x.weight);
      for (std::size_t i = 0; i < w.extent(0); ++i)
        for (std::size_t j = 0; j < w.extent(1); ++j) flat.push_back(w(i, j));
      const auto b = kdist_test::to_host(x.bias);
      for (std::size_t i = 0; i < b.extent(0); ++i) flat.push_back(b(i));
    }
    out.push_back(flat);
  }
  return out;
}

// The reference: the same steps, densely in double.
std::vector<std::vector<double>> reference(const std::vector<Layer>& layers, const Options& o, int steps) {
  const int L = static_cast<int>(layers.size());
  std::vector<Mat> A, G, Ainv, Ginv;
  for (const Layer& l : layers) {
    A.push_back(identity(l.a_dim()));
    G.push_back(identity(l.g_dim()));
  }
  Ainv = A;
  Ginv = G;
  std::vector<std::vector<double>> out;
  for (int s = 0; s < steps; ++s) {
    if (s % o.factor_every == 0)
      for (int l = 0; l < L; ++l) {
        const Mat a = reference_a(layers[l], s, l), g = reference_g(layers[l], s, l);
        for (std::size_t i = 0; i < a.size(); ++i)
          for (std::size_t j = 0; j < a.size(); ++j)
            A[l][i][j] = o.factor_decay * A[l][i][j] + (1 - o.factor_decay) * a[i][j];
        for (std::size_t i = 0; i < g.size(); ++i)
          for (std::size_t j = 0; j < g.size(); ++j)
            G[l][i][j] = o.factor_decay * G[l][i][j] + (1 - o.factor_decay) * g[i][j];
      }
    if (s % o.inverse_every == 0)
      for (int l = 0; l < L; ++l) {
        Mat a = A[l], g = G[l];
        for (std::size_t i = 0; i < a.size(); ++i) a[i][i] += o.damping;
        for (std::size_t i = 0; i < g.size(); ++i) g[i][i] += o.damping;
        Ainv[l] = inverse(a);
        Ginv[l] = inverse(g);
      }
    std::vector<Mat> V;
    double dot = 0;
    for (int l = 0; l < L; ++l) {
      const Layer& Ly = layers[l];
      Mat X = zeros(Ly.outputs(), Ly.a_dim());
      for (int i = 0; i < Ly.outputs(); ++i) {
        for (int j = 0; j < Ly.inputs(); ++j) X[i][j] = grad_value(s, l, i, j);
        if (Ly.bias()) X[i][Ly.inputs()] = grad_value(s, l, i, 99);
      }
      V.push_back(matmul(matmul(Ginv[l], X), Ainv[l]));
      for (int i = 0; i < Ly.outputs(); ++i)
        for (int j = 0; j < Ly.a_dim(); ++j) dot += V[l][i][j] * X[i][j];
    }
    const double sv = std::abs(dot) * o.lr * o.lr;
    const double nu = o.kl_clip > 0 && sv > 0 ? std::min(1.0, std::sqrt(o.kl_clip / sv)) : 1.0;
    std::vector<double> flat;
    for (int l = 0; l < L; ++l) {
      const Layer& Ly = layers[l];
      for (int i = 0; i < Ly.outputs(); ++i)
        for (int j = 0; j < Ly.inputs(); ++j) flat.push_back(nu * V[l][i][j]);
      if (Ly.bias())
        for (int i = 0; i < Ly.outputs(); ++i) flat.push_back(nu * V[l][i][Ly.inputs()]);
    }
    out.push_back(flat);
  }
  return out;
}

double max_relative(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

Options base_options() {
  Options o;
  o.damping = 0.05;
  o.factor_decay = 0.8;
  o.kl_clip = 0.0;
  o.profile_steps = 1;
  return o;
}

}  // namespace

TEST_CASE("kfac: preconditioned gradients equal the dense double reference for every strategy", "[kfac]") {
  const auto layers = network();
  const int steps = 4;
  struct Variant {
    const char* name;
    Options options;
  };
  std::vector<Variant> variants;
  for (Strategy s : {Strategy::spd, Strategy::mpdkfac, Strategy::dkfac}) {
    Options o = base_options();
    o.strategy = s;
    variants.push_back({to_string(s), o});
  }
  for (comm::Planner p : {comm::Planner::none, comm::Planner::threshold, comm::Planner::mgwfbp}) {
    Options o = base_options();
    o.planner = p;
    o.threshold_bytes = 200;
    variants.push_back({comm::to_string(p), o});
  }
  {
    // The default splits the preconditioning into column blocks (at 3 ranks the last rank of the
    // 4-column layer has none); this computes all of it on every rank.
    Options o = base_options();
    o.split_preconditioning = false;
    variants.push_back({"preconditioning on every rank", o});
  }
  {
    Options o = base_options();
    o.placement = PlacementKind::channel;
    variants.push_back({"channel placement", o});
  }
  {
    Options o = base_options();
    o.placement = PlacementKind::optimal;
    o.inverse_method = InverseMethod::eigen;
    o.kl_clip = 1e-3;
    o.factor_every = 2;
    o.inverse_every = 3;
    variants.push_back({"optimal placement, eigen, clipped, k1 = 2, k2 = 3", o});
  }
  for (const auto& v : variants) {
    INFO(v.name << " on " << world_size() << " ranks");
    Preconditioner<double, TestMem> kfac(comm::Communicator(MPI_COMM_WORLD), layers, v.options);
    const auto got = train(kfac, layers, 0, steps);
    const auto want = reference(layers, v.options, steps);
    for (int s = 0; s < steps; ++s) {
      INFO("step " << s);
      CHECK(max_relative(got[s], want[s]) < 1e-6);
    }
    CHECK(kfac.stats().steps == steps);
  }
}

TEST_CASE("kfac: float follows the double reference", "[kfac]") {
  const auto layers = network();
  const Options o = base_options();
  Preconditioner<float, TestMem> kfac(comm::Communicator(MPI_COMM_WORLD), layers, o);
  const auto got = train(kfac, layers, 0, 2);
  const auto want = reference(layers, o, 2);
  for (int s = 0; s < 2; ++s) CHECK(max_relative(got[s], want[s]) < 1e-3);
}

TEST_CASE("kfac: at vanishing damping the update is the Kronecker-factored Fisher block's inverse applied", "[kfac]") {
  const std::vector<Layer> layers = {Dense(3, 2, true)};
  Options o = base_options();
  o.damping = 1e-10;
  o.factor_decay = 0;
  Preconditioner<double, TestMem> kfac(comm::Communicator(MPI_COMM_WORLD), layers, o);
  const auto got = train(kfac, layers, 0, 1)[0];
  // F = A (x) G acting on vec(X) column-major: solve F vec(V) = vec(X) densely.
  const Mat A = reference_a(layers[0], 0, 0), G = reference_g(layers[0], 0, 0);
  const int a = layers[0].a_dim(), g = layers[0].g_dim();
  Mat F = zeros(a * g, a * g);
  for (int i = 0; i < a; ++i)
    for (int j = 0; j < a; ++j)
      for (int k = 0; k < g; ++k)
        for (int m = 0; m < g; ++m) F[i * g + k][j * g + m] = A[i][j] * G[k][m];
  const Mat Finv = inverse(F);
  std::vector<double> x(static_cast<std::size_t>(a * g));
  for (int c = 0; c < a; ++c)
    for (int r = 0; r < g; ++r) x[c * g + r] = c < 3 ? grad_value(0, 0, r, c) : grad_value(0, 0, r, 99);
  std::vector<double> want;  // back in [dW | db] order: weight rows, then the bias
  for (int r = 0; r < g; ++r)
    for (int c = 0; c < 3; ++c) {
      double v = 0;
      for (int k = 0; k < a * g; ++k) v += Finv[c * g + r][k] * x[k];
      want.push_back(v);
    }
  for (int r = 0; r < g; ++r) {
    double v = 0;
    for (int k = 0; k < a * g; ++k) v += Finv[3 * g + r][k] * x[k];
    want.push_back(v);
  }
  CHECK(max_relative(got, want) < 1e-6);
}

TEST_CASE("kfac: a resumed run makes bit-identical updates", "[kfac]") {
  const auto layers = network();
  Options o = base_options();
  o.kl_clip = 1e-3;
  o.inverse_every = 2;
  const std::string path = "test_kfac_state.bin";
  Preconditioner<double, TestMem> straight(comm::Communicator(MPI_COMM_WORLD), layers, o);
  train(straight, layers, 0, 3);
  straight.save(path);
  const auto want = train(straight, layers, 3, 3);
  Preconditioner<double, TestMem> resumed(comm::Communicator(MPI_COMM_WORLD), layers, o);
  resumed.load(path);
  CHECK(resumed.steps() == 3);
  const auto got = train(resumed, layers, 3, 3);
  CHECK(got == want);

  // Another layer list, dtype or rank count: a clear error on every rank, nothing changed.
  Preconditioner<double, TestMem> other(comm::Communicator(MPI_COMM_WORLD), {Dense(7, 4, true)}, o);
  CHECK_THROWS_WITH(other.load(path), Catch::Contains("layers"));
  CHECK(other.steps() == 0);
  Preconditioner<float, TestMem> single(comm::Communicator(MPI_COMM_WORLD), layers, o);
  CHECK_THROWS_WITH(single.load(path), Catch::Contains("float32"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(path.c_str());
}

TEST_CASE("kfac: a failed save leaves the previous file intact", "[kfac]") {
  const auto layers = network();
  Preconditioner<double, TestMem> kfac(comm::Communicator(MPI_COMM_WORLD), layers, base_options());
  CHECK_THROWS_AS(kfac.save("/nonexistent-dir/state.bin"), Error);
  train(kfac, layers, 0, 1);  // still usable: the save failed before anything collective broke
}

TEST_CASE("kfac: bad input raises on every rank without a hang", "[kfac][leaks-comm]") {
  const auto layers = network();
  const comm::Communicator world(MPI_COMM_WORLD);
  TestExec exec;
  SECTION("options out of range") {
    for (auto bad : std::vector<std::function<void(Options&)>>{
             [](Options& o) { o.damping = 0; }, [](Options& o) { o.factor_decay = 1; },
             [](Options& o) { o.factor_decay = -0.1; }, [](Options& o) { o.factor_every = 0; },
             [](Options& o) { o.inverse_every = 0; }}) {
      Options o = base_options();
      bad(o);
      auto make = [&](const Options& x) { Preconditioner<double, TestMem> k(world, layers, x); };
      CHECK_THROWS_AS(make(o), InvalidArgument);
    }
  }
  SECTION("unknown layer") {
    Preconditioner<double, TestMem> kfac(world, layers, base_options());
    CHECK_THROWS_WITH(kfac.on_forward(exec, 3, dense_input<double>(layers[1], 0, 1)), Catch::Contains("layer 3"));
  }
  // A rank that fails first tells the others, which may then raise RemoteError carrying its
  // message before they reach the same check themselves: either way the message is there.
  SECTION("hooks out of order, twice, and step too early") {
    Preconditioner<double, TestMem> a(world, layers, base_options());
    CHECK_THROWS_WITH(a.on_forward(exec, 1, dense_input<double>(layers[1], 0, 1)), Catch::Contains("out of order"));
    Preconditioner<double, TestMem> b(world, layers, base_options());
    CHECK_THROWS_WITH(
        [&] {
          b.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
          b.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
        }(),
        Catch::Contains("out of order"));
    Preconditioner<double, TestMem> c(world, layers, base_options());
    auto g = gradients<double>(layers, 0);
    CHECK_THROWS_WITH(c.step(exec, g), Catch::Contains("before every layer's hooks"));
  }
  SECTION("wrong extents and kinds") {
    Preconditioner<double, TestMem> a(world, layers, base_options());
    CHECK_THROWS_WITH(
        [&] {
          a.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
          a.on_forward(exec, 1, dense_input<double>(layers[2], 0, 2));
        }(),
        Catch::Contains("Dense(7, 4"));
    Preconditioner<double, TestMem> b(world, layers, base_options());
    CHECK_THROWS_WITH(b.on_forward(exec, 0, dense_input<double>(layers[1], 0, 1)), Catch::Contains("rank 4"));
    Preconditioner<double, TestMem> c(world, layers, base_options());
    CHECK_THROWS_WITH(
        [&] {
          run_hooks(c, layers, 0);
          auto g = gradients<double>(layers, 0);
          g[1].weight = DeviceMatrixR<double>("dW", 4, 6);
          c.step(exec, g);
        }(),
        Catch::Contains("takes a weight gradient 4 x 7"));
  }
  SECTION("ranks that disagree on the layer list: a mismatch on every rank, not a wrong answer") {
    if (world_size() > 1) {
      const bool odd = world_rank() == 1;
      const std::vector<Layer> mine = {Dense(7, 4, true), Dense(4, odd ? 2 : 3, false)};
      Preconditioner<double, TestMem> kfac(world, mine, base_options());
      CHECK_THROWS_AS(train(kfac, mine, 0, 1), Error);
    }
  }
  SECTION("ranks that disagree on split preconditioning: a mismatch on every rank, not a hang") {
    if (world_size() > 1) {
      // Rank 1 preconditions everything itself; the others wait in the all-gather of the blocks,
      // and rank 1's next operation (the next step's factor reduction) meets it.
      Options o = base_options();
      o.split_preconditioning = world_rank() != 1;
      Preconditioner<double, TestMem> kfac(world, layers, o);
      CHECK_THROWS_AS(train(kfac, layers, 0, 2), Error);
    }
  }
  SECTION("ranks that disagree on the placement: a mismatch on every rank, not a hang") {
    if (world_size() > 1) {
      // Rank 1 broadcasts every inverse from its owner (sequential, all CT); the others place for
      // the channel, which with the default models inverts these small factors everywhere.
      Options o = base_options();
      o.placement = world_rank() == 1 ? PlacementKind::sequential : PlacementKind::channel;
      Preconditioner<double, TestMem> kfac(world, layers, o);
      CHECK_THROWS_AS(train(kfac, layers, 0, 2), Error);
    }
  }
  SECTION("NaN in one rank's activations: that rank names it, the others hear it") {
    Preconditioner<double, TestMem> kfac(world, layers, base_options());
    const bool poisoned = world_rank() == world_size() - 1;
    auto run = [&] {
      kfac.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
      auto x = dense_input<double>(layers[1], 0, 1);
      if (poisoned) kdist_test::fill(Kokkos::subview(x, 0, Kokkos::ALL), [](std::size_t) { return NAN; });
      kfac.on_forward(exec, 1, x);
      kfac.on_forward(exec, 2, dense_input<double>(layers[2], 0, 2));
      for (int l = 2; l >= 0; --l)
        l == 0 ? kfac.on_backward(exec, l, conv_output_grad<double>(layers[0], 0, 0))
               : kfac.on_backward(exec, l, dense_output_grad<double>(layers[l], 0, l));
      auto g = gradients<double>(layers, 0);
      kfac.step(exec, g);
    };
    if (poisoned)
      CHECK_THROWS_AS(run(), NonFiniteError);
    else if (world_size() > 1)
      CHECK_THROWS_WITH(run(),
                        Catch::Contains("layer 1") && Catch::Contains("rank " + std::to_string(world_size() - 1)));
  }
  SECTION("a factor that is not SPD after damping") {
    Options o = base_options();
    const std::string path = "test_kfac_bad_state.bin";
    {
      Preconditioner<double, TestMem> kfac(world, layers, o);
      kfac.save(path);
    }
    if (world_rank() == 0) {
      // Make G2 (factor 3: after A0, A1, A2 of dimensions 13, 8, 4) negative definite: -10 I.
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const std::size_t header_end =
          all.find('\n', all.find('\n') + 1) + 1 + std::stoul(all.substr(all.find('\n') + 1));
      std::size_t offset = header_end;
      for (int d : {13, 8, 4}) offset += static_cast<std::size_t>(d) * d * sizeof(double);
      for (int i = 0; i < 3; ++i) {
        const double v = -10;
        f.seekp(static_cast<std::streamoff>(offset + (i * 3 + i) * sizeof(double)));
        f.write(reinterpret_cast<const char*>(&v), sizeof v);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    Preconditioner<double, TestMem> kfac(world, layers, o);
    kfac.load(path);
    // Step 0 updates the factors: the corrupted G2 is blended (decay 0.8) into -8 I + 0.2 G_new,
    // still not SPD after damping 0.05.

    auto run = [&] {
      run_hooks(kfac, layers, 0);
      auto g = gradients<double>(layers, 0);
      kfac.step(exec, g);
    };
    // The owner (every rank when G2 is NCT) raises NumericalError, the others RemoteError with it.

    CHECK_THROWS_WITH(run(), Catch::Contains("G2") && Catch::Contains("not positive definite"));
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::remove(path.c_str());
  }
}
