// The reference layers of kdist::nn: every layer's input and parameter gradients against central
// differences in double (objective <y, R> for a fixed R, so backward gets dy = R), the forward
// passes against naive host loops, the loss and an SGD step against numbers computed by hand,
// He initialisation, the K-FAC hooks through a real Preconditioner, and the errors.
#include <kdist/nn/activations.hpp>
#include <kdist/nn/conv2d.hpp>
#include <kdist/nn/dense.hpp>
#include <kdist/nn/init.hpp>
#include <kdist/nn/loss.hpp>
#include <kdist/nn/sgd.hpp>

#include <mpi.h>
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <iomanip>
#include <random>
#include <vector>

#include "test_space.hpp"

using namespace kdist;
using kdist_test::TestExec;
using kdist_test::TestMem;
using T2 = nn::Tensor2<double, TestMem>;
using T4 = nn::Tensor4<double, TestMem>;
using Values = std::vector<double>;

namespace {

/// n values uniform in [lo, hi), the same for a seed.
Values random_values(std::size_t n, unsigned seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  Values v(n);
  for (double& x : v) x = u(rng);
  return v;
}

/// Contiguous views in storage (row-major) order, through host mirrors.
template <class V>
void upload(const V& v, const Values& values) {
  REQUIRE(values.size() == v.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i) h.data()[i] = static_cast<typename V::value_type>(values[i]);
  Kokkos::deep_copy(v, h);
}
template <class V>
Values download(const V& v) {
  const auto h = kdist_test::to_host(v);
  return Values(h.data(), h.data() + h.size());
}

double dot(const Values& a, const Values& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double max_relative(const Values& got, const Values& want) {
  REQUIRE(got.size() == want.size());
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

/// d objective / d values[i] by central differences; objective() reads `values` afresh.
Values central_differences(Values& values, const std::function<double()>& objective, double h = 1e-5) {
  Values grad(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double keep = values[i];
    values[i] = keep + h;
    const double plus = objective();
    values[i] = keep - h;
    const double minus = objective();
    values[i] = keep;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

/// Values away from 0 (|x| in [0.2, 1]) and from each other: no kink within a difference step.
Values kink_free_values(std::size_t n, unsigned seed) {
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  Values v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = (order[i] % 2 ? -1.0 : 1.0) * (0.2 + 0.8 * static_cast<double>(order[i]) / static_cast<double>(n));
  return v;
}

/// Backward with dy = r against central differences of <forward(x), r>: for the input at values
/// xv and for each of `params` (a layer's parameters(), set to `values`). Returns forward's output.
template <class Layer, class X, class Y>
Values check_gradients(Layer& layer, const X& x, const Y& y, const X& dx, const Y& dy, Values xv, const Values& r,
                       const std::vector<nn::Parameter<double, TestMem>>& params = {},
                       std::vector<Values> values = {}) {
  TestExec exec;
  REQUIRE(params.size() == values.size());
  auto objective = [&] {
    upload(x, xv);
    for (std::size_t i = 0; i < params.size(); ++i) upload(params[i].value, values[i]);
    layer.forward(exec, x, y);
    return dot(download(y), r);
  };
  objective();
  const Values yv = download(y);
  upload(dy, r);
  layer.backward(exec, dy, dx);
  CHECK(max_relative(download(dx), central_differences(xv, objective)) < 1e-6);
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].name);
    const Values analytic = download(params[i].gradient);
    CHECK(max_relative(analytic, central_differences(values[i], objective)) < 1e-6);
  }
  return yv;
}

}  // namespace

TEST_CASE("nn::Dense: forward is x W^T + b, gradients match central differences", "[nn]") {
  TestExec exec;
  const int B = 3, in = 4, out = 5;
  for (bool bias : {true, false}) {
    INFO((bias ? "with" : "without") << " bias");
    nn::Dense<double, TestMem> layer(in, out, bias);
    CHECK(layer.kfac_layer().describe() == kfac::Dense(in, out, bias).describe());
    const Values xv = random_values(B * in, 1), wv = random_values(out * in, 2), bv = random_values(out, 3);
    const Values r = random_values(B * out, 4);
    T2 x("x", B, in), y("y", B, out), dx("dx", B, in), dy("dy", B, out);
    const auto params = layer.parameters();
    REQUIRE(params.size() == (bias ? 2 : 1));
    const Values yv = check_gradients(layer, x, y, dx, dy, xv, r, params,
                                      bias ? std::vector<Values>{wv, bv} : std::vector<Values>{wv});
    for (int i = 0; i < B; ++i)
      for (int o = 0; o < out; ++o) {
        double s = bias ? bv[o] : 0;
        for (int k = 0; k < in; ++k) s += xv[i * in + k] * wv[o * in + k];
        CHECK(yv[i * out + o] == Approx(s).epsilon(1e-13).margin(1e-13));
      }
    // gradient() is the same storage, in kfac's shapes.
    const auto g = layer.gradient();
    CHECK(g.weight.data() == layer.weight_gradient().data());
    CHECK(g.bias.extent(0) == (bias ? std::size_t(out) : 0));
    const Values gw = download(layer.weight_gradient());
    layer.backward(exec, dy);  // the first layer: no input gradient
    CHECK(download(layer.weight_gradient()) == gw);
  }
}

// A layer whose gradients moved into the caller's storage computes the same gradients there, and
// nothing outside it: a twin layer keeps its own, sentinels border the storage.
TEST_CASE("nn: use_gradient_storage moves dW and db into the caller's storage", "[nn]") {
  TestExec exec;
  const int B = 2;
  const auto run = [&](auto& layer, auto& twin, const auto& x, const auto& y, const auto& dy) {
    const std::size_t n = layer.parameter_count();
    REQUIRE(n == layer.weight().size() + layer.bias().size());
    const Values w = random_values(layer.weight().size(), 11), b = random_values(layer.bias().size(), 12);
    for (auto* l : {&layer, &twin}) {
      upload(l->weight(), w);
      if (b.size()) upload(l->bias(), b);
    }
    // A first backward on the own storage: its gradients must be carried over.
    layer.forward(exec, x, y);
    layer.backward(exec, dy);
    const Values before = download(layer.weight_gradient());
    nn::Tensor1<double, TestMem> border("border", n + 2);
    Kokkos::deep_copy(border, 7.0);
    const nn::Tensor1<double, TestMem> storage(border.data() + 1, n);
    const double* own = layer.weight_gradient().data();
    REQUIRE_THROWS_WITH(layer.use_gradient_storage(exec, nn::Tensor1<double, TestMem>(border.data(), n + 1)),
                        Catch::Contains("use_gradient_storage") && Catch::Contains(layer.describe()));
    CHECK(layer.weight_gradient().data() == own);  // refused: nothing changed
    layer.use_gradient_storage(exec, storage);
    CHECK(layer.weight_gradient().data() == storage.data());
    CHECK(layer.parameters().front().gradient.data() == storage.data());
    CHECK(download(layer.weight_gradient()) == before);
    // New inputs: the gradients land in the storage, equal to the twin's bit for bit.
    upload(x, random_values(x.size(), 13));
    upload(dy, random_values(dy.size(), 14));
    for (auto* l : {&layer, &twin}) {
      l->forward(exec, x, y);
      l->backward(exec, dy);
    }
    CHECK(download(layer.weight_gradient()) == download(twin.weight_gradient()));
    CHECK(download(layer.bias_gradient()) == download(twin.bias_gradient()));
    const Values all = download(border);
    Values want{7.0};
    for (const double v : download(twin.weight_gradient())) want.push_back(v);
    for (const double v : download(twin.bias_gradient())) want.push_back(v);
    want.push_back(7.0);
    CHECK(all == want);
  };
  for (bool bias : {true, false}) {
    INFO((bias ? "with" : "without") << " bias");
    nn::Dense<double, TestMem> dense(4, 3, bias), dense_twin(4, 3, bias);
    T2 x("x", B, 4), y("y", B, 3), dy("dy", B, 3);
    upload(x, random_values(x.size(), 15));
    upload(dy, random_values(dy.size(), 16));
    run(dense, dense_twin, x, y, dy);
    nn::Conv2d<double, TestMem> conv(2, 3, 3, 3, 1, 1, bias), conv_twin(2, 3, 3, 3, 1, 1, bias);
    T4 cx("cx", B, 2, 4, 4), cy("cy", B, 3, 4, 4), cdy("cdy", B, 3, 4, 4);
    upload(cx, random_values(cx.size(), 17));
    upload(cdy, random_values(cdy.size(), 18));
    run(conv, conv_twin, cx, cy, cdy);
  }
}

TEST_CASE("nn::Conv2d: stride 2, padding 1, a 3x2 kernel: forward and gradients", "[nn]") {
  const int B = 2, C = 2, H = 5, W = 6, O = 3, KH = 3, KW = 2, S = 2, P = 1;
  const int OH = (H + 2 * P - KH) / S + 1, OW = (W + 2 * P - KW) / S + 1;  // 3 x 4
  for (bool bias : {true, false}) {
    INFO((bias ? "with" : "without") << " bias");
    nn::Conv2d<double, TestMem> conv(C, O, KH, KW, S, P, bias);
    CHECK(conv.kfac_layer().describe() == kfac::Conv2d(C, O, KH, KW, S, P, bias).describe());
    REQUIRE(conv.weight().extent(0) == std::size_t(O));
    REQUIRE(conv.weight().extent(1) == std::size_t(C * KH * KW));
    const Values xv = random_values(B * C * H * W, 5), wv = random_values(O * C * KH * KW, 6);
    const Values bv = random_values(O, 7), r = random_values(B * O * OH * OW, 8);
    T4 x("x", B, C, H, W), y("y", B, O, OH, OW), dx("dx", B, C, H, W), dy("dy", B, O, OH, OW);
    const Values yv = check_gradients(conv, x, y, dx, dy, xv, r, conv.parameters(),
                                      bias ? std::vector<Values>{wv, bv} : std::vector<Values>{wv});
    for (int b = 0; b < B; ++b)
      for (int o = 0; o < O; ++o)
        for (int i = 0; i < OH; ++i)
          for (int j = 0; j < OW; ++j) {
            double s = bias ? bv[o] : 0;
            for (int c = 0; c < C; ++c)
              for (int p = 0; p < KH; ++p)
                for (int q = 0; q < KW; ++q) {
                  const int h = i * S - P + p, w = j * S - P + q;
                  if (h >= 0 && h < H && w >= 0 && w < W)
                    s += xv[((b * C + c) * H + h) * W + w] * wv[o * C * KH * KW + (c * KH + p) * KW + q];
                }
            CHECK(yv[((b * O + o) * OH + i) * OW + j] == Approx(s).epsilon(1e-13).margin(1e-13));
          }
  }
}

TEST_CASE("nn::Conv2d: a batch run in several chunks equals its images run one at a time", "[nn]") {
  // 20x20 outputs x a C*25-column patch x 8 bytes per image against the host's 512 KiB chunk:
  // C = 8, 640 KiB: each image alone in its chunk (the in-place single-image path); C = 2,
  // 156 KiB: chunks of 3, 3 and 1 images (the multi-image path, chunks starting past image 0).
  // dW is accumulated over the chunks either way.
  const int C = GENERATE(8, 2);
  const int B = C == 8 ? 3 : 7, H = 20, W = 20, O = 4, K = 5, P = 2;
  INFO("batch " << B << ", " << C << " channels");
  TestExec exec;
  nn::Conv2d<double, TestMem> batch(C, O, K, K, 1, P), single(C, O, K, K, 1, P);
  const Values wv = random_values(O * C * K * K, 31), bv = random_values(O, 32);
  for (auto* conv : {&batch, &single}) {
    upload(conv->weight(), wv);
    upload(conv->bias(), bv);
  }
  const Values xv = random_values(B * C * H * W, 33), rv = random_values(B * O * H * W, 34);
  const T4 x = kdist_test::device_nchw<double>("x", B, C, H, W, xv);
  const T4 r = kdist_test::device_nchw<double>("dy", B, O, H, W, rv);
  T4 y("y", B, O, H, W), dx("dx", B, C, H, W);
  batch.forward(exec, x, y);
  batch.backward(exec, r, dx);
  const Values y_batch = download(y), dx_batch = download(dx);
  Values dw_sum(wv.size(), 0.0), db_sum(bv.size(), 0.0), y_images, dx_images;
  const std::size_t in = std::size_t(C) * H * W, out = std::size_t(O) * H * W;
  for (int b = 0; b < B; ++b) {
    const T4 xb =
        kdist_test::device_nchw<double>("xb", 1, C, H, W, Values(xv.begin() + b * in, xv.begin() + (b + 1) * in));
    const T4 rb =
        kdist_test::device_nchw<double>("rb", 1, O, H, W, Values(rv.begin() + b * out, rv.begin() + (b + 1) * out));
    T4 yb("yb", 1, O, H, W), dxb("dxb", 1, C, H, W);
    single.forward(exec, xb, yb);
    single.backward(exec, rb, dxb);
    const Values ybv = download(yb), dxbv = download(dxb), dw = download(single.weight_gradient()),
                 db = download(single.bias_gradient());
    y_images.insert(y_images.end(), ybv.begin(), ybv.end());
    dx_images.insert(dx_images.end(), dxbv.begin(), dxbv.end());
    for (std::size_t i = 0; i < dw.size(); ++i) dw_sum[i] += dw[i];
    for (std::size_t i = 0; i < db.size(); ++i) db_sum[i] += db[i];
  }
  CHECK(max_relative(y_batch, y_images) <= 1e-13);
  CHECK(max_relative(dx_batch, dx_images) <= 1e-13);
  CHECK(max_relative(download(batch.weight_gradient()), dw_sum) <= 1e-12);
  CHECK(max_relative(download(batch.bias_gradient()), db_sum) <= 1e-12);
}

// A host Conv2d that K-FAC does not read the patches of keeps one chunk's and forms them again in
// backward from a copy of forward's input; attached to a Preconditioner that reads them, it keeps
// the batch's. Either way backward sees the input forward saw, and the gradients agree.
TEST_CASE("nn::Conv2d: backward uses forward's input after the caller changed it, patches kept or formed again",
          "[nn]") {
  TestExec exec;
  const int B = 5, C = 3, H = 9, W = 8, O = 4;  // stride 2: K-FAC forms A from the patches
  const Values xv = random_values(B * C * H * W, 41), wv = random_values(O * C * 9, 42), bv = random_values(O, 43);
  nn::Conv2d<double, TestMem> plain(C, O, 3, 3, 2, 1), changed(C, O, 3, 3, 2, 1), attached(C, O, 3, 3, 2, 1);
  kfac::Options options;
  options.damping = 0.01;
  comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
  kfac::Preconditioner<double, TestMem> kfac(engine, {attached.kfac_layer()}, options);
  attached.attach(&kfac, 0);
  const int OH = 5, OW = 4;
  const T4 dy = kdist_test::device_nchw<double>("dy", B, O, OH, OW, random_values(B * O * OH * OW, 44));
  struct Result {
    Values y, dx, dw, db;
  };
  const auto run = [&](nn::Conv2d<double, TestMem>& conv, bool change_x) {
    upload(conv.weight(), wv);
    upload(conv.bias(), bv);
    const T4 x = kdist_test::device_nchw<double>("x", B, C, H, W, xv);
    T4 y("y", B, O, OH, OW), dx("dx", B, C, H, W);
    conv.forward(exec, x, y);
    if (change_x) Kokkos::deep_copy(x, 1e3);
    conv.backward(exec, dy, dx);
    return Result{download(y), download(dx), download(conv.weight_gradient()), download(conv.bias_gradient())};
  };
  const Result want = run(plain, false), after_change = run(changed, true), kept = run(attached, true);
  CHECK(after_change.y == want.y);
  CHECK(after_change.dx == want.dx);
  CHECK(after_change.dw == want.dw);
  CHECK(after_change.db == want.db);
  CHECK(max_relative(kept.y, want.y) <= 1e-13);
  CHECK(max_relative(kept.dx, want.dx) <= 1e-13);
  CHECK(max_relative(kept.dw, want.dw) <= 1e-13);
  CHECK(max_relative(kept.db, want.db) <= 1e-13);
}

TEMPLATE_TEST_CASE("nn: the device forms of the bias kernels (teams, one thread per entry) equal naive loops", "[nn]",
                   float, double) {
  // Called directly, so a host build tests what a GPU runs. Eighths: every sum exact in float.
  using T = TestType;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> eighths(-16, 16);
  for (const auto& s : {std::array<int, 4>{1, 1, 1, 1}, {3, 5, 7, 2}, {64, 16, 28, 28}, {2, 3, 1, 40}}) {
    const int B = s[0], C = s[1], H = s[2], W = s[3];
    INFO("B " << B << " C " << C << " H " << H << " W " << W);
    Values dy(std::size_t(B) * C * H * W);
    for (double& v : dy) v = eighths(rng) / 8.0;
    const auto dY4 = kdist_test::device_nchw<T>("dy", B, C, H, W, dy);
    nn::Tensor1<T, TestMem> db("db", C);
    nn::impl::channel_sums_teams(TestExec(), dY4, db);
    Values want(C, 0.0);
    for (std::size_t k = 0; k < dy.size(); ++k) want[k / (std::size_t(H) * W) % C] += dy[k];
    CHECK(download(db) == want);

    // A rows x C column-major matrix: column sums, then the bias added to every entry.
    const int rows = B * H * W;
    const auto at = [&](int r, int c) { return dy[std::size_t(c) * rows + r]; };
    const auto Y = kdist_test::device_matrix<T>("Y", rows, C, at);
    nn::impl::column_sums_teams(TestExec(), Y, db);
    for (int c = 0; c < C; ++c) {
      double sum = 0;
      for (int r = 0; r < rows; ++r) sum += at(r, c);
      want[c] = sum;
    }
    CHECK(download(db) == want);
    nn::impl::add_bias_entries(TestExec(), db, Y);
    const auto Yh = kdist_test::to_host(Y);
    bool same = true;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < C; ++c) same = same && double(Yh(r, c)) == double(T(at(r, c) + want[c]));
    CHECK(same);

    // The convolution's output from its column-major product, with and without the bias.
    for (const bool with_bias : {true, false}) {
      INFO("bias " << with_bias);
      const nn::Tensor1<T, TestMem> bias = with_bias ? db : nn::Tensor1<T, TestMem>();
      nn::Tensor4<T, TestMem> y_entries("y entries", B, C, H, W);
      const auto want_y = Kokkos::create_mirror(y_entries);  // a host copy, not an alias
      nn::impl::columns_to_nchw(Kokkos::DefaultHostExecutionSpace(), kdist_test::to_host(Y), kdist_test::to_host(bias),
                                want_y);
      nn::impl::columns_to_nchw_entries(TestExec(), Y, bias, y_entries);
      const Values got = download(y_entries);
      std::size_t differ = 0;  // a count, not the vectors: Catch would print 800 000 values
      for (std::size_t i = 0; i < got.size(); ++i) differ += got[i] == double(want_y.data()[i]) ? 0 : 1;
      CHECK(differ == 0);
    }
  }
}

