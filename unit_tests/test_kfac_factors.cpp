// kfac/factors.hpp: Dense and Conv2d Kronecker factors in the KFC normalisation against plain
// loops in double (the patch and layout references of reference.hpp, the products here), on
// TestExec / TestMem. Inputs are eighths (exact in float); tolerance relative to the largest
// reference entry, 1e-5 (float) / 1e-12 (double).
#include <catch2/catch.hpp>
#include <kdist/kfac/factors.hpp>
#include <kdist/kfac/impl/kernels.hpp>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "reference.hpp"
#include "test_space.hpp"

using kdist_test::bytes_of;
using kdist_test::ConvShape;
using kdist_test::Dense;
using kdist_test::device_matrix;
using kdist_test::device_nchw;
using kdist_test::eighths;
using kdist_test::TestExec;
using kdist_test::TestMatrix;
using kdist_test::TestMem;
using kdist_test::to_flat;

namespace {

/// scale · [M 1]ᵀ[M 1] (the ones column only with bias) for the n x d row-major M: a triple loop.
Dense gram_ref(const Dense& M, int n, int d, bool bias, double scale) {
  const int m = d + (bias ? 1 : 0);
  Dense out(std::size_t(m) * m, 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < m; ++j) {
      double s = 0;
      for (int r = 0; r < n; ++r)
        s += (i < d ? M[std::size_t(r) * d + i] : 1.0) * (j < d ? M[std::size_t(r) * d + j] : 1.0);
      out[std::size_t(i) * m + j] = scale * s;
    }
  return out;
}

template <class T>
double tolerance() {
  return std::is_same<T, double>::value ? 1e-12 : 1e-5;
}

/// max |factor - ref| / max |ref|, the factor read back row-major.
template <class V>
double relative_error(const V& factor, const Dense& ref) {
  const Dense f = to_flat(factor);
  REQUIRE(f.size() == ref.size());
  double diff = 0;
  for (std::size_t i = 0; i < f.size(); ++i) diff = std::max(diff, std::abs(f[i] - ref[i]));
  return diff / std::max(kdist_test::max_abs(ref), 1e-300);
}

/// A square factor holding -7 everywhere: results must overwrite it, errors must leave it.
template <class T>
TestMatrix<T> stale_factor(const std::string& label, int n) {
  TestMatrix<T> f(label, n, n);
  Kokkos::deep_copy(f, T(-7));
  return f;
}

template <class T, class Layout>
void check_dense(int n, int in, int out, bool bias, std::mt19937_64& rng) {
  const kdist::kfac::Dense layer(in, out, bias);
  const Dense x = eighths(std::size_t(n) * in, rng), dy = eighths(std::size_t(n) * out, rng);
  const auto X = device_matrix<T, Layout>("X", n, in, [&](int r, int c) { return x[std::size_t(r) * in + c]; });
  const auto dY = device_matrix<T, Layout>("dY", n, out, [&](int r, int c) { return dy[std::size_t(r) * out + c]; });
  const auto A = stale_factor<T>("A", layer.a_dim());
  const auto G = stale_factor<T>("G", layer.g_dim());
  kdist::kfac::dense_a_factor(TestExec(), layer, X, A);
  kdist::kfac::dense_g_factor(TestExec(), layer, dY, G);
  INFO(layer.describe() << ", " << n << " rows, "
                        << (std::is_same<Layout, Kokkos::LayoutLeft>::value ? "LayoutLeft" : "LayoutRight"));
  CHECK(relative_error(A, gram_ref(x, n, in, bias, 1.0 / n)) <= tolerance<T>());
  CHECK(relative_error(G, gram_ref(dy, n, out, false, n)) <= tolerance<T>());
}

struct ConvCase {
  ConvShape s;
  int c_out;
  bool bias;
};

template <class T, class Layout = Kokkos::LayoutRight>
void check_conv(const ConvCase& k, kdist::kfac::FactorWorkspace<T, TestMem>& ws, std::mt19937_64& rng) {
  const ConvShape& s = k.s;
  const kdist::kfac::Conv2d layer(s.channels, k.c_out, s.kh, s.kw, s.stride, s.padding, k.bias);
  const Dense x = eighths(s.inputs(), rng);
  const Dense dy = eighths(std::size_t(s.rows()) * k.c_out, rng);
  const auto X = device_nchw<T, Layout>("X", s.batch, s.channels, s.height, s.width, x);
  const auto dY = device_nchw<T, Layout>("dY", s.batch, k.c_out, s.oh(), s.ow(), dy);
  const auto A = stale_factor<T>("A", layer.a_dim());
  const auto G = stale_factor<T>("G", layer.g_dim());
  kdist::kfac::conv2d_a_factor(TestExec(), layer, X, A, ws);
  kdist::kfac::conv2d_g_factor(TestExec(), layer, dY, G, ws);
  INFO(layer.describe() << ", batch " << s.batch << ", input " << s.height << "x" << s.width);
  const Dense a_ref = gram_ref(kdist_test::patches_ref(x, s), s.rows(), s.patch(), k.bias, 1.0 / s.rows());
  const Dense rows = kdist_test::nchw_to_rows_ref(dy, s.batch, k.c_out, s.oh(), s.ow());
  CHECK(relative_error(A, a_ref) <= tolerance<T>());
  CHECK(relative_error(G, gram_ref(rows, s.rows(), k.c_out, false, s.batch)) <= tolerance<T>());
  // From patches a forward pass formed: plain, and with a bias the ones column appended (ā).
  const kdist::Conv2dGeometry g{s.batch, s.channels, s.height, s.width, s.kh, s.kw, s.stride, s.padding};
  const Dense p = kdist_test::patches_ref(x, s);
  for (int ones : {0, k.bias ? 1 : 0}) {
    INFO((ones ? "patches with a ones column" : "patches"));
    const auto P = kdist_test::device_matrix<T, Kokkos::LayoutLeft>("P", s.rows(), s.patch() + ones, [&](int r, int c) {
      return c < s.patch() ? p[std::size_t(r) * s.patch() + c] : 1.0;
    });
    const auto Ap = stale_factor<T>("A from patches", layer.a_dim());
    kdist::kfac::conv2d_a_factor_from_patches(TestExec(), layer, g, P, Ap);
    CHECK(relative_error(Ap, a_ref) <= tolerance<T>());
  }
}

const ConvCase conv_cases[] = {
    {{2, 3, 6, 6, 3, 3, 1, 1}, 4, true},   // same-size convolution with bias
    {{3, 2, 7, 6, 3, 2, 2, 1}, 5, false},  // non-square kernel, stride 2, no bias
    {{2, 4, 5, 7, 2, 3, 2, 2}, 3, true},   // 2x3 kernel, padding 2
    {{4, 1, 8, 8, 5, 5, 1, 2}, 6, true},   // LeNet-like first layer
    {{2, 2, 5, 5, 1, 1, 1, 0}, 2, false},  // 1x1 kernel
    {{1, 3, 4, 4, 4, 4, 1, 0}, 2, true},   // one output location
};

}  // namespace

