// The network, data and dense double reference of the K-FAC tests (test_kfac.cpp,
// test_kfac_state.cpp): a Conv2d + Dense network whose global data is the same on every rank, each
// rank taking its share, and the reference updates computed with naive loops in double.
#pragma once

#include <mpi.h>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <kdist/core/im2col.hpp>
#include <kdist/kfac/preconditioner.hpp>
#include <string>
#include <vector>

#include "test_space.hpp"

namespace kfac_test {

using namespace kdist;
using namespace kdist::kfac;
using kdist_test::TestExec;
using kdist_test::TestMem;

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Deterministic data: the same global value on every rank for (step, layer, what, index).
inline double value(int step, int layer, int what, long long i) {
  const double x = std::sin(0.37 * (i + 1) + 1.3 * step + 2.1 * layer + 0.7 * what);
  return x + 0.25 * std::cos(1.7 * i + 0.3 * what);
}

using Mat = std::vector<std::vector<double>>;
inline Mat zeros(int r, int c) {
  return Mat(static_cast<std::size_t>(r), std::vector<double>(static_cast<std::size_t>(c), 0.0));
}
inline Mat identity(int d) {
  Mat m = zeros(d, d);
  for (int i = 0; i < d; ++i) m[i][i] = 1;
  return m;
}
inline Mat matmul(const Mat& a, const Mat& b) {
  Mat c = zeros(static_cast<int>(a.size()), static_cast<int>(b[0].size()));
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t k = 0; k < b.size(); ++k)
      for (std::size_t j = 0; j < b[0].size(); ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}
// Gauss-Jordan with partial pivoting.
inline Mat inverse(Mat a) {
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

inline std::vector<Layer> network() {
  return {Conv2d(2, 3, 3, 2, 2, 1, true), Dense(7, 4, true), Dense(4, 3, false)};
}

// Global activation rows of a layer: Dense rows x in; Conv2d the naive im2col patches, with the
// ones column when the layer has a bias.
inline Mat activation_rows(const Layer& L, int step, int l) {
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
inline double ghat(int step, int l, long long index) {
  return 0.5 * value(step, l, 1, index);
}

inline Mat reference_a(const Layer& L, int step, int l) {
  const Mat rows = activation_rows(L, step, l);
  Mat A = zeros(L.a_dim(), L.a_dim());
  for (const auto& r : rows)
    for (int i = 0; i < L.a_dim(); ++i)
      for (int j = 0; j < L.a_dim(); ++j) A[i][j] += r[i] * r[j] / static_cast<double>(rows.size());
  return A;
}

// Dense: G = ghat^T ghat / N. Conv2d: G = sum over samples and locations of ghat ghat^T / B.
inline Mat reference_g(const Layer& L, int step, int l) {
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

// salt != 0: another gradient for the same step (a rank's own, under Adasum).
inline double grad_value(int step, int l, int i, int j, int salt = 0) {
  return value(step, l, 2 + 10 * salt, i * 31 + j);
}

// ---- what the ranks pass ------------------------------------------------------------------

template <class T>
using DeviceMatrixR = Kokkos::View<T**, Kokkos::LayoutRight, TestMem>;
template <class T>
using Device4 = Kokkos::View<T****, Kokkos::LayoutRight, TestMem>;

struct Share {
  int first, count;
};
// The ranks the global batch is shared among: the world, or the group a test runs on.
struct Group {
  int rank = -1, size = 0;  // size 0: the world
};
inline Group& data_group() {
  static Group group;
  return group;
}
/// While alive, the data is shared among the ranks of `comm` (a sub-communicator of the world).
struct DataOn {
  explicit DataOn(MPI_Comm comm) {
    MPI_Comm_rank(comm, &data_group().rank);
    MPI_Comm_size(comm, &data_group().size);
  }
  ~DataOn() { data_group() = Group{}; }
  DataOn(const DataOn&) = delete;
  DataOn& operator=(const DataOn&) = delete;
};
/// While alive, the global batch is shared unevenly (P = 2: 7 and 5 rows; 3: 5, 4, 3; 4: 4, 3, 3, 2),
/// as the last batch of an epoch may be.
struct UnevenShares {
  UnevenShares() { on() = true; }
  ~UnevenShares() { on() = false; }
  UnevenShares(const UnevenShares&) = delete;
  UnevenShares& operator=(const UnevenShares&) = delete;
  static bool& on() {
    static bool uneven = false;
    return uneven;
  }
};
/// Rank r's share of the global batch among P ranks.
inline Share share_of(int r, int P) {
  if (!UnevenShares::on() || P == 1) return {r * kBatch / P, kBatch / P};
  const auto count = [P](int q) { return kBatch / P + (q == 0 ? 1 : 0) - (q == P - 1 ? 1 : 0); };
  int first = 0;
  for (int q = 0; q < r; ++q) first += count(q);
  return {first, count(r)};
}
inline int data_ranks() {
  return data_group().size > 0 ? data_group().size : world_size();
}
inline Share share() {
  const Group& g = data_group();
  return share_of(g.size > 0 ? g.rank : world_rank(), data_ranks());
}

/// A layer's gradient entry: output i, input j (j == inputs: the bias).
using GradientValue = std::function<double(const Layer& L, int step, int l, int i, int j)>;

/// Values unrelated to the data (salt != 0: a rank's own, under Adasum).
inline GradientValue independent_gradients(int salt = 0) {
  return [salt](const Layer& L, int step, int l, int i, int j) {
    return grad_value(step, l, i, j < L.inputs() ? j : 99, salt);
  };
}

/// Dense: the mean over rows [first, first + count) of ghat [x 1]ᵀ, what the layer's backward gives
/// for those rows; Conv2d: independent values.
inline double rows_gradient(const Layer& L, int step, int l, int i, int j, Share rows) {
  if (L.kind() != LayerKind::dense) return grad_value(step, l, i, j < L.inputs() ? j : 99);
  double sum = 0;
  for (int r = rows.first; r < rows.first + rows.count; ++r)
    sum += ghat(step, l, static_cast<long long>(r) * L.g_dim() + i) *
           (j < L.inputs() ? value(step, l, 0, static_cast<long long>(r) * L.inputs() + j) : 1.0);
  return sum / rows.count;
}

/// The global batch's mean-loss gradient (Options::low_rank_dense's "rows' mean").
inline GradientValue batch_gradients() {
  return [](const Layer& L, int step, int l, int i, int j) { return rows_gradient(L, step, l, i, j, {0, kBatch}); };
}

/// The mean over the ranks of each rank's mean-loss gradient (DDP's average; the rows' mean when
/// the shares are even).
inline GradientValue ranks_mean_gradients() {
  return [](const Layer& L, int step, int l, int i, int j) {
    const int P = data_ranks();
    double sum = 0;
    for (int r = 0; r < P; ++r) sum += rows_gradient(L, step, l, i, j, share_of(r, P));
    return sum / P;
  };
}

/// This rank's own mean-loss gradient (Gradients::per_rank).
inline GradientValue own_gradients() {
  return [](const Layer& L, int step, int l, int i, int j) { return rows_gradient(L, step, l, i, j, share()); };
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

template <class T, class Layout = Kokkos::LayoutRight>
kdist_test::TestMatrix<T, Layout> dense_input(const Layer& L, int step, int l) {
  const Share sh = share();
  return kdist_test::device_matrix<T, Layout>(
      "x", sh.count, L.inputs(), [&](int r, int j) { return value(step, l, 0, (sh.first + r) * L.inputs() + j); });
}
template <class T, class Layout = Kokkos::LayoutRight>
kdist_test::TestMatrix<T, Layout> dense_output_grad(const Layer& L, int step, int l) {
  const Share sh = share();
  return kdist_test::device_matrix<T, Layout>("dy", sh.count, L.g_dim(), [&](int r, int j) {
    return ghat(step, l, static_cast<long long>(sh.first + r) * L.g_dim() + j) / sh.count;
  });
}

template <class T>
using Grad = typename Preconditioner<T, TestMem>::Gradient;

template <class T>
std::vector<Grad<T>> gradients(const std::vector<Layer>& layers, int step, const GradientValue& value) {
  std::vector<Grad<T>> g;
  for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
    const Layer& L = layers[static_cast<std::size_t>(l)];
    Grad<T> x;
    x.weight = kdist_test::device_matrix<T, Kokkos::LayoutRight>("dW", L.outputs(), L.inputs(),
                                                                 [&](int i, int j) { return value(L, step, l, i, j); });
    if (L.bias())
      x.bias = kdist_test::device_vector<T>("db", [&] {
        std::vector<T> v;
        for (int i = 0; i < L.outputs(); ++i) v.push_back(static_cast<T>(value(L, step, l, i, L.inputs())));
        return v;
      }());
    g.push_back(x);
  }
  return g;
}
template <class T>
std::vector<Grad<T>> gradients(const std::vector<Layer>& layers, int step, int salt = 0) {
  return gradients<T>(layers, step, independent_gradients(salt));
}

/// Conv2d's forward hook as nn::Conv2d calls it: the im2col patches of its input, LayoutLeft, with
/// the ones column appended for a layer with a bias.
template <class T>
void on_forward_from_patches(Preconditioner<T, TestMem>& kfac, int l, const Layer& L, const Device4<T>& x) {
  TestExec exec;
  const kdist::Conv2dGeometry g{static_cast<int>(x.extent(0)),
                                L.in_channels(),
                                static_cast<int>(x.extent(2)),
                                static_cast<int>(x.extent(3)),
                                L.kernel_h(),
                                L.kernel_w(),
                                L.stride(),
                                L.padding()};
  const int ones = L.bias() ? 1 : 0;
  Kokkos::View<T**, Kokkos::LayoutLeft, TestMem> P("patches", g.rows(), g.patch() + ones);
  kdist::im2col(exec, g, x, Kokkos::subview(P, Kokkos::ALL(), std::make_pair(0, g.patch())));
  if (ones) Kokkos::deep_copy(exec, Kokkos::subview(P, Kokkos::ALL(), g.patch()), T(1));
  kfac.on_forward(exec, l, g, P);
}

/// What the hooks are handed: the layers' inputs and output gradients as views (Dense: rows x
/// features, LayoutRight); Conv2d's input as im2col patches (nn::Conv2d's call); or Dense's views in
/// LayoutLeft (a column-major caller's).
enum class Hooks { views, patches, layout_left };

/// One step's hooks.
template <class T>
void run_hooks(Preconditioner<T, TestMem>& kfac, const std::vector<Layer>& layers, int step,
               Hooks hooks = Hooks::views) {
  TestExec exec;
  const int L = static_cast<int>(layers.size());
  for (int l = 0; l < L; ++l) {
    const Layer& layer = layers[static_cast<std::size_t>(l)];
    if (layer.kind() == LayerKind::dense && hooks == Hooks::layout_left)
      kfac.on_forward(exec, l, dense_input<T, Kokkos::LayoutLeft>(layer, step, l));
    else if (layer.kind() == LayerKind::dense)
      kfac.on_forward(exec, l, dense_input<T>(layer, step, l));
    else if (hooks == Hooks::patches)
      on_forward_from_patches(kfac, l, layer, conv_input<T>(layer, step, l));
    else
      kfac.on_forward(exec, l, conv_input<T>(layer, step, l));
  }
  for (int l = L - 1; l >= 0; --l) {
    const Layer& layer = layers[static_cast<std::size_t>(l)];
    if (layer.kind() == LayerKind::dense && hooks == Hooks::layout_left)
      kfac.on_backward(exec, l, dense_output_grad<T, Kokkos::LayoutLeft>(layer, step, l));
    else if (layer.kind() == LayerKind::dense)
      kfac.on_backward(exec, l, dense_output_grad<T>(layer, step, l));
    else
      kfac.on_backward(exec, l, conv_output_grad<T>(layer, step, l));
  }
}

// Flattened [dW | db] per layer after each step.
template <class T>
std::vector<std::vector<double>> train(Preconditioner<T, TestMem>& kfac, const std::vector<Layer>& layers, int first,
                                       int steps, const GradientValue& value, Hooks hooks = Hooks::views) {
  std::vector<std::vector<double>> out;
  for (int s = first; s < first + steps; ++s) {
    run_hooks(kfac, layers, s, hooks);
    auto g = gradients<T>(layers, s, value);
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
template <class T>
std::vector<std::vector<double>> train(Preconditioner<T, TestMem>& kfac, const std::vector<Layer>& layers, int first,
                                       int steps, int salt = 0, Hooks hooks = Hooks::views) {
  return train(kfac, layers, first, steps, independent_gradients(salt), hooks);
}

// The reference: the same steps, densely in double; `factors`, when given, gets the running
// factors at the end, in the preconditioner's order (A_0 .. A_{L-1}, G_{L-1} .. G_0), row-major.
inline std::vector<std::vector<double>> reference(const std::vector<Layer>& layers, const Options& o, int steps,
                                                  std::vector<std::vector<double>>* factors,
                                                  const GradientValue& value) {
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
        for (int j = 0; j < Ly.inputs(); ++j) X[i][j] = value(Ly, s, l, i, j);
        if (Ly.bias()) X[i][Ly.inputs()] = value(Ly, s, l, i, Ly.inputs());
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
  if (factors) {
    factors->clear();
    for (int f = 0; f < 2 * L; ++f) {
      const Mat& F = f < L ? A[f] : G[2 * L - 1 - f];
      std::vector<double> flat;
      for (const auto& row : F) flat.insert(flat.end(), row.begin(), row.end());
      factors->push_back(flat);
    }
  }
  return out;
}

inline std::vector<std::vector<double>> reference(const std::vector<Layer>& layers, const Options& o, int steps,
                                                  std::vector<std::vector<double>>* factors = nullptr, int salt = 0) {
  return reference(layers, o, steps, factors, independent_gradients(salt));
}

inline double max_relative(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

/// A cost-model file (one per rank) in which every inverse costs a second: under lbp at P > 1
/// every factor is then CT, spread over the ranks, where the default models make them all NCT.
inline std::string expensive_inverse_models() {
  CostModelStore store;
  store.set(CostKey{CostOp::spd_inverse, DType::float64, 1, "local"}, CostModel::linear(1.0, 0.0));
  const std::string path = "kfac_test_models." + std::to_string(world_rank()) + ".json";
  store.save(path);
  return path;
}

/// What f throws (its what()), or "" when it returns.
inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

inline Options base_options() {
  Options o;
  o.damping = 0.05;
  o.factor_decay = 0.8;
  o.kl_clip = 0.0;
  o.profile_steps = 1;
  // The tests name which factors are kept as R (measured decides by the BLAS's times: its own
  // test case in test_kfac.cpp).
  o.cholesky_solves = kdist::kfac::CholeskySolves::always;
  return o;
}

}  // namespace kfac_test