TEMPLATE_TEST_CASE("nn: the device forms of MaxPool2d (a thread per element) equal the layer, ties and all", "[nn]",
                   float, double) {
  using T = TestType;
  using X4 = nn::Tensor4<T, TestMem>;
  for (const int K : {2, 3}) {
    const int B = 2, C = 3, H = 7, W = 8;  // rows and columns past the last whole window
    INFO("K " << K);
    // Quarters: most windows hold tied maxima. One window has NaN first (it stays the maximum),
    // one has NaN later (it is passed over), as the host kernel's strict > decides.
    Values xv = random_values(B * C * H * W, 31);
    for (double& v : xv) v = std::round(4 * v) / 4;
    xv[0] = std::nan("");
    xv[std::size_t(K) * W + K + 1] = std::nan("");  // row K, column K + 1: window (1, 1), not first
    const int OH = H / K, OW = W / K;
    const Values dyv = random_values(B * C * OH * OW, 32);
    X4 x("x", B, C, H, W), y("y", B, C, OH, OW), dy("dy", B, C, OH, OW), dx("dx", B, C, H, W);
    upload(x, xv);
    upload(dy, dyv);
    upload(dx, Values(xv.size(), -7.0));
    // The layer on the host space (its row kernels), the device forms on TestExec.
    using H4 = nn::Tensor4<T, Kokkos::HostSpace>;
    H4 xh("x", B, C, H, W), yh("y", B, C, OH, OW), dyh("dy", B, C, OH, OW), dxh("dx", B, C, H, W);
    upload(xh, xv);
    upload(dyh, dyv);
    nn::MaxPool2d<T, Kokkos::HostSpace> pool(K);
    const Kokkos::DefaultHostExecutionSpace host;
    pool.forward(host, xh, yh);
    pool.backward(host, dyh, dxh);
    TestExec exec;
    Kokkos::View<int****, Kokkos::LayoutRight, TestMem> argmax("argmax", B, C, OH, OW);
    nn::impl::max_pool_forward_entries(exec, nn::ConstTensor4<T, TestMem>(x), y, argmax, K);
    nn::impl::max_pool_backward_entries(exec, nn::ConstTensor4<T, TestMem>(dy), argmax, dx, K);
    const auto same = [](const Values& a, const Values& b) {  // NaN where the other has NaN
      bool ok = a.size() == b.size();
      for (std::size_t i = 0; ok && i < a.size(); ++i) ok = a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]));
      return ok;
    };
    const Values y_got = download(y), y_want = download(yh);
    CHECK(same(y_got, y_want));
    CHECK(std::isnan(y_want[0]));
    CHECK(same(download(dx), download(dxh)));
  }
}