TEMPLATE_TEST_CASE("Dense factors: A = [X 1]^T [X 1] / n, G = n dY^T dY", "[kfac][factors]", float, double) {
  std::mt19937_64 rng(21);
  const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {64, 33, 10}, {5, 20, 7}, {200, 3, 12}};
  for (const auto& d : shapes)
    for (bool bias : {false, true}) {
      check_dense<TestType, Kokkos::LayoutRight>(d[0], d[1], d[2], bias, rng);
      check_dense<TestType, Kokkos::LayoutLeft>(d[0], d[1], d[2], bias, rng);
    }
}

TEMPLATE_TEST_CASE("Conv2d factors: A over im2col rows / (B S), G = B sum_s dY dY^T", "[kfac][factors]", float,
                   double) {
  std::mt19937_64 rng(22);
  kdist::kfac::FactorWorkspace<TestType, TestMem> ws;
  for (const auto& k : conv_cases) check_conv<TestType>(k, ws, rng);
  check_conv<TestType, Kokkos::LayoutLeft>(conv_cases[1], ws, rng);  // NCHW in another layout
}

namespace {

// Stride-1 geometries for factor A by kernel-row shifts (kfac/impl/conv_shifts.hpp): every
// padding from none to more than the kernel, kernels wider than tall and taller than wide, an
// input narrower than the padding, one input row, one image, the CNN's second layer (scaled down).
const ConvCase shift_cases[] = {
    {{2, 3, 6, 6, 3, 3, 1, 1}, 4, true}, {{3, 2, 7, 5, 3, 2, 1, 0}, 2, false}, {{2, 4, 5, 7, 2, 3, 1, 2}, 3, true},
    {{1, 2, 4, 3, 3, 3, 1, 4}, 2, true}, {{2, 2, 1, 6, 1, 3, 1, 1}, 2, true},  {{2, 3, 3, 1, 3, 1, 1, 2}, 2, false},
    {{1, 1, 6, 6, 5, 5, 1, 2}, 2, true}, {{3, 4, 7, 7, 5, 5, 1, 2}, 3, true},  {{2, 2, 5, 5, 1, 1, 1, 0}, 2, true},
    {{2, 3, 4, 4, 4, 4, 1, 0}, 2, true}, {{1, 2, 3, 1, 2, 6, 1, 3}, 2, true},  {{2, 2, 9, 4, 2, 4, 1, 3}, 2, false},
};

template <class T>
void check_shifts(const ConvCase& k, std::mt19937_64& rng) {
  const ConvShape& s = k.s;
  const kdist::kfac::Conv2d layer(s.channels, k.c_out, s.kh, s.kw, s.stride, s.padding, k.bias);
  const kdist::Conv2dGeometry g{s.batch, s.channels, s.height, s.width, s.kh, s.kw, s.stride, s.padding};
  const Dense x = eighths(s.inputs(), rng);
  const auto X = device_nchw<T>("X", s.batch, s.channels, s.height, s.width, x);
  const Dense a_ref = gram_ref(kdist_test::patches_ref(x, s), s.rows(), s.patch(), k.bias, 1.0 / s.rows());
  kdist::kfac::FactorWorkspace<T, TestMem> ws;
  const int m = kdist::kfac::impl::shift_columns(g);
  const auto scratch = ws.impl_rows(TestExec(), int(kdist::kfac::impl::shift_scratch_entries(g) / m), m);
  Kokkos::deep_copy(scratch, T(-3));  // stale scratch: every entry read must have been written
  INFO(layer.describe() << ", batch " << s.batch << ", input " << s.height << "x" << s.width);
  const auto A = stale_factor<T>("A", layer.a_dim());
  kdist::kfac::impl::conv2d_a_factor_by_shifts(TestExec(), layer, g, X, A, scratch, kdist::FactorUpdate::replace());
  CHECK(relative_error(A, a_ref) <= tolerance<T>());
  // The running average blends the upper triangle only: keep·old + (1 - keep)·new.
  const int n = layer.a_dim();
  const Dense old = eighths(std::size_t(n) * n, rng);
  const auto B =
      device_matrix<T, Kokkos::LayoutLeft>("B", n, n, [&](int r, int c) { return old[std::size_t(r) * n + c]; });
  Kokkos::deep_copy(scratch, T(-3));
  kdist::kfac::impl::conv2d_a_factor_by_shifts(TestExec(), layer, g, X, B, scratch,
                                               kdist::FactorUpdate::running_average(0.25));
  Dense want = old;
  for (int r = 0; r < n; ++r)
    for (int c = r; c < n; ++c)
      want[std::size_t(r) * n + c] = 0.25 * old[std::size_t(r) * n + c] + 0.75 * a_ref[std::size_t(r) * n + c];
  CHECK(relative_error(B, want) <= tolerance<T>());
}

}  // namespace

