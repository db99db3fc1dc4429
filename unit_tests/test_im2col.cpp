// core/im2col.hpp: im2col, col2im and the NCHW <-> rows layout change against the naive loops of
// reference.hpp, on TestExec / TestMem (test_space.hpp). Inputs are eighths (exact in float), so
// copies are compared exactly and sums to a relative tolerance of 1e-5 (float) / 1e-12 (double).
#include <catch2/catch.hpp>
#include <kdist/core/im2col.hpp>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "reference.hpp"
#include "test_space.hpp"

using kdist_test::bytes_of;
using kdist_test::ConvShape;
using kdist_test::Dense;
using kdist_test::device_nchw;
using kdist_test::eighths;
using kdist_test::TestExec;
using kdist_test::TestMatrix;
using kdist_test::TestMem;
using kdist_test::to_flat;

namespace {

const ConvShape shapes[] = {
    {2, 3, 5, 5, 3, 3, 1, 0},  // plain valid convolution
    {2, 3, 6, 5, 3, 2, 1, 1},  // non-square 3x2 kernel, padding 1
    {3, 2, 7, 6, 3, 2, 2, 1},  // stride 2
    {1, 4, 5, 7, 2, 3, 2, 2},  // 2x3 kernel, padding 2, stride 2
    {2, 2, 8, 8, 5, 5, 2, 2},  // 5x5 kernel as in LeNet
    {2, 1, 4, 4, 1, 1, 1, 0},  // 1x1 kernel: im2col is the layout change
    {1, 2, 3, 3, 3, 3, 1, 0},  // one output location
    {2, 2, 7, 7, 2, 2, 3, 0},  // stride larger than the kernel: some inputs are never read
    {1, 1, 2, 2, 3, 3, 1, 1},  // kernel larger than the input, fitting only with the padding
    {1, 2, 1, 2, 3, 2, 1, 4},  // padding wider than the kernel: whole patches of zeros
    {2, 3, 7, 6, 5, 5, 1, 2},  // "same" 5x5 at stride 1: im2col's contiguous plane copy
    {3, 2, 5, 5, 3, 3, 1, 1},  // "same" 3x3
    {1, 1, 6, 3, 5, 3, 1, 1},  // same width only (kernel 5 high, padding 1): rows fall out
    // Padded planes past impl::kPaddedPlaneEntries: the host kernels without one.
    {1, 2, 300, 250, 5, 5, 2, 2},
    {1, 1, 280, 260, 3, 3, 1, 1},
};

kdist::Conv2dGeometry geometry(const ConvShape& s) {
  return {s.batch, s.channels, s.height, s.width, s.kh, s.kw, s.stride, s.padding};
}

template <class T>
double tolerance() {
  return std::is_same<T, double>::value ? 1e-12 : 1e-5;
}

/// max |a - b| / max |b|.
double relative_error(const Dense& a, const Dense& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  return diff / std::max(kdist_test::max_abs(b), 1e-300);
}

double dot(const Dense& a, const Dense& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

template <class T, class Layout = Kokkos::LayoutRight>
TestMatrix<T, Layout> stale_matrix(const std::string& label, int rows, int cols) {
  TestMatrix<T, Layout> m(label, rows, cols);
  Kokkos::deep_copy(m, T(-7));  // every element must be overwritten
  return m;
}

template <class T, class Layout>
void check_im2col(const ConvShape& s, std::mt19937_64& rng) {
  const Dense x = eighths(s.inputs(), rng);
  const auto X = device_nchw<T, Layout>("x", s.batch, s.channels, s.height, s.width, x);
  const auto P = stale_matrix<T, Layout>("patches", s.rows(), s.patch());
  kdist::im2col(TestExec(), geometry(s), X, P);
  const Dense ref = kdist_test::patches_ref(x, s);
  CHECK(to_flat(P) == ref);
  // The device kernel (a thread per patch entry), whichever space this build tests on.
  const auto E = stale_matrix<T, Layout>("patches (entries)", s.rows(), s.patch());
  kdist::impl::im2col_entries(TestExec(), "test im2col_entries", geometry(s), X, E);
  CHECK(to_flat(E) == ref);
  if constexpr (std::is_same<Layout, Kokkos::LayoutLeft>::value) {
    // The device kernel for column-major patches (a team per column and image).
    const auto C = stale_matrix<T, Layout>("patches (column teams)", s.rows(), s.patch());
    kdist::impl::im2col_column_teams(TestExec(), "test im2col_column_teams", geometry(s), X, C);
    CHECK(to_flat(C) == ref);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("im2col equals the naive patch matrix", "[core][im2col]", float, double) {
  std::mt19937_64 rng(1);
  for (const auto& s : shapes) {
    INFO("shape " << geometry(s).describe());
    check_im2col<TestType, Kokkos::LayoutRight>(s, rng);
    check_im2col<TestType, Kokkos::LayoutLeft>(s, rng);
  }
}

namespace {

// PLayout picks the kernel (LayoutLeft: the column kernels), XLayout the NCHW accessor (LayoutRight:
// raw row pointers, otherwise the view's operator()).
template <class T, class PLayout, class XLayout>
void check_col2im(const ConvShape& s, std::mt19937_64& rng) {
  const Dense x = eighths(s.inputs(), rng);
  const Dense p = eighths(std::size_t(s.rows()) * s.patch(), rng);
  const auto X = device_nchw<T, XLayout>("x", s.batch, s.channels, s.height, s.width, x);
  const auto P = kdist_test::device_matrix<T, PLayout>("p", s.rows(), s.patch(),
                                                       [&](int r, int k) { return p[std::size_t(r) * s.patch() + k]; });
  const auto dX = device_nchw<T, XLayout>("dx", s.batch, s.channels, s.height, s.width, Dense(s.inputs(), -7.0));
  const auto Px = stale_matrix<T, PLayout>("im2col(x)", s.rows(), s.patch());
  kdist::col2im(TestExec(), geometry(s), P, dX);
  kdist::im2col(TestExec(), geometry(s), X, Px);
  const Dense dx = to_flat(dX);
  CHECK(relative_error(dx, kdist_test::col2im_ref(p, s)) <= tolerance<T>());
  // <im2col(x), p> == <x, col2im(p)>
  const double lhs = dot(to_flat(Px), p), rhs = dot(x, dx);
  CHECK(std::abs(lhs - rhs) <= tolerance<T>() * std::max(1.0, std::abs(lhs)));
}

}  // namespace

TEMPLATE_TEST_CASE("col2im is the adjoint of im2col and equals a naive scatter", "[core][im2col]", float, double) {
  std::mt19937_64 rng(2);
  for (const auto& s : shapes) {
    INFO("shape " << geometry(s).describe());
    check_col2im<TestType, Kokkos::LayoutRight, Kokkos::LayoutRight>(s, rng);
    check_col2im<TestType, Kokkos::LayoutLeft, Kokkos::LayoutRight>(s, rng);
    check_col2im<TestType, Kokkos::LayoutLeft, Kokkos::LayoutLeft>(s, rng);
  }
}

TEST_CASE("for_each_nchw_entry visits every element once, w fastest", "[core][im2col]") {
  const int B = 2, C = 3, H = 5, W = 7;
  Kokkos::View<double****, Kokkos::LayoutRight, TestMem> y("y", B, C, H, W);
  kdist::impl::for_each_nchw_entry(
      "test for_each_nchw_entry", TestExec(), B, C, H, W,
      KOKKOS_LAMBDA(const int b, const int c, const int h, const int w) {
        y(b, c, h, w) += ((b * C + c) * H + h) * W + w;
      });
  const Dense got = to_flat(y);
  bool ok = true;
  for (std::size_t k = 0; k < got.size(); ++k) ok = ok && got[k] == static_cast<double>(k);
  CHECK(ok);
}

TEMPLATE_TEST_CASE("nchw_to_rows and rows_to_nchw are inverse layout changes", "[core][im2col]", float, double) {
  using T = TestType;
  std::mt19937_64 rng(3);
  // 120, 1, 210, 72 and 15 elements: every remainder of the device bodies' four a thread.
  const int sizes[][4] = {{2, 3, 4, 5}, {1, 1, 1, 1}, {3, 5, 2, 7}, {4, 2, 3, 3}, {1, 3, 1, 5}};
  for (const auto& d : sizes) {
    const int B = d[0], C = d[1], H = d[2], W = d[3];
    INFO("y " << B << " x " << C << " x " << H << " x " << W);
    const Dense y = eighths(std::size_t(B) * C * H * W, rng);
    const auto Y = device_nchw<T>("y", B, C, H, W, y);
    const auto R = stale_matrix<T>("rows", B * H * W, C);
    const auto L = stale_matrix<T, Kokkos::LayoutLeft>("rows (column-major)", B * H * W, C);
    const auto Y2 = device_nchw<T>("y2", B, C, H, W, Dense(y.size(), -7.0));
    const auto Y3 = device_nchw<T>("y3", B, C, H, W, Dense(y.size(), -7.0));
    kdist::nchw_to_rows(TestExec(), Y, R);
    kdist::nchw_to_rows(TestExec(), Y, L);
    kdist::rows_to_nchw(R, Y2);  // the overload on the view's default space
    kdist::rows_to_nchw(TestExec(), L, Y3);
    CHECK(to_flat(R) == kdist_test::nchw_to_rows_ref(y, B, C, H, W));
    CHECK(to_flat(L) == kdist_test::nchw_to_rows_ref(y, B, C, H, W));
    CHECK(to_flat(Y2) == y);
    CHECK(to_flat(Y3) == y);
    // The device bodies (a few elements a thread), called directly so a host build runs them.
    const auto R2 = stale_matrix<T>("rows (entries)", B * H * W, C);
    const auto L2 = stale_matrix<T, Kokkos::LayoutLeft>("rows (entries, column-major)", B * H * W, C);
    const auto Y4 = device_nchw<T>("y4", B, C, H, W, Dense(y.size(), -7.0));
    const auto Y5 = device_nchw<T>("y5", B, C, H, W, Dense(y.size(), -7.0));
    kdist::impl::nchw_rows_copy_entries<kdist::impl::ToRows>(TestExec(), "test to rows", Y, R2);
    kdist::impl::nchw_rows_copy_entries<kdist::impl::ToRows>(TestExec(), "test to rows", Y, L2);
    kdist::impl::nchw_rows_copy_entries<kdist::impl::ToNchw>(TestExec(), "test to nchw", Y4, L2);
    kdist::impl::nchw_rows_copy_entries<kdist::impl::ToNchw>(TestExec(), "test to nchw", Y5, R2);
    CHECK(to_flat(R2) == kdist_test::nchw_to_rows_ref(y, B, C, H, W));
    CHECK(to_flat(L2) == kdist_test::nchw_to_rows_ref(y, B, C, H, W));
    CHECK(to_flat(Y4) == y);
    CHECK(to_flat(Y5) == y);
  }
}

TEST_CASE("im2col family rejects bad geometry and extents, outputs untouched", "[core][im2col][errors]") {
  const ConvShape s{2, 3, 5, 5, 3, 2, 1, 1};  // out 5 x 6, patch 18, rows 60
  const auto g = geometry(s);
  const auto X = device_nchw<double>("x", 2, 3, 5, 5, Dense(s.inputs(), 1.0));
  const auto P = stale_matrix<double>("patches", 60, 18);
  const auto before = bytes_of(P);

  auto bad = g;
  bad.stride = 0;
  REQUIRE_THROWS_WITH(kdist::im2col(TestExec(), bad, X, P), Catch::Contains("kdist::im2col") &&
                                                                Catch::Contains("stride 0") &&
                                                                Catch::Contains("padding >= 0"));
  bad = g;
  bad.kernel_h = 8;
  REQUIRE_THROWS_WITH(kdist::im2col(TestExec(), bad, X, P),
                      Catch::Contains("does not fit") && Catch::Contains("input 5x5, kernel 8x2"));
  bad = g;
  bad.channels = 2;
  REQUIRE_THROWS_WITH(kdist::im2col(TestExec(), bad, X, P),
                      Catch::Contains("kdist::im2col") && Catch::Contains("'x' (2 x 3 x 5 x 5)") &&
                          Catch::Contains("must be 2 x 2 x 5 x 5 (batch x channels x height x width)"));
  const auto P_short = stale_matrix<double>("short", 59, 18);
  REQUIRE_THROWS_WITH(kdist::im2col(TestExec(), g, X, P_short),
                      Catch::Contains("'short' (59 x 18)") && Catch::Contains("must be 60 x 18"));
  CHECK(bytes_of(P) == before);

  const auto dX = device_nchw<double>("dx", 2, 3, 5, 4, Dense(120, 2.0));
  const auto dX_before = bytes_of(dX);
  REQUIRE_THROWS_WITH(kdist::col2im(TestExec(), g, P, dX), Catch::Contains("kdist::col2im") &&
                                                               Catch::Contains("'dx' (2 x 3 x 5 x 4)") &&
                                                               Catch::Contains("must be 2 x 3 x 5 x 5"));
  CHECK(bytes_of(dX) == dX_before);

  const auto R = stale_matrix<double>("rows", 50, 2);
  REQUIRE_THROWS_WITH(kdist::nchw_to_rows(TestExec(), X, R), Catch::Contains("kdist::nchw_to_rows") &&
                                                                 Catch::Contains("'rows' (50 x 2)") &&
                                                                 Catch::Contains("must be 50 x 3"));
  REQUIRE_THROWS_WITH(kdist::rows_to_nchw(TestExec(), R, X), Catch::Contains("kdist::rows_to_nchw"));
  CHECK(to_flat(X) == Dense(s.inputs(), 1.0));
}

TEST_CASE("Conv2dGeometry::validate rejects work counts past int, each size alone in range", "[core][im2col][errors]") {
  // One 1x1 image padded to a 2001x2001 kernel: a patch of 4e6 columns, 1000 rows, 1000 inputs,
  // but im2col's 4e9 (column, image) work items overflow int.
  const kdist::Conv2dGeometry g{1000, 1, 1, 1, 2001, 2001, 1, 1000};
  REQUIRE(g.rows() == 1000);
  REQUIRE(g.patch() == 2001 * 2001);
  REQUIRE_THROWS_WITH(g.validate("kdist::im2col"), Catch::Contains("kdist::im2col") && Catch::Contains("exceeds int") &&
                                                       Catch::Contains("batch 1000"));
  const kdist::Conv2dGeometry fits{500, 1, 1, 1, 2001, 2001, 1, 1000};  // 2.0e9 work items
  CHECK_NOTHROW(fits.validate("kdist::im2col"));
}

TEST_CASE("int ranges: a padding past int and an output of more rows than int are refused", "[core][im2col][errors]") {
  // out_h() adds the padding in int: 1 + 2 * 1.1e9 would overflow it (and gave an empty patch matrix).
  const kdist::Conv2dGeometry padded{1, 1, 1, 1, 1, 1, 1 << 30, 1100000000};
  REQUIRE_THROWS_WITH(padded.validate("kdist::im2col"),
                      Catch::Contains("padded input exceeds int") && Catch::Contains("padding 1100000000"));
  // The row kernels index B x C x H rows with int; validate() sees an input, not the output they
  // may run over: the count is checked where they launch, before anything runs.
  bool ran = false;
  bool* const flag = &ran;  // a host space's kernel: KOKKOS_LAMBDA copies the pointer
  REQUIRE_THROWS_WITH(kdist::impl::for_rows_nchw(
                          "kdist::test::rows", Kokkos::DefaultHostExecutionSpace(), 65536, 65536, 1,
                          KOKKOS_LAMBDA(int, int, int) { *flag = true; }),
                      Catch::Contains("kdist::test::rows") && Catch::Contains("65536 x 65536 x 1 rows"));
  CHECK_FALSE(ran);
  CHECK(kdist::impl::nchw_row_count("kdist::test::rows", 32768, 65535, 1) == 32768 * 65535);
}

TEST_CASE("im2col rejects patches sharing the input's storage", "[core][im2col][errors][overlap]") {
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  const ConvShape s{1, 1, 3, 3, 2, 2, 1, 0};  // 9 inputs, 4 x 4 patches
  kdist_test::TestVector<double> storage("storage", 24);
  const Kokkos::View<double****, Kokkos::LayoutRight, TestMem, Unmanaged> X(storage.data(), 1, 1, 3, 3);
  const Kokkos::View<double**, Kokkos::LayoutRight, TestMem, Unmanaged> P(storage.data() + 8, 4, 4);
  const auto before = bytes_of(storage);
  REQUIRE_THROWS_WITH(kdist::im2col(TestExec(), geometry(s), X, P), Catch::Contains("share storage"));
  CHECK(bytes_of(storage) == before);
}