TEST_CASE("nn::ReLU: forward and gradients away from 0, rank 2 and rank 4", "[nn]") {
  TestExec exec;
  nn::ReLU<double, TestMem> relu;
  const Values xv = kink_free_values(24, 9), r = random_values(24, 10);
  T2 x2("x", 4, 6), y2("y", 4, 6), dx2("dx", 4, 6), dy2("dy", 4, 6);
  const Values yv = check_gradients(relu, x2, y2, dx2, dy2, xv, r);
  for (std::size_t i = 0; i < xv.size(); ++i) CHECK(yv[i] == std::max(xv[i], 0.0));
  T4 x4("x", 2, 3, 2, 2), y4("y", 2, 3, 2, 2), dx4("dx", 2, 3, 2, 2), dy4("dy", 2, 3, 2, 2);
  CHECK(check_gradients(relu, x4, y4, dx4, dy4, xv, r) == yv);
  // A backward of the other rank than the last forward has nothing to read.
  CHECK_THROWS_AS(relu.backward(exec, dy2, dx2), InvalidArgument);
}

TEST_CASE("nn::MaxPool2d: forward takes each window's maximum, the gradient goes to the argmax", "[nn]") {
  const int B = 2, C = 2, H = 5, W = 4, K = 2;  // H = 5: the last row is in no window
  nn::MaxPool2d<double, TestMem> pool(K);
  const Values xv = kink_free_values(B * C * H * W, 11), r = random_values(B * C * (H / K) * (W / K), 12);
  T4 x("x", B, C, H, W), y("y", B, C, H / K, W / K), dx("dx", B, C, H, W), dy("dy", B, C, H / K, W / K);
  const Values yv = check_gradients(pool, x, y, dx, dy, xv, r);
  for (int bc = 0; bc < B * C; ++bc)
    for (int i = 0; i < H / K; ++i)
      for (int j = 0; j < W / K; ++j) {
        double m = -1e300;
        for (int p = 0; p < K; ++p)
          for (int q = 0; q < K; ++q) m = std::max(m, xv[(bc * H + i * K + p) * W + j * K + q]);
        CHECK(yv[(bc * (H / K) + i) * (W / K) + j] == m);
      }
}