TEMPLATE_TEST_CASE("Conv2d factor A by kernel-row shifts equals the patches' product", "[kfac][factors]", float,
                   double) {
  std::mt19937_64 rng(25);
  for (const auto& k : shift_cases) check_shifts<TestType>(k, rng);
}

TEST_CASE("conv2d_a_factor takes the shifts on the host for 10+ channel x kernel columns", "[kfac][factors]") {
  std::mt19937_64 rng(26);
  const ConvCase wide{{2, 5, 7, 6, 3, 2, 1, 1}, 4, true}, narrow{{2, 3, 7, 6, 3, 3, 1, 1}, 4, true};
  const kdist::Conv2dGeometry g{2, 5, 7, 6, 3, 2, 1, 1}, h{2, 3, 7, 6, 3, 3, 1, 1};
  constexpr bool host = kdist::impl::runs_on_host<TestExec>();
  CHECK(kdist::kfac::conv2d_a_factor_prefers_input<TestExec>(kdist::kfac::Conv2d(5, 4, 3, 2, 1, 1), g) == host);
  CHECK_FALSE(kdist::kfac::conv2d_a_factor_prefers_input<TestExec>(kdist::kfac::Conv2d(3, 4, 3, 3, 1, 1), h));
  CHECK_FALSE(kdist::kfac::conv2d_a_factor_prefers_input<TestExec>(kdist::kfac::Conv2d(5, 4, 3, 2, 2, 1), g));
  kdist::kfac::FactorWorkspace<double, TestMem> ws, ws_narrow;
  check_conv<double>(wide, ws, rng);
  check_conv<double>(narrow, ws_narrow, rng);
  // The scratch it grew says which way it went: Y and its blocks, or the patch matrix.
  const long long expected = host ? kdist::kfac::impl::shift_scratch_entries(g) : 98LL * 30;
  CHECK(ws.bytes() == std::size_t(expected) * sizeof(double));
  CHECK(ws_narrow.bytes() == std::size_t(84 * 27) * sizeof(double));
}

TEST_CASE("a Conv2d whose kernel covers its input has the factors of the Dense layer", "[kfac][factors]") {
  // One output location: the patch is the flattened NCHW sample (c*H + h)*W + w, S = 1, so the
  // KFC normalisations of the two kinds must agree.
  std::mt19937_64 rng(23);
  const int B = 6, C = 2, H = 3, W = 4, c_out = 5;
  const Dense x = eighths(std::size_t(B) * C * H * W, rng), dy = eighths(std::size_t(B) * c_out, rng);
  const kdist::kfac::Conv2d conv(C, c_out, H, W, 1, 0, true);
  const kdist::kfac::Dense dense(C * H * W, c_out, true);
  kdist::kfac::FactorWorkspace<double, TestMem> ws;
  const auto Ac = stale_factor<double>("Ac", conv.a_dim()), Ad = stale_factor<double>("Ad", dense.a_dim());
  const auto Gc = stale_factor<double>("Gc", c_out), Gd = stale_factor<double>("Gd", c_out);
  // The overloads on the factor's default space.
  kdist::kfac::conv2d_a_factor(conv, device_nchw<double>("X", B, C, H, W, x), Ac, ws);
  kdist::kfac::conv2d_g_factor(conv, device_nchw<double>("dY", B, c_out, 1, 1, dy), Gc, ws);
  const int in = C * H * W;
  kdist::kfac::dense_a_factor(TestExec(), dense,
                              device_matrix<double>("X", B, in, [&](int r, int c) { return x[r * in + c]; }), Ad);
  kdist::kfac::dense_g_factor(
      TestExec(), dense, device_matrix<double>("dY", B, c_out, [&](int r, int c) { return dy[r * c_out + c]; }), Gd);
  CHECK(relative_error(Ac, to_flat(Ad)) <= 1e-12);
  CHECK(relative_error(Gc, to_flat(Gd)) <= 1e-12);
}

TEST_CASE("FactorWorkspace grows only when a call needs more", "[kfac][factors]") {
  std::mt19937_64 rng(24);
  kdist::kfac::FactorWorkspace<double, TestMem> ws("kdist::kfac::test_ws");
  const ConvCase big{{4, 3, 8, 8, 3, 3, 1, 1}, 4, true}, small{{2, 3, 6, 6, 3, 3, 1, 1}, 4, true};
  check_conv<double>(big, ws, rng);
  CHECK(ws.allocations() == 1);  // the patch matrix; the gradient rows fit in it
  CHECK(ws.bytes() == std::size_t(4 * 8 * 8) * 27 * sizeof(double));
  check_conv<double>(big, ws, rng);
  check_conv<double>(small, ws, rng);
  CHECK(ws.allocations() == 1);
  check_conv<double>({{8, 3, 8, 8, 3, 3, 1, 1}, 4, true}, ws, rng);
  CHECK(ws.allocations() == 2);
  ws.release();
  CHECK(ws.bytes() == 0);
}