// The main job's CNN runs each ReLU after its pool (examples/fashion_mnist/model.hpp): the same
// outputs and input gradients bit for bit, with windows all negative, mixed, ties at 0 and ties
// between equal maxima, and float.
TEMPLATE_TEST_CASE("nn: MaxPool2d then ReLU equals ReLU then MaxPool2d, bit for bit", "[nn]", float, double) {
  using X4 = nn::Tensor4<TestType, TestMem>;
  TestExec exec;
  const int B = 3, C = 4, H = 6, W = 8, K = 2;
  Values xv = random_values(B * C * H * W, 21);
  for (std::size_t i = 0; i < xv.size(); ++i) {
    if (i % 7 == 0) xv[i] = 0;                                   // ties at 0
    if (i % 11 == 0) xv[i] = xv[i / 2];                          // some equal maxima
    if ((i / (2 * W)) % 3 == 0) xv[i] = -std::abs(xv[i]) - 0.1;  // window rows with nothing positive
  }
  const Values dyv = random_values(B * C * (H / K) * (W / K), 22);
  auto run = [&](bool pool_first) {
    nn::ReLU<TestType, TestMem> relu;
    nn::MaxPool2d<TestType, TestMem> pool(K);
    X4 x("x", B, C, H, W), full("full", B, C, H, W), half("half", B, C, H / K, W / K), y("y", B, C, H / K, W / K),
        dy("dy", B, C, H / K, W / K), dhalf("dhalf", B, C, H / K, W / K), dfull("dfull", B, C, H, W),
        dx("dx", B, C, H, W);
    upload(x, xv);
    upload(dy, dyv);
    if (pool_first) {
      pool.forward(exec, x, half);
      relu.forward(exec, nn::ConstTensor4<TestType, TestMem>(half), y);
      relu.backward(exec, dy, dhalf);
      pool.backward(exec, dhalf, dx);
    } else {
      relu.forward(exec, nn::ConstTensor4<TestType, TestMem>(x), full);
      pool.forward(exec, full, y);
      pool.backward(exec, dy, dfull);
      relu.backward(exec, dfull, dx);
    }
    return std::make_pair(download(y), download(dx));
  };
  const auto before = run(false), after = run(true);
  CHECK(after.first == before.first);
  CHECK(after.second == before.second);
  CHECK(std::count(before.second.begin(), before.second.end(), 0.0) < static_cast<long>(before.second.size()));
}

TEST_CASE("nn::Flatten: views of the same storage both ways; a strided gradient is copied", "[nn]") {
  TestExec exec;
  nn::Flatten<double, TestMem> flatten;
  const Values xv = random_values(2 * 3 * 2 * 2, 13);
  T4 x("x", 2, 3, 2, 2);
  upload(x, xv);
  const auto f = flatten.forward(exec, x);
  CHECK(f.data() == x.data());
  CHECK(f.extent(0) == 2);
  CHECK(f.extent(1) == 12);
  CHECK(download(f) == xv);
  T2 dy("dy", 2, 12);
  const auto back = flatten.backward(exec, dy);
  CHECK(back.data() == dy.data());
  CHECK(back.extent(1) == 3);
  CHECK(back.extent(3) == 2);
  // Columns 0..11 of a 2 x 16 matrix: LayoutRight but strided, so backward copies.
  T2 wide("wide", 2, 16);
  upload(wide, random_values(32, 14));
  const auto strided = Kokkos::subview(wide, Kokkos::ALL, Kokkos::make_pair(0, 12));
  const auto copied = flatten.backward(exec, strided);
  CHECK(copied.data() != wide.data());
  const Values all = download(wide), got = download(copied);
  for (int b = 0; b < 2; ++b)
    for (int k = 0; k < 12; ++k) CHECK(got[b * 12 + k] == all[b * 16 + k]);
  CHECK_THROWS_WITH(flatten.backward(exec, T2("dy", 2, 13)), Catch::Contains("2 x 12"));
}

TEST_CASE("nn::SoftmaxCrossEntropy: a hand-computed loss, gradients, accuracy", "[nn]") {
  TestExec exec;
  nn::SoftmaxCrossEntropy<double, TestMem> loss;
  SECTION("known values") {
    // Row 0 [1000, 1001, 1002], label 2: log(e^1000 + e^1001 + e^1002) - 1002 = log(1 + e^-1 + e^-2)
    //   = 0.4076059644443804 (needs the max shift: e^1000 overflows).
    // Row 1 [0, 0, 0], label 1: log 3 = 1.0986122886681098. Mean: 0.7531091265562451.
    const T2 logits = kdist_test::device_matrix<double, Kokkos::LayoutRight>(
        "logits", 2, 3, [](int i, int k) { return i == 0 ? 1000.0 + k : 0.0; });
    const auto labels = kdist_test::device_vector<int>("labels", {2, 1});
    const double l = loss.forward(exec, logits, labels);
    INFO(std::setprecision(17) << l);
    CHECK(l == Approx(0.7531091265562451).epsilon(1e-14));
    // Gradient: (softmax - onehot) / 2. softmax of row 0 = [e^-2, e^-1, 1] / (1 + e^-1 + e^-2)
    //   = [0.09003057317038046, 0.24472847105479764, 0.6652409557748218]; of row 1 = 1/3 each.
    T2 d("dlogits", 2, 3);
    loss.backward(exec, d);
    const Values want = {0.09003057317038046 / 2,
                         0.24472847105479764 / 2,
                         (0.6652409557748218 - 1) / 2,
                         1.0 / 6,
                         (1.0 / 3 - 1) / 2,
                         1.0 / 6};
    const Values got = download(d);
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-12));
    // Row 0's argmax is 2 (right); row 1 ties, the first maximum 0 wins (wrong).
    CHECK(loss.correct(exec, logits, labels) == 1);
  }
  SECTION("gradient matches central differences") {
    const int B = 4, K = 5;
    Values zv = random_values(B * K, 15, -3, 3);
    const auto labels = kdist_test::device_vector<int>("labels", {4, 0, 2, 2});
    T2 z("z", B, K), d("dz", B, K);
    auto objective = [&] {
      upload(z, zv);
      return loss.forward(exec, z, labels);
    };
    objective();
    loss.backward(exec, d);
    CHECK(max_relative(download(d), central_differences(zv, objective)) < 1e-6);
  }
}