TEST_CASE("factor functions reject the other layer kind and wrong extents, factor untouched",
          "[kfac][factors][errors]") {
  using Catch::Contains;
  const kdist::kfac::Dense dense(4, 3, true);              // A 5 x 5, G 3 x 3
  const kdist::kfac::Conv2d conv(2, 3, 3, 2, 1, 0, true);  // A 13 x 13, G 3 x 3
  kdist::kfac::FactorWorkspace<double, TestMem> ws;
  const auto A5 = stale_factor<double>("A[0]", 5), A13 = stale_factor<double>("A[1]", 13);
  const auto G3 = stale_factor<double>("G[0]", 3);
  const auto a5 = bytes_of(A5), a13 = bytes_of(A13), g3 = bytes_of(G3);
  const auto one = [](int, int) { return 1.0; };
  const auto X = device_matrix<double, Kokkos::LayoutRight>("acts", 8, 4, one);
  const auto X5 = device_matrix<double, Kokkos::LayoutRight>("acts5", 8, 5, one);
  const auto dY = device_matrix<double, Kokkos::LayoutRight>("grads", 8, 3, one);
  const auto Xc = device_nchw<double>("image", 2, 2, 5, 4, Dense(80, 1.0));  // out 3 x 3
  const auto Xc3 = device_nchw<double>("image3", 2, 3, 5, 4, Dense(120, 1.0));
  const auto Xtiny = device_nchw<double>("tiny", 2, 2, 2, 4, Dense(32, 1.0));  // kernel 3 > 2
  const auto dYc = device_nchw<double>("dout", 2, 4, 3, 3, Dense(72, 1.0));

  REQUIRE_THROWS_WITH(kdist::kfac::dense_a_factor(TestExec(), conv, X, A5), Contains("kdist::kfac::dense_a_factor") &&
                                                                                Contains("Conv2d(2, 3, 3x2") &&
                                                                                Contains("is not a Dense layer"));
  REQUIRE_THROWS_WITH(
      kdist::kfac::conv2d_a_factor(TestExec(), dense, Xc, A13, ws),
      Contains("kdist::kfac::conv2d_a_factor") && Contains("Dense(4, 3, bias)") && Contains("is not a Conv2d layer"));
  REQUIRE_THROWS_WITH(kdist::kfac::dense_a_factor(TestExec(), dense, X5, A5),
                      Contains("'acts5' (8 x 5)") && Contains("must be 8 x 4 (rows x inputs) for Dense(4, 3, bias)"));
  REQUIRE_THROWS_WITH(kdist::kfac::dense_a_factor(TestExec(), dense, X, G3),
                      Contains("'G[0]' (3 x 3)") && Contains("must be 5 x 5"));
  REQUIRE_THROWS_WITH(kdist::kfac::dense_g_factor(TestExec(), dense, X, G3),
                      Contains("kdist::kfac::dense_g_factor") && Contains("'acts' (8 x 4)") &&
                          Contains("must be 8 x 3 (rows x outputs)"));
  REQUIRE_THROWS_WITH(kdist::kfac::dense_g_factor(TestExec(), dense, dY, A5), Contains("must be 3 x 3"));
  REQUIRE_THROWS_WITH(
      kdist::kfac::dense_a_factor(TestExec(), dense, TestMatrix<double, Kokkos::LayoutRight>("empty", 0, 4), A5),
      Contains("'empty' (0 x 4)") && Contains("non-empty"));
  REQUIRE_THROWS_WITH(kdist::kfac::conv2d_a_factor(TestExec(), conv, Xc3, A13, ws),
                      Contains("'image3' (2 x 3 x 5 x 4)") && Contains("must be 2 x 2 x 5 x 4") &&
                          Contains("Conv2d(2, 3, 3x2, stride 1, padding 0, bias)"));
  REQUIRE_THROWS_WITH(kdist::kfac::conv2d_a_factor(TestExec(), conv, Xc, A5, ws),
                      Contains("'A[0]' (5 x 5)") && Contains("must be 13 x 13"));
  REQUIRE_THROWS_WITH(kdist::kfac::conv2d_a_factor(TestExec(), conv, Xtiny, A13, ws),
                      Contains("does not fit") && Contains("input 2x4, kernel 3x2") && Contains("Conv2d(2, 3"));
  REQUIRE_THROWS_WITH(kdist::kfac::conv2d_g_factor(TestExec(), conv, dYc, G3, ws),
                      Contains("kdist::kfac::conv2d_g_factor") && Contains("'dout' (2 x 4 x 3 x 3)") &&
                          Contains("must be 2 x 3 x 3 x 3 (batch x outputs x out_h x out_w)"));
  REQUIRE_THROWS_WITH(
      kdist::kfac::conv2d_g_factor(TestExec(), conv, device_nchw<double>("d", 2, 3, 3, 3, Dense(54, 1.0)), A13, ws),
      Contains("'A[1]' (13 x 13)") && Contains("must be 3 x 3"));
  // From patches: another geometry, the wrong extents, a "ones" column that is not all ones.
  const kdist::Conv2dGeometry g{2, 2, 5, 4, 3, 2, 1, 0};  // 18 rows x 12 columns
  const auto P12 = device_matrix<double, Kokkos::LayoutLeft>("patches", 18, 12, one);
  const auto P13 = device_matrix<double, Kokkos::LayoutLeft>(
      "patches+1", 18, 13, [](int r, int c) { return c == 12 && r == 5 ? 2.0 : 1.0; });
  REQUIRE_THROWS_WITH(
      kdist::kfac::conv2d_a_factor_from_patches(TestExec(), conv, kdist::Conv2dGeometry{2, 2, 5, 4, 3, 2, 2, 0}, P12,
                                                A13),
      Contains("kdist::kfac::conv2d_a_factor_from_patches") && Contains("stride 2") && Contains("is not the layer's"));
  REQUIRE_THROWS_WITH(kdist::kfac::conv2d_a_factor_from_patches(TestExec(), conv, g, X5, A13),
                      Contains("'acts5' (8 x 5)") && Contains("must be 18 x 12"));
  REQUIRE_THROWS_WITH(
      kdist::kfac::conv2d_a_factor_from_patches(TestExec(), conv, g, P13, A13),
      Contains("1 entries of the patches' last column") && Contains("'patches+1' (18 x 13)") && Contains("are not 1"));
  CHECK(bytes_of(A5) == a5);
  CHECK(bytes_of(A13) == a13);
  CHECK(bytes_of(G3) == g3);
}