TEST_CASE("nn: a small network's gradients match central differences end to end", "[nn]") {
  // conv -> relu -> pool -> flatten -> dense -> softmax cross-entropy, checked on the conv weight.
  TestExec exec;
  const int B = 2;
  nn::Conv2d<double, TestMem> conv(1, 2, 3, 3, 1, 1);
  nn::ReLU<double, TestMem> relu;
  nn::MaxPool2d<double, TestMem> pool(2);
  nn::Flatten<double, TestMem> flatten;
  nn::Dense<double, TestMem> dense(2 * 2 * 2, 3);
  nn::SoftmaxCrossEntropy<double, TestMem> loss;
  nn::he_init(exec, conv, 1);
  nn::he_init(exec, dense, 2);
  upload(dense.bias(), {0.1, -0.2, 0.3});
  const T4 x = kdist_test::device_nchw<double>("x", B, 1, 4, 4, random_values(B * 16, 16));
  const auto labels = kdist_test::device_vector<int>("labels", {0, 2});
  T4 c("c", B, 2, 4, 4), a("a", B, 2, 4, 4), p("p", B, 2, 2, 2), dc("dc", B, 2, 4, 4), da("da", B, 2, 4, 4);
  T2 z("z", B, 3), dz("dz", B, 3), dflat("dflat", B, 8);
  Values wv = download(conv.weight());
  auto objective = [&] {
    upload(conv.weight(), wv);
    conv.forward(exec, x, c);
    relu.forward(exec, c, a);
    pool.forward(exec, a, p);
    dense.forward(exec, flatten.forward(exec, p), z);
    return loss.forward(exec, z, labels);
  };
  objective();
  loss.backward(exec, dz);
  dense.backward(exec, dz, dflat);
  pool.backward(exec, flatten.backward(exec, dflat), da);
  relu.backward(exec, da, dc);
  conv.backward(exec, dc);
  CHECK(max_relative(download(conv.weight_gradient()), central_differences(wv, objective)) < 1e-6);
}

TEST_CASE("nn::SGD: momentum and weight decay as PyTorch, against hand-computed steps", "[nn]") {
  TestExec exec;
  const auto w = kdist_test::device_vector<double>("w", {1.0, -2.0});
  const auto g = kdist_test::device_vector<double>("g", {0.5, 0.25});
  nn::SGD<double, TestMem> sgd({{"w", w, g}}, 0.1, 0.9, 0.01);
  // Step 1: g' = g + 0.01 w = [0.51, 0.23]; v = g'; w -= 0.1 v -> [0.949, -2.023].
  sgd.step(exec);
  Values got = download(w);
  CHECK(got[0] == Approx(0.949).epsilon(1e-14));
  CHECK(got[1] == Approx(-2.023).epsilon(1e-14));
  // Step 2: g' = [0.5 + 0.00949, 0.25 - 0.02023] = [0.50949, 0.22977];
  // v = 0.9 [0.51, 0.23] + g' = [0.96849, 0.43677]; w -= 0.1 v -> [0.852151, -2.066677].
  sgd.step(exec);
  got = download(w);
  CHECK(got[0] == Approx(0.852151).epsilon(1e-14));
  CHECK(got[1] == Approx(-2.066677).epsilon(1e-14));
  CHECK(download(g) == Values{0.5, 0.25});  // the gradient is only read

  // parameters_of collects the layers' (weight, gradient) pairs in order.
  nn::Dense<double, TestMem> a(3, 2), b(2, 1, false);
  const auto params = nn::parameters_of(a, b);
  REQUIRE(params.size() == 3);
  CHECK(params[0].value.extent(0) == 6);
  CHECK(params[1].value.data() == a.bias().data());
  CHECK(params[2].gradient.data() == b.weight_gradient().data());
  CHECK_THROWS_WITH((nn::SGD<double, TestMem>(params, -0.1)), Catch::Contains("lr"));
  const auto short_grad = kdist_test::device_vector<double>("g", {0.5});
  CHECK_THROWS_WITH((nn::SGD<double, TestMem>({{"w", w, short_grad}}, 0.1)), Catch::Contains("'w'"));
}

TEST_CASE("nn::he_init: N(0, 2/fan_in) from the seed, biases zero", "[nn]") {
  nn::Dense<double, TestMem> a(200, 100), b(200, 100);
  nn::Conv2d<float, TestMem> conv(2, 4, 3, 3);
  upload(a.bias(), Values(100, 1.0));
  nn::he_init(TestExec(), a, 42);
  nn::he_init(TestExec(), b, 42);
  nn::he_init(conv, 7);
  const Values wa = download(a.weight());
  CHECK(wa == download(b.weight()));
  CHECK(download(a.bias()) == Values(100, 0.0));
  double mean = 0, sq = 0;
  for (double v : wa) mean += v / wa.size();
  for (double v : wa) sq += (v - mean) * (v - mean) / wa.size();
  CHECK(std::abs(mean) < 0.01);
  CHECK(std::sqrt(sq) == Approx(std::sqrt(2.0 / 200)).epsilon(0.03));
  nn::he_init(b, 43);
  CHECK(wa != download(b.weight()));
  CHECK_THROWS_AS(nn::he_normal(a.weight(), 0, 1), InvalidArgument);
}