TEMPLATE_TEST_CASE("kfac: the device forms of the gradient copies and the KL dot product equal naive loops", "[kfac]",
                   float, double) {
  // The *_entries kernels a GPU runs (a thread per entry), called directly so a host build tests
  // them; a 1-output and a 1-input layer, with and without a bias.
  using T = TestType;
  for (const auto& s : {std::pair<int, int>{1, 1}, {10, 128}, {128, 1568}, {32, 1}}) {
    for (const bool bias : {false, true}) {
      const int outputs = s.first, inputs = s.second, a = inputs + (bias ? 1 : 0);
      INFO("outputs " << outputs << " inputs " << inputs << " bias " << bias);
      const auto w = [](int i, int j) { return ((i * 7 + j * 3) % 17 - 8) / 8.0; };
      const auto bv = [](int i) { return ((i * 5) % 11 - 5) / 8.0; };
      const auto weight = device_matrix<T, Kokkos::LayoutRight>("weight", outputs, inputs, w);
      Kokkos::View<T*, TestMem> b("b", bias ? outputs : 0);
      if (bias) kdist_test::fill(b, bv);
      const auto Wt = device_matrix<T>("Wt", a, outputs, [](int, int) { return -99; });
      kdist::kfac::impl::gather_gradient_entries(TestExec(), Wt, weight, b, bias);
      const auto Wh = kdist_test::to_host(Wt);
      bool gathered = true;
      for (int i = 0; i < outputs; ++i)
        for (int j = 0; j < a; ++j) gathered = gathered && double(Wh(j, i)) == (j < inputs ? w(i, j) : bv(i));
      CHECK(gathered);

      const auto V = device_matrix<T>("V", a, outputs, [](int i, int j) { return ((i + 2 * j) % 9 - 4) / 8.0; });
      double want = 0;
      for (int i = 0; i < a; ++i)
        for (int j = 0; j < outputs; ++j) want += (((i + 2 * j) % 9 - 4) / 8.0) * double(Wh(i, j));
      CHECK(kdist::kfac::impl::inner_entries(TestExec(), V, Wt) == want);
      CHECK(kdist::kfac::impl::inner(TestExec(), V, Wt) == want);

      kdist::kfac::impl::scatter_gradient_entries(TestExec(), weight, b, V, T(0.5), bias);
      const auto wh = kdist_test::to_host(weight);
      bool scattered = true;
      for (int i = 0; i < outputs; ++i)
        for (int j = 0; j < inputs; ++j)
          scattered = scattered && double(wh(i, j)) == 0.5 * (((j + 2 * i) % 9 - 4) / 8.0);
      if (bias) {
        const auto bh = kdist_test::to_host(b);
        for (int i = 0; i < outputs; ++i)
          scattered = scattered && double(bh(i)) == 0.5 * (((inputs + 2 * i) % 9 - 4) / 8.0);
      }
      CHECK(scattered);
    }
  }
}