TEST_CASE("nn: float layers run the same network", "[nn]") {
  TestExec exec;
  nn::Dense<float, TestMem> dense(4, 3);
  nn::SoftmaxCrossEntropy<float, TestMem> loss;
  nn::he_init(exec, dense, 3);
  nn::SGD<float, TestMem> sgd(dense.parameters(), 0.5, 0.9);
  const auto x = kdist_test::device_matrix<float, Kokkos::LayoutRight>(
      "x", 6, 4, [](int i, int j) { return (i % 3 == j % 3) - 0.2 * j; });
  const auto labels = kdist_test::device_vector<int>("labels", {0, 1, 2, 0, 1, 2});
  nn::Tensor2<float, TestMem> z("z", 6, 3), dz("dz", 6, 3);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    dense.forward(exec, x, z);
    last = loss.forward(exec, z, labels);
    if (step == 0) first = last;
    loss.backward(exec, dz);
    dense.backward(exec, dz);
    sgd.step(exec);
  }
  CHECK(last < 0.5 * first);
  CHECK(loss.correct(exec, z, labels) == 6);
}

TEST_CASE("nn: Dense and Conv2d attached to a Preconditioner hand its hooks their inputs and output gradients",
          "[nn]") {
  TestExec exec;
  const int B = 4;
  nn::Conv2d<double, TestMem> conv(1, 2, 3, 3, 2, 1);  // 6x6 -> 3x3
  nn::ReLU<double, TestMem> relu;
  nn::Flatten<double, TestMem> flatten;
  nn::Dense<double, TestMem> dense(2 * 3 * 3, 3);
  nn::SoftmaxCrossEntropy<double, TestMem> loss;
  nn::he_init(exec, conv, 1);
  nn::he_init(exec, dense, 2);
  kfac::Options options;
  options.damping = 0.01;
  comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
  kfac::Preconditioner<double, TestMem> kfac(kfac_engine, {conv.kfac_layer(), dense.kfac_layer()}, options);
  conv.attach(&kfac, 0);
  dense.attach(&kfac, 1);
  CHECK(conv.attached() == &kfac);
  nn::SGD<double, TestMem> sgd(nn::parameters_of(conv, dense), 0.1, 0.9);
  const T4 x = kdist_test::device_nchw<double>("x", B, 1, 6, 6, random_values(B * 36, 17));
  const auto labels = kdist_test::device_vector<int>("labels", {0, 1, 2, 1});
  T4 c("c", B, 2, 3, 3), a("a", B, 2, 3, 3), da("da", B, 2, 3, 3), dc("dc", B, 2, 3, 3);
  T2 z("z", B, 3), dz("dz", B, 3), dflat("dflat", B, 18);
  auto forward = [&] {
    conv.forward(exec, x, c);
    relu.forward(exec, c, a);
    dense.forward(exec, flatten.forward(exec, a), z);
    return loss.forward(exec, z, labels);
  };
  auto backward = [&] {
    loss.backward(exec, dz);
    dense.backward(exec, dz, dflat);
    relu.backward(exec, flatten.backward(exec, dflat), dc);
    conv.backward(exec, dc);
  };
  // The reference: a second Preconditioner fed by hand with what the layers should hand theirs
  // (each layer's input and output gradient; the convolution's NCHW input, where the layer hands
  // its patches), preconditioning copies of the same gradients.
  comm::Engine ref_engine{comm::Communicator(MPI_COMM_WORLD)};
  kfac::Preconditioner<double, TestMem> ref(ref_engine, {conv.kfac_layer(), dense.kfac_layer()}, options);
  using Gradient = kfac::Preconditioner<double, TestMem>::Gradient;
  const auto copy_of = [](const Gradient& g) {
    Gradient c{decltype(g.weight)("w", g.weight.extent(0), g.weight.extent(1)),
               decltype(g.bias)("b", g.bias.extent(0))};
    Kokkos::deep_copy(c.weight, g.weight);
    Kokkos::deep_copy(c.bias, g.bias);
    return c;
  };
  const auto max_difference = [](const auto& u, const auto& v) {
    const auto hu = kdist_test::to_host(u);
    const auto hv = kdist_test::to_host(v);
    double d = 0;
    for (std::size_t i = 0; i < hu.span(); ++i) d = std::max(d, std::abs(hu.data()[i] - hv.data()[i]));
    return d;
  };
  for (int step = 0; step < 2; ++step) {
    CHECK(std::isfinite(forward()));
    backward();
    ref.on_forward(exec, 0, x);
    ref.on_forward(exec, 1, flatten.forward(exec, a));
    ref.on_backward(exec, 1, dz);
    ref.on_backward(exec, 0, dc);
    const std::vector<Gradient> by_hand{copy_of(conv.gradient()), copy_of(dense.gradient())};
    REQUIRE_NOTHROW(kfac.step(exec, {conv.gradient(), dense.gradient()}));
    ref.step(exec, by_hand);
    for (int f = 0; f < kfac.factors(); ++f) {
      INFO("step " << step << ", factor " << f);
      CHECK(max_difference(kfac.factor(f), ref.factor(f)) <= 1e-12);
    }
    CHECK(max_difference(conv.gradient().weight, by_hand[0].weight) <= 1e-12);
    CHECK(max_difference(conv.gradient().bias, by_hand[0].bias) <= 1e-12);
    CHECK(max_difference(dense.gradient().weight, by_hand[1].weight) <= 1e-12);
    CHECK(max_difference(dense.gradient().bias, by_hand[1].bias) <= 1e-12);
    sgd.step(exec);
  }
  CHECK(kfac.steps() == 2);
  CHECK(kfac.stats().factor_steps == 2);
  // Detached, the layers run without the preconditioner (its hooks would now be out of order).
  conv.attach(nullptr, -1);
  dense.attach(nullptr, -1);
  forward();
  backward();
}

TEST_CASE("nn: hooks out of order raise the preconditioner's error", "[nn][leaks-comm]") {
  TestExec exec;
  nn::Conv2d<double, TestMem> conv(1, 2, 3, 3, 2, 1);
  nn::Dense<double, TestMem> dense(18, 3);
  const T4 x = kdist_test::device_nchw<double>("x", 2, 1, 6, 6, random_values(72, 18));
  T4 c("c", 2, 2, 3, 3);
  T2 z("z", 2, 3), dz("dz", 2, 3), dflat("dflat", 2, 18);
  const comm::Communicator world(MPI_COMM_WORLD);
  nn::Flatten<double, TestMem> flatten;
  SECTION("a second forward without step") {
    comm::Engine kfac_engine{world};
    kfac::Preconditioner<double, TestMem> kfac(kfac_engine, {conv.kfac_layer(), dense.kfac_layer()});
    conv.attach(&kfac, 0);
    dense.attach(&kfac, 1);
    conv.forward(exec, x, c);
    dense.forward(exec, flatten.forward(exec, c), z);
    dense.backward(exec, dz, dflat);
    conv.backward(exec, flatten.backward(exec, dflat));
    CHECK_THROWS_WITH(conv.forward(exec, x, c), Catch::Contains("out of order"));
  }
  SECTION("layers attached under swapped indices") {
    comm::Engine kfac_engine{world};
    kfac::Preconditioner<double, TestMem> kfac(kfac_engine, {conv.kfac_layer(), dense.kfac_layer()});
    conv.attach(&kfac, 1);
    CHECK_THROWS_WITH(conv.forward(exec, x, c), Catch::Contains("out of order"));
  }
}

TEST_CASE("nn: bad sizes and extents throw InvalidArgument naming the layer and the sizes", "[nn]") {
  TestExec exec;
  CHECK_THROWS_WITH((nn::Dense<double, TestMem>(0, 3)),
                    Catch::Contains("kdist::nn::Dense") && Catch::Contains("Dense(0, 3"));
  CHECK_THROWS_AS((nn::Conv2d<double, TestMem>(1, 2, 3, 3, 1, -1)), InvalidArgument);
  CHECK_THROWS_AS((nn::MaxPool2d<double, TestMem>(0)), InvalidArgument);

  nn::Dense<double, TestMem> dense(4, 5);
  CHECK_THROWS_WITH(dense.backward(exec, T2("dy", 3, 5)), Catch::Contains("before forward"));
  CHECK_THROWS_WITH(dense.forward(exec, T2("x", 3, 7), T2("y", 3, 5)),
                    Catch::Contains("kdist::nn::Dense::forward") && Catch::Contains("'x' (3 x 7)") &&
                        Catch::Contains("3 x 4") && Catch::Contains("Dense(4, 5, bias)"));
  CHECK_THROWS_WITH(dense.forward(exec, T2("x", 3, 4), T2("y", 2, 5)), Catch::Contains("'y' (2 x 5)"));
  T2 shared("shared", 3, 5);
  CHECK_THROWS_WITH(dense.forward(exec, Kokkos::subview(shared, Kokkos::ALL, Kokkos::make_pair(0, 4)), shared),
                    Catch::Contains("share storage"));
  dense.forward(exec, T2("x", 3, 4), T2("y", 3, 5));
  CHECK_THROWS_WITH(dense.backward(exec, T2("dy", 2, 5)), Catch::Contains("'dy' (2 x 5)"));
  CHECK_THROWS_WITH(dense.backward(exec, T2("dy", 3, 5), T2("dx", 3, 5)), Catch::Contains("'dx' (3 x 5)"));

  nn::Conv2d<double, TestMem> conv(2, 3, 3, 2, 2, 1);
  CHECK_THROWS_WITH(conv.backward(exec, T4("dy", 1, 3, 3, 4)), Catch::Contains("before forward"));
  CHECK_THROWS_WITH(conv.forward(exec, T4("x", 2, 1, 5, 6), T4("y", 2, 3, 3, 4)),
                    Catch::Contains("kdist::nn::Conv2d::forward") && Catch::Contains("'x' (2 x 1 x 5 x 6)") &&
                        Catch::Contains("Conv2d(2, 3, 3x2, stride 2, padding 1, bias)"));
  CHECK_THROWS_WITH(conv.forward(exec, T4("x", 2, 2, 5, 6), T4("y", 2, 3, 4, 4)), Catch::Contains("2 x 3 x 3 x 4"));
  nn::Conv2d<double, TestMem> unpadded(2, 3, 3, 2);
  CHECK_THROWS_WITH(unpadded.forward(exec, T4("x", 2, 2, 2, 6), T4("y", 2, 3, 1, 5)),
                    Catch::Contains("does not fit") && Catch::Contains("input 2x6"));
  conv.forward(exec, T4("x", 2, 2, 5, 6), T4("y", 2, 3, 3, 4));
  CHECK_THROWS_WITH(conv.backward(exec, T4("dy", 2, 3, 3, 3)), Catch::Contains("'dy' (2 x 3 x 3 x 3)"));

  nn::MaxPool2d<double, TestMem> pool(2);
  CHECK_THROWS_WITH(pool.forward(exec, T4("x", 1, 2, 5, 4), T4("y", 1, 2, 3, 2)),
                    Catch::Contains("MaxPool2d(2)") && Catch::Contains("1 x 2 x 2 x 2"));
  CHECK_THROWS_WITH(pool.forward(exec, T4("x", 1, 2, 1, 4), T4("y", 1, 2, 0, 2)), Catch::Contains("smaller"));

  nn::ReLU<double, TestMem> relu;
  CHECK_THROWS_WITH(relu.forward(exec, T2("x", 2, 3), T2("y", 3, 2)), Catch::Contains("'y' (3 x 2)"));

  nn::SoftmaxCrossEntropy<double, TestMem> loss;
  CHECK_THROWS_WITH(loss.backward(exec, T2("d", 2, 3)), Catch::Contains("before forward"));
  const auto labels = kdist_test::device_vector<int>("labels", {0, 3});
  CHECK_THROWS_WITH(loss.forward(exec, T2("z", 2, 3), labels),
                    Catch::Contains("1 of the 2 labels") && Catch::Contains("[0, 3)"));
  CHECK_THROWS_WITH(loss.forward(exec, T2("z", 3, 4), labels), Catch::Contains("'labels' (2)"));
}
