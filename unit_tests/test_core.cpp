// core/: packed format, factor products, SPD inverse and eigen method, errors, timer, timeline.
// Kernels run on TestExec / TestMem (test_space.hpp): on the GPU in a CUDA build.
#include <catch2/catch.hpp>
#include <kdist/core/host_blas.hpp>
#include <kdist/core/inverse.hpp>
#include <kdist/core/packed.hpp>
#include <kdist/core/products.hpp>
#include <kdist/core/timeline.hpp>
#include <kdist/core/timer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "reference.hpp"
#include "test_space.hpp"

using kdist_test::bytes_of;
using kdist_test::Dense;
using kdist_test::device_matrix;
using kdist_test::device_square;
using kdist_test::TestExec;
using kdist_test::TestMatrix;
using kdist_test::TestMem;
using kdist_test::TestVector;
using kdist_test::to_host;

namespace {

/// TestMem matrix -> row-major reference matrix, through a host mirror.
template <class V>
Dense to_dense(const V& v) {
  const auto h = to_host(v);
  const int n = static_cast<int>(h.extent(0));
  Dense a(static_cast<std::size_t>(n) * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) a[i * n + j] = static_cast<double>(h(i, j));
  return a;
}

/// Reference matrix rounded to T and back, so residuals measure the inverse, not the rounding.
template <class T>
Dense rounded(const Dense& a) {
  Dense r(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) r[i] = static_cast<double>(static_cast<T>(a[i]));
  return r;
}

template <class T>
using Unmanaged2 = Kokkos::View<T**, Kokkos::LayoutLeft, TestMem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class T>
using Unmanaged1 = Kokkos::View<T*, TestMem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

}  // namespace

TEMPLATE_TEST_CASE("pack_upper/unpack_upper round-trip and LAPACK 'U' order", "[core][packed]", float, double) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int n = 1; n <= 300; n += (n < 20 ? 1 : 17)) {
    Dense sym(static_cast<std::size_t>(n) * n);
    for (int j = 0; j < n; ++j)
      for (int i = 0; i <= j; ++i) sym[i * n + j] = sym[j * n + i] = u(rng);
    const auto a = device_square<TestType>(sym, n, "a");
    TestMatrix<TestType> back("back", n, n);
    TestVector<TestType> p("p", kdist::packed_size(n));
    kdist::pack_upper(TestExec(), a, p);
    // The order LAPACK's packed routines use: column by column, rows 0..j.
    const auto ah = to_host(a);
    const auto ph = to_host(p);
    std::size_t k = 0;
    bool order_ok = true;
    for (int j = 0; j < n; ++j)
      for (int i = 0; i <= j; ++i, ++k) order_ok = order_ok && ph(k) == ah(i, j) && k == kdist::packed_index(i, j);
    REQUIRE(order_ok);
    kdist::unpack_upper(TestExec(), p, back);
    const auto bh = to_host(back);
    bool same = true;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) same = same && bh(i, j) == ah(i, j);
    REQUIRE(same);
    // The upper triangle alone: the strictly lower one keeps what it held.
    Kokkos::deep_copy(back, TestType(-3));
    kdist::unpack_upper_triangle(TestExec(), p, back);
    const auto uh = to_host(back);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) same = same && uh(i, j) == (i <= j ? ah(i, j) : TestType(-3));
    REQUIRE(same);
    REQUIRE(kdist::packed_dim(kdist::packed_size(n)) == static_cast<std::size_t>(n));
  }
}

TEST_CASE("upper_entry inverts the packed 'U' index, up to k near 2^53", "[core][packed]") {
  bool ok = true;
  for (std::int64_t k = 0, j = 0; j < 500; ++j)
    for (std::int64_t i = 0; i <= j; ++i, ++k) {
      int gi = -1, gj = -1;
      kdist::impl::upper_entry(k, gi, gj);
      ok = ok && gi == i && gj == j;
    }
  CHECK(ok);
  for (const std::int64_t j : {46340LL, 46341LL, 1000003LL, 94906265LL, 134217727LL})
    for (const std::int64_t i : {std::int64_t(0), j / 2, j - 1, j}) {
      int gi = -1, gj = -1;
      kdist::impl::upper_entry(i + j * (j + 1) / 2, gi, gj);
      INFO("i " << i << " j " << j);
      CHECK(gi == i);
      CHECK(gj == j);
    }
}

namespace {

template <class T, class Layout>
void check_triangle_kernels(int n, std::mt19937_64& rng) {
  INFO("n " << n << (std::is_same<Layout, Kokkos::LayoutLeft>::value ? " LayoutLeft" : " LayoutRight"));
  std::uniform_real_distribution<double> u(-1, 1);
  Dense a(static_cast<std::size_t>(n) * n);  // not symmetric: the mirror must copy the upper side
  for (auto& x : a) x = static_cast<double>(static_cast<T>(u(rng)));
  const auto at = [&](int i, int j) { return a[static_cast<std::size_t>(i) * n + j]; };
  const auto A = device_matrix<T, Layout>("A", n, n, at);
  const auto stale = [&](const char* label) {
    return device_matrix<T, Layout>(label, n, n, [](int, int) { return -3.0; });
  };
  const auto upper_or_stale = [&](const Dense& got, double diagonal_shift) {
    bool same = true;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        same =
            same && got[static_cast<std::size_t>(i) * n + j] ==
                        (i <= j ? static_cast<double>(static_cast<T>(at(i, j) + (i == j ? diagonal_shift : 0))) : -3.0);
    return same;
  };

  TestVector<T> p("p", kdist::packed_size(n));
  kdist::impl::pack_upper_entries(TestExec(), A, p);
  const auto ph = to_host(p);
  bool order_ok = true;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i <= j; ++i) order_ok = order_ok && static_cast<double>(ph(kdist::packed_index(i, j))) == at(i, j);
  CHECK(order_ok);

  const auto U = stale("U");
  kdist::impl::unpack_upper_entries(TestExec(), p, U);
  CHECK(upper_or_stale(kdist_test::to_flat(U), 0));

  const auto D = stale("D");
  kdist::impl::copy_upper_entries(TestExec(), "test copy_upper", A, D);
  CHECK(upper_or_stale(kdist_test::to_flat(D), 0));

  const auto M = stale("M");
  Kokkos::View<long long, TestMem> count("count");
  kdist::impl::copy_upper_counting_entries(TestExec(), "test damp", A, T(0.5), M, count);
  CHECK(upper_or_stale(kdist_test::to_flat(M), 0.5));
  long long bad = -1;
  Kokkos::deep_copy(bad, count);
  CHECK(bad == 0);

  const auto S = device_matrix<T, Layout>("S", n, n, at);
  kdist::impl::mirror_upper_tiles(TestExec(), S, kdist::impl::mirror_team_size<TestExec>());
  const Dense s = kdist_test::to_flat(S);
  bool mirrored = true;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      mirrored = mirrored && s[static_cast<std::size_t>(i) * n + j] == at(std::min(i, j), std::max(i, j));
  CHECK(mirrored);
}

}  // namespace

TEMPLATE_TEST_CASE("device triangle kernels (a thread per entry, tiled mirror) equal the dense reference",
                   "[core][packed]", float, double) {
  std::mt19937_64 rng(7);
  for (const int n : {1, 2, 3, 5, 31, 32, 33, 63, 64, 65, 100, 257}) {
    check_triangle_kernels<TestType, Kokkos::LayoutLeft>(n, rng);
    check_triangle_kernels<TestType, Kokkos::LayoutRight>(n, rng);
  }
}

TEST_CASE("device damped copy counts NaN and Inf in the upper triangle only", "[core][packed]") {
  const int n = 40;
  const auto A = device_matrix<double>("A", n, n, [](int i, int j) {
    if (i == 3 && j == 30) return std::nan("");
    if (i == j && i == 17) return HUGE_VAL;
    if (i == 30 && j == 3) return std::nan("");  // lower: not read
    return 1.0;
  });
  TestMatrix<double> M("M", n, n);
  Kokkos::View<long long, TestMem> count("count");
  kdist::impl::copy_upper_counting_entries(TestExec(), "test damp", A, 0.0, M, count);
  long long bad = -1;
  Kokkos::deep_copy(bad, count);
  CHECK(bad == 2);
}

TEST_CASE("host_blas names OpenBLAS's kernels and advises only on a pre-AVX core of an AVX2 CPU", "[core]") {
  const kdist::HostBlas b = kdist::host_blas();
  if (b.library == "OpenBLAS") {  // the Debian build links it; another BLAS is reported as unknown
    CHECK(b.config.rfind("OpenBLAS", 0) == 0);
    CHECK_FALSE(b.core.empty());
    CHECK(b.summary().find("core " + b.core) != std::string::npos);
    CHECK(b.advice == kdist::openblas_core_advice(b.core));
  } else {
    CHECK(b.library == "unknown");
    CHECK(b.core.empty());
  }
  CHECK(kdist::openblas_core_advice("Haswell").empty());
  CHECK(kdist::openblas_core_advice("SkylakeX").empty());
  CHECK(kdist::openblas_core_advice("Zen").empty());
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  for (const char* old : {"Prescott", "PRESCOTT", "Core2", "Nehalem"}) {
    const std::string advice = kdist::openblas_core_advice(old);
    CHECK(advice.empty() == !avx2);
    if (avx2) CHECK(advice.find("OPENBLAS_CORETYPE=") != std::string::npos);
  }
#endif
}

TEST_CASE("packed format rejects mismatched sizes", "[core][packed]") {
  TestMatrix<double> a("factor", 4, 4);
  TestVector<double> p("packed", 9);
  REQUIRE_THROWS_AS(kdist::pack_upper(TestExec(), a, p), kdist::InvalidArgument);
  REQUIRE_THROWS_WITH(kdist::unpack_upper(TestExec(), p, a), Catch::Contains("kdist::unpack_upper") &&
                                                                 Catch::Contains("'packed' (9)") &&
                                                                 Catch::Contains("10"));
  REQUIRE_THROWS_AS(kdist::packed_dim(11), kdist::InvalidArgument);
  REQUIRE(kdist::packed_dim(0) == 0);
}

// keep < 0: FactorUpdate::replace (A in full, stale contents overwritten); else
// running_average(keep): the upper triangle blended with its old values, the lower one untouched.
template <class T, class Layout>
void check_factor_product(int rows, int d, bool bias, double keep, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-2, 2);
  const auto X = device_matrix<T, Layout>("X", rows, d, [&](int, int) { return u(rng); });
  const int n = d + (bias ? 1 : 0);
  const T scale = rows > 0 ? T(1) / static_cast<T>(rows) : T(1);
  const auto old = [](int i, int j) { return i <= j ? 1.0 + 0.25 * (j - i) : -7.0; };
  const auto A = device_matrix<T, Kokkos::LayoutLeft>("A", n, n, old);
  if (keep < 0)
    kdist::factor_product(TestExec(), X, A, scale, bias);
  else
    kdist::factor_product(TestExec(), X, A, scale, bias, kdist::FactorUpdate::running_average(keep));
  const auto Xh = to_host(X);
  const auto Ah = to_host(A);
  // Triple loop over the explicit [X 1] matrix.
  double worst = 0, ref_max = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int r = 0; r < rows; ++r) {
        const double xi = i < d ? static_cast<double>(Xh(r, i)) : 1.0;
        const double xj = j < d ? static_cast<double>(Xh(r, j)) : 1.0;
        s += xi * xj;
      }
      s *= static_cast<double>(scale);
      if (keep >= 0) s = i <= j ? keep * old(i, j) + (1 - keep) * s : old(i, j);
      ref_max = std::max(ref_max, std::abs(s));
      worst = std::max(worst, std::abs(s - static_cast<double>(Ah(i, j))));
    }
  const double tol = (std::is_same<T, double>::value ? 1e-12 : 1e-5) * std::max(ref_max, 1e-300);
  INFO("rows " << rows << " d " << d << " bias " << bias << " keep " << keep << " layout "
               << (std::is_same<Layout, Kokkos::LayoutLeft>::value ? "left" : "right"));
  CHECK(worst <= tol);
}

TEMPLATE_TEST_CASE("factor_product equals a triple loop", "[core][products]", float, double) {
  std::mt19937_64 rng(7);
  const int shapes[][2] = {{1, 1}, {7, 5}, {3, 9}, {64, 33}, {200, 17}, {5, 120}, {0, 4}};
  for (const auto& s : shapes)
    for (bool bias : {false, true})
      for (double keep : {-1.0, 0.0, 0.95}) {
        check_factor_product<TestType, Kokkos::LayoutLeft>(s[0], s[1], bias, keep, rng);
        check_factor_product<TestType, Kokkos::LayoutRight>(s[0], s[1], bias, keep, rng);
      }
}

namespace {

template <class T, class Layout>
void check_bias_column_teams(int rows, int d, double beta, std::mt19937_64& rng) {
  INFO("rows " << rows << " d " << d << " beta " << beta
               << (std::is_same<Layout, Kokkos::LayoutLeft>::value ? " left" : " right"));
  std::uniform_int_distribution<int> eighths(-16, 16);  // exact sums in float
  Dense x(static_cast<std::size_t>(rows) * d);
  for (auto& v : x) v = eighths(rng) / 8.0;
  const auto X =
      device_matrix<T, Layout>("X", rows, d, [&](int r, int j) { return x[static_cast<std::size_t>(r) * d + j]; });
  const auto old = [](int i, int j) { return 0.5 * i - 0.25 * j; };
  const auto A = device_matrix<T>("A", d + 1, d + 1, old);
  const T alpha = T(0.5);
  kdist::impl::bias_column_teams(TestExec(), X, A, alpha, T(beta));
  const auto Ah = to_host(A);
  bool ok = true;
  for (int i = 0; i <= d; ++i)
    for (int j = 0; j <= d; ++j) {
      double want = old(i, j);
      if (j == d) {
        double sum = rows;
        if (i < d) {
          sum = 0;
          for (int r = 0; r < rows; ++r) sum += x[static_cast<std::size_t>(r) * d + i];
        }
        want = 0.5 * sum + beta * old(i, j);
      }
      ok = ok && static_cast<double>(Ah(i, j)) == static_cast<double>(static_cast<T>(want));
    }
  CHECK(ok);
}

}  // namespace

TEMPLATE_TEST_CASE("factor_product's device bias column (a team per column) equals the column sums", "[core][products]",
                   float, double) {
  std::mt19937_64 rng(11);
  for (const auto& s : {std::pair<int, int>{1, 1}, {64, 33}, {1000, 7}, {0, 3}, {3, 0}})
    for (double beta : {0.0, 0.5}) {
      check_bias_column_teams<TestType, Kokkos::LayoutLeft>(s.first, s.second, beta, rng);
      check_bias_column_teams<TestType, Kokkos::LayoutRight>(s.first, s.second, beta, rng);
    }
}

TEST_CASE("FactorUpdate::running_average takes keep in [0, 1)", "[core][products][errors]") {
  for (double keep : {-0.1, 1.0, std::nan("")})
    REQUIRE_THROWS_WITH(kdist::FactorUpdate::running_average(keep),
                        Catch::Contains("kdist::FactorUpdate::running_average") && Catch::Contains("[0, 1)"));
  REQUIRE(kdist::FactorUpdate::running_average(0.5).upper_only());
  REQUIRE_FALSE(kdist::FactorUpdate::replace().upper_only());
}

TEST_CASE("factor_product rejects a factor of the wrong size", "[core][products]") {
  TestMatrix<double, Kokkos::LayoutRight> X("acts", 8, 3);
  TestMatrix<double> A("A[0]", 3, 3);
  REQUIRE_THROWS_WITH(kdist::factor_product(TestExec(), X, A, 1.0, true),
                      Catch::Contains("kdist::factor_product") && Catch::Contains("'A[0]' (3 x 3)") &&
                          Catch::Contains("'acts' (8 x 3)") && Catch::Contains("4 x 4"));
}

template <class T>
void check_inverse(int n, kdist::InverseMethod method) {
  std::mt19937_64 rng(1000 + n);
  const bool dbl = std::is_same<T, double>::value;
  // cond(A + gamma I) <= 1e4 (double) or 1e2 (float).
  const double lo = dbl ? 1e-4 : 1e-2, gamma = dbl ? 1e-4 : 1e-3;
  const Dense a = rounded<T>(kdist_test::matrix_with_spectrum(kdist_test::geometric_spectrum(n, 1.0, lo), rng));
  const auto A = device_square<T>(a, n, "A");
  const auto A_before = bytes_of(A);
  TestMatrix<T> inv("inv", n, n);
  kdist::spd_inverse(TestExec(), A, gamma, inv, method);
  const Dense x = to_dense(inv);
  const double res = kdist_test::identity_residual(a, static_cast<double>(static_cast<T>(gamma)), x, n);
  INFO("n " << n << (dbl ? " double" : " float") << (method == kdist::InverseMethod::eigen ? " eigen" : " cholesky"));
  CHECK(res <= (dbl ? 1e-10 : 1e-4));
  CHECK(bytes_of(A) == A_before);
  bool symmetric = true;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) symmetric = symmetric && x[i * n + j] == x[j * n + i];
  CHECK(symmetric);
}

TEMPLATE_TEST_CASE("spd_inverse: (A + gamma I) inv = I", "[core][inverse]", float, double) {
  for (int n : {1, 2, 3, 17, 64, 128, 257, 512}) check_inverse<TestType>(n, kdist::InverseMethod::cholesky);
  for (int n : {1, 5, 64, 200}) check_inverse<TestType>(n, kdist::InverseMethod::eigen);
}

// The host's inverse stage (core/impl/lapack_host.hpp): R^-1 by halves through trmm, then lauum.
TEMPLATE_TEST_CASE("potri_by_halves equals LAPACK's potri, and names the first zero pivot as trtri does",
                   "[core][inverse]", float, double) {
  using T = TestType;
  namespace host = kdist::impl::host;
  const bool dbl = std::is_same<T, double>::value;
  for (int n : {1, 128, 129, 300}) {  // 129: halves of 64 and 65; 300: 150, then 75
    std::mt19937_64 rng(7 + n);
    const Dense a = rounded<T>(kdist_test::matrix_with_spectrum(kdist_test::geometric_spectrum(n, 1.0, 1e-2), rng));
    std::vector<T> want(a.begin(), a.end());  // symmetric: either order is column-major
    REQUIRE(host::potrf<T>('U', n, want.data(), n) == 0);
    std::vector<T> got = want;
    REQUIRE(host::potri<T>('U', n, want.data(), n) == 0);
    REQUIRE(host::potri_by_halves<T>(n, got.data(), n) == 0);
    double err = 0, scale = 0;
    for (int j = 0; j < n; ++j)
      for (int i = 0; i <= j; ++i) {
        err = std::max(err, std::abs(double(got[i + j * n]) - double(want[i + j * n])));
        scale = std::max(scale, std::abs(double(want[i + j * n])));
      }
    INFO("n " << n);
    CHECK(err <= (dbl ? 1e-12 : 1e-5) * scale);
  }
  std::vector<T> R(300 * 300, T(0));
  for (int i = 0; i < 300; ++i) R[i + i * 300] = T(1);
  R[230 + 230 * 300] = T(0);  // in the second half's second half: 150 + 75 + 6
  CHECK(host::potri_by_halves<T>(300, R.data(), 300) == 231);
}

TEST_CASE("spd_inverse: eigen method agrees with Cholesky", "[core][inverse]") {
  std::mt19937_64 rng(3);
  for (int n : {4, 33, 256}) {
    const Dense a = kdist_test::matrix_with_spectrum(kdist_test::geometric_spectrum(n, 10.0, 1e-2), rng);
    const auto A = device_square<double>(a, n, "A");
    TestMatrix<double> c("c", n, n), e("e", n, n);
    kdist::spd_inverse(TestExec(), A, 1e-2, c, kdist::InverseMethod::cholesky);
    kdist::spd_inverse(TestExec(), A, 1e-2, e, kdist::InverseMethod::eigen);
    const auto ch = to_host(c);
    const auto eh = to_host(e);
    double diff = 0, mx = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        diff = std::max(diff, std::abs(ch(i, j) - eh(i, j)));
        mx = std::max(mx, std::abs(ch(i, j)));
      }
    INFO("n " << n);
    CHECK(diff <= 1e-10 * mx);
  }
}

TEST_CASE("symmetric_eigen returns the spectrum and orthonormal vectors", "[core][inverse]") {
  std::mt19937_64 rng(5);
  const int n = 40;
  auto spec = kdist_test::geometric_spectrum(n, 3.0, 0.01);
  const Dense a = kdist_test::matrix_with_spectrum(spec, rng);
  const auto A = device_square<double>(a, n, "A");
  TestVector<double> w("w", n);
  TestMatrix<double> Q("Q", n, n);
  kdist::symmetric_eigen(TestExec(), A, w, Q);
  const auto wh = to_host(w);
  const auto Qh = to_host(Q);
  std::sort(spec.begin(), spec.end());
  double err = 0;
  for (int i = 0; i < n; ++i) err = std::max(err, std::abs(wh(i) - spec[i]));
  CHECK(err < 1e-12);
  // A q_j = w_j q_j
  double res = 0;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int k = 0; k < n; ++k) s += a[i * n + k] * Qh(k, j);
      res = std::max(res, std::abs(s - wh(j) * Qh(i, j)));
    }
  CHECK(res < 1e-12);
}

TEST_CASE("host syevd workspace is never below LAPACK's minimum (float queries round above 2^24)", "[core][inverse]") {
  // OpenBLAS 0.3.21's ssyevd query answers 135679856 at n = 8235, 5 short of the minimum.
  for (int n : {0, 1, 2, 40, 8194, 8235, 8300})
    for (char jobz : {'V', 'N'}) {
      const long long nn = n, min_lwork = n <= 1 ? 1 : jobz == 'V' ? 1 + 6 * nn + 2 * nn * nn : 2 * nn + 1;
      const long long min_liwork = n <= 1 || jobz == 'N' ? 1 : 3 + 5 * nn;
      INFO("n " << n << " jobz " << jobz);
      const auto f = kdist::impl::host::syevd_workspace<float>(jobz, 'U', n);
      const auto d = kdist::impl::host::syevd_workspace<double>(jobz, 'U', n);
      CHECK(f.lwork >= min_lwork);
      CHECK(d.lwork >= min_lwork);
      CHECK(f.liwork >= min_liwork);
      CHECK(d.liwork >= min_liwork);
    }
  // Past int (2 n^2 > INT_MAX): no size at all, which symmetric_eigen reports as InvalidArgument.
  CHECK(kdist::impl::host::syevd_workspace<double>('V', 'U', 40000).lwork == -1);
}

namespace {

template <class T>
void check_inverse_rejects(int n, std::initializer_list<kdist::InverseMethod> methods) {
  INFO("n " << n);
  std::mt19937_64 rng(9);
  auto spec = kdist_test::geometric_spectrum(n, 1.0, 0.1);
  spec[n / 2] = -1.0;  // indefinite even after damping 0.1
  const Dense a = kdist_test::matrix_with_spectrum(spec, rng);
  const std::string dimension = "dimension " + std::to_string(n);
  for (auto method : methods) {
    const auto A = device_square<T>(a, n, "G[2]");
    const auto before = bytes_of(A);
    TestMatrix<T> inv("inv", n, n);
    try {
      kdist::spd_inverse(TestExec(), A, 0.1, inv, method);
      FAIL("an indefinite matrix was inverted");
    } catch (const kdist::NumericalError& e) {
      CHECK(e.dim() == n);
      CHECK(e.damping() == 0.1);
      CHECK_THAT(e.what(), Catch::Contains("kdist::spd_inverse") && Catch::Contains("not positive definite") &&
                               Catch::Contains(dimension) && Catch::Contains("damping 0.1"));
      if (method == kdist::InverseMethod::cholesky) CHECK(e.info() > 0);
      if (method == kdist::InverseMethod::eigen) CHECK_THAT(e.what(), Catch::Contains("tolerance"));
    }
    CHECK(bytes_of(A) == before);

    // NaN: OpenBLAS potrf may return info = 0 on NaN, so kdist must find it whatever LAPACK says.
    // Only the upper triangle is read, so the NaN below the diagonal is not counted.
    const Dense clean = kdist_test::matrix_with_spectrum(kdist_test::geometric_spectrum(n, 1.0, 0.5), rng);
    Dense b = clean;
    b[3 * n + 5] = std::numeric_limits<double>::quiet_NaN();
    b[1 * n + 20] = std::numeric_limits<double>::infinity();
    b[22 * n + 2] = std::numeric_limits<double>::quiet_NaN();
    const auto B = device_square<T>(b, n, "A[7]");
    const auto B_before = bytes_of(B);
    try {
      kdist::spd_inverse(TestExec(), B, 1e-3, inv, method);
      FAIL("a non-finite matrix was inverted");
    } catch (const kdist::NumericalError& e) {
      CHECK(e.info() == 0);
      CHECK_THAT(e.what(), Catch::Contains("non-finite input") && Catch::Contains("2 NaN/Inf") &&
                               Catch::Contains("'A[7]'") && Catch::Contains(dimension));
    }
    CHECK(bytes_of(B) == B_before);

    // A non-finite strictly lower triangle alone changes nothing: the inverse is the clean one's.
    Dense lower_bad = clean;
    for (int i = 1; i < n; ++i) lower_bad[i * n + i - 1] = std::numeric_limits<double>::quiet_NaN();
    TestMatrix<T> inv_clean("inv_clean", n, n);
    kdist::spd_inverse(TestExec(), device_square<T>(clean, n, "clean"), 1e-3, inv_clean, method);
    kdist::spd_inverse(TestExec(), device_square<T>(lower_bad, n, "lower_bad"), 1e-3, inv, method);
    CHECK(to_dense(inv) == to_dense(inv_clean));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("spd_inverse: non-SPD and non-finite input throw NumericalError, input unchanged",
                   "[core][inverse][errors]", float, double) {
  check_inverse_rejects<TestType>(24, {kdist::InverseMethod::cholesky, kdist::InverseMethod::eigen});
  // Past DenseSolver::solve_from, where cuSOLVER's route is potrf + potrs.
  check_inverse_rejects<TestType>(520, {kdist::InverseMethod::cholesky});
}

TEST_CASE("spd_inverse rejects aliasing and shape errors", "[core][inverse][errors]") {
  TestMatrix<double> A("A", 3, 3), B("B", 4, 4), R("R", 3, 4);
  REQUIRE_THROWS_AS(kdist::spd_inverse(TestExec(), A, 0.0, A), kdist::InvalidArgument);
  REQUIRE_THROWS_WITH(kdist::spd_inverse(TestExec(), A, 0.0, B),
                      Catch::Contains("'B' (4 x 4)") && Catch::Contains("'A' (3 x 3)"));
  REQUIRE_THROWS_WITH(kdist::spd_inverse(TestExec(), R, 0.0, B), Catch::Contains("must be square"));
  REQUIRE_THROWS_WITH(kdist::spd_inverse(TestExec(), A, std::nan(""), TestMatrix<double>("C", 3, 3)),
                      Catch::Contains("non-finite damping"));
}

// ---- outputs overlapping inputs (issue 8, cases 5 and 6): rejected before anything is written --

namespace {

/// One allocation of `elements` holding a random SPD n x n matrix at offset 0 (column-major).
template <class T>
TestVector<T> spd_storage(int n, std::size_t elements, std::mt19937_64& rng) {
  const Dense a = kdist_test::matrix_with_spectrum(kdist_test::geometric_spectrum(n, 1.0, 0.1), rng);
  TestVector<T> storage("storage", elements);
  kdist_test::fill(storage, [&](std::size_t k) { return k < std::size_t(n) * n ? a[(k % n) * n + k / n] : 0.5; });
  return storage;
}

}  // namespace

TEST_CASE("spd_inverse rejects an output shifted into the input's storage, input untouched",
          "[core][inverse][errors][overlap]") {
  std::mt19937_64 rng(11);
  const int n = 6;
  // shift 1: one element in; shift n: one column in; shift n*n - 1: only the last element shared.
  for (const std::size_t shift : {std::size_t(1), std::size_t(n), std::size_t(n) * n - 1})
    for (auto method : {kdist::InverseMethod::cholesky, kdist::InverseMethod::eigen}) {
      const auto storage = spd_storage<double>(n, std::size_t(n) * n + shift, rng);
      const Unmanaged2<double> A(storage.data(), n, n), inv(storage.data() + shift, n, n);
      const auto before = bytes_of(storage);
      INFO("shift " << shift << (method == kdist::InverseMethod::eigen ? " eigen" : " cholesky"));
      REQUIRE_THROWS_AS(kdist::spd_inverse(TestExec(), A, 0.1, inv, method), kdist::InvalidArgument);
      CHECK(bytes_of(storage) == before);
    }
  // Output one column in, as a labelled subview: the message names both views.
  TestMatrix<double> wide("wide", n, n + 1);
  const auto A = Kokkos::subview(wide, Kokkos::ALL, std::make_pair(0, n));
  const auto inv = Kokkos::subview(wide, Kokkos::ALL, std::make_pair(1, n + 1));
  REQUIRE_THROWS_WITH(kdist::spd_inverse(TestExec(), A, 0.1, inv), Catch::Contains("kdist::spd_inverse(cholesky)") &&
                                                                       Catch::Contains("'wide' (6 x 6)") &&
                                                                       Catch::Contains("share storage"));
  // Adjacent but disjoint storage is fine.
  const auto storage = spd_storage<double>(n, 2 * std::size_t(n) * n, rng);
  const Unmanaged2<double> A2(storage.data(), n, n), inv2(storage.data() + n * n, n, n);
  REQUIRE_NOTHROW(kdist::spd_inverse(TestExec(), A2, 0.1, inv2));
}

TEST_CASE("symmetric_eigen rejects overlapping A, Q and eigenvalues, input untouched",
          "[core][inverse][errors][overlap]") {
  std::mt19937_64 rng(12);
  const int n = 5;
  const std::size_t nn = std::size_t(n) * n;
  {  // Q one column into A
    const auto storage = spd_storage<double>(n, nn + n, rng);
    const auto before = bytes_of(storage);
    TestVector<double> w("w", n);
    REQUIRE_THROWS_AS(kdist::symmetric_eigen(TestExec(), Unmanaged2<double>(storage.data(), n, n), w,
                                             Unmanaged2<double>(storage.data() + n, n, n)),
                      kdist::InvalidArgument);
    CHECK(bytes_of(storage) == before);
  }
  {  // eigenvalues inside A, then inside Q
    const auto storage = spd_storage<double>(n, 2 * nn, rng);
    const Unmanaged2<double> A(storage.data(), n, n), Q(storage.data() + nn, n, n);
    const auto before = bytes_of(storage);
    REQUIRE_THROWS_AS(kdist::symmetric_eigen(TestExec(), A, Unmanaged1<double>(storage.data() + 2, n), Q),
                      kdist::InvalidArgument);
    CHECK(bytes_of(storage) == before);
    REQUIRE_THROWS_AS(kdist::symmetric_eigen(TestExec(), A, Unmanaged1<double>(storage.data() + nn + 3, n), Q),
                      kdist::InvalidArgument);
    CHECK(bytes_of(storage) == before);
  }
}

TEST_CASE("pack_upper/unpack_upper reject a packed vector inside the matrix's storage",
          "[core][packed][errors][overlap]") {
  const int n = 8;
  const std::size_t np = kdist::packed_size(n);
  for (const std::size_t offset : {std::size_t(0), std::size_t(3), std::size_t(n) * n - np}) {
    TestVector<float> storage("storage", std::size_t(n) * n);
    kdist_test::fill(storage, [](std::size_t k) { return 1.0 + static_cast<double>(k); });
    const Unmanaged2<float> full(storage.data(), n, n);
    const Unmanaged1<float> packed(storage.data() + offset, np);
    const auto before = bytes_of(storage);
    INFO("offset " << offset);
    REQUIRE_THROWS_AS(kdist::unpack_upper(TestExec(), packed, full), kdist::InvalidArgument);
    CHECK(bytes_of(storage) == before);
    REQUIRE_THROWS_AS(kdist::pack_upper(TestExec(), full, packed), kdist::InvalidArgument);
    CHECK(bytes_of(storage) == before);
  }
}

TEST_CASE("factor_product rejects a factor overlapping X", "[core][products][errors][overlap]") {
  const int rows = 4, d = 3;
  TestVector<double> storage("storage", std::size_t(rows) * d + 2);
  kdist_test::fill(storage, [](std::size_t k) { return 0.25 * static_cast<double>(k); });
  const Unmanaged2<double> X(storage.data(), rows, d), A(storage.data() + 2, d, d);
  const auto before = bytes_of(storage);
  REQUIRE_THROWS_WITH(kdist::factor_product(TestExec(), X, A, 1.0), Catch::Contains("kdist::factor_product") &&
                                                                        Catch::Contains("(4 x 3)") &&
                                                                        Catch::Contains("(3 x 3)"));
  CHECK(bytes_of(storage) == before);
}

TEST_CASE("spans_overlap compares byte spans, not start pointers", "[core][overlap]") {
  TestMatrix<double> m("m", 10, 10);
  const auto col0 = Kokkos::subview(m, Kokkos::ALL, 0);
  const auto col1 = Kokkos::subview(m, Kokkos::ALL, 1);
  const auto row0 = Kokkos::subview(m, 0, Kokkos::ALL);  // strided: spans the whole matrix
  CHECK_FALSE(kdist::impl::spans_overlap(col0, col1));
  CHECK(kdist::impl::spans_overlap(col1, row0));
  CHECK(kdist::impl::spans_overlap(m, col1));
  CHECK_FALSE(kdist::impl::spans_overlap(m, TestMatrix<double>("other", 10, 10)));
  CHECK_FALSE(kdist::impl::spans_overlap(m, Kokkos::subview(m, std::make_pair(0, 0), Kokkos::ALL)));  // empty
  // Different value types over one allocation: bytes, not elements.
  const Kokkos::View<float*, TestMem, Kokkos::MemoryTraits<Kokkos::Unmanaged>> tail(
      reinterpret_cast<float*>(m.data() + 99) + 1, 1);  // the upper half of the last double
  CHECK(kdist::impl::spans_overlap(m, tail));
  const Kokkos::View<float*, TestMem, Kokkos::MemoryTraits<Kokkos::Unmanaged>> past(
      reinterpret_cast<float*>(m.data() + 100), 1);
  CHECK_FALSE(kdist::impl::spans_overlap(m, past));
}

// ---- packed_dim for every size_t (issue 8, case 11) ------------------------------------------------

TEST_CASE("packed_dim is exact and instant for every size_t", "[core][packed]") {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  REQUIRE_THROWS_AS(kdist::packed_dim(max), kdist::InvalidArgument);
  REQUIRE_THROWS_AS(kdist::packed_dim(max - 1), kdist::InvalidArgument);
  REQUIRE_THROWS_WITH(kdist::packed_dim(max),
                      Catch::Contains("kdist::packed_dim") && Catch::Contains(std::to_string(max)));
  const std::size_t dims[] = {0, 1, 2, 3, 4, 5, 100, 1001, 65535, 65536, 4294967295u};
  for (const std::size_t n : dims) {
    const std::size_t t = kdist::packed_size(n);
    CHECK(kdist::packed_dim(t) == n);
    if (n > 0) CHECK_THROWS_AS(kdist::packed_dim(t + 1), kdist::InvalidArgument);
    if (n > 1) CHECK_THROWS_AS(kdist::packed_dim(t - 1), kdist::InvalidArgument);
  }
  if (sizeof(std::size_t) == 8) {
    // The largest n whose n(n+1)/2 fits in 64 bits, and that triangular number.
    const std::size_t n = 6074000999ull, t = 18446744070963499500ull;
    CHECK(kdist::packed_size(n) == t);
    CHECK(kdist::packed_dim(t) == n);
    CHECK_THROWS_AS(kdist::packed_dim(t + 1), kdist::InvalidArgument);
    CHECK_THROWS_AS(kdist::packed_dim(t - 1), kdist::InvalidArgument);
    CHECK_THROWS_AS(kdist::packed_dim(max - 2746052114ull), kdist::InvalidArgument);
  }
}

// ---- InverseWorkspace (issue 7, rework 4) -----------------------------------------------------------

TEMPLATE_TEST_CASE("InverseWorkspace: reused across sizes, same results, no reallocation when smaller",
                   "[core][inverse][workspace]", float, double) {
  using T = TestType;
  std::mt19937_64 rng(21);
  kdist::InverseWorkspace<T, TestMem> ws("kdist::test::ws");
  CHECK(ws.allocations() == 0);
  CHECK(ws.bytes() == 0);
  const auto check = [&](int n, kdist::InverseMethod method) {
    const Dense a = rounded<T>(kdist_test::matrix_with_spectrum(kdist_test::geometric_spectrum(n, 1.0, 0.05), rng));
    const auto A = device_square<T>(a, n, "A");
    TestMatrix<T> with("with_workspace", n, n), plain("plain", n, n);
    kdist::spd_inverse(TestExec(), A, 1e-3, with, ws, method);
    kdist::spd_inverse(TestExec(), A, 1e-3, plain, method);
    INFO("n " << n << (method == kdist::InverseMethod::eigen ? " eigen" : " cholesky"));
    CHECK(bytes_of(with) == bytes_of(plain));
  };
  for (auto method : {kdist::InverseMethod::cholesky, kdist::InverseMethod::eigen}) {
    check(48, method);
    const std::size_t allocations = ws.allocations(), bytes = ws.bytes();
    CHECK(allocations > 0);
    for (int n : {1, 7, 48, 20, 33}) check(n, method);
    CHECK(ws.allocations() == allocations);
    CHECK(ws.bytes() == bytes);
  }
  // A larger size grows it once; then the smaller ones again allocate nothing.
  check(64, kdist::InverseMethod::eigen);
  const std::size_t grown = ws.allocations();
  CHECK(grown > 0);
  for (int n : {64, 10, 48}) check(n, kdist::InverseMethod::eigen);
  for (int n : {64, 10}) check(n, kdist::InverseMethod::cholesky);
  CHECK(ws.allocations() == grown);

  // The eigendecomposition through the same workspace.
  const int n = 30;
  auto spec = kdist_test::geometric_spectrum(n, 2.0, 0.1);
  const auto A = device_square<T>(kdist_test::matrix_with_spectrum(spec, rng), n, "A");
  TestVector<T> w1("w1", n), w2("w2", n);
  TestMatrix<T> Q1("Q1", n, n), Q2("Q2", n, n);
  kdist::symmetric_eigen(TestExec(), A, w1, Q1, ws);
  kdist::symmetric_eigen(TestExec(), A, w2, Q2);
  CHECK(bytes_of(w1) == bytes_of(w2));
  CHECK(bytes_of(Q1) == bytes_of(Q2));
  CHECK(ws.allocations() == grown);

  // Errors through a workspace leave it usable.
  Dense bad(static_cast<std::size_t>(n) * n, 0.0);
  bad[0] = std::numeric_limits<double>::quiet_NaN();
  TestMatrix<T> out("out", n, n);
  REQUIRE_THROWS_AS(kdist::spd_inverse(TestExec(), device_square<T>(bad, n, "bad"), 0.1, out, ws),
                    kdist::NumericalError);
  CHECK(ws.allocations() == grown);
  check(n, kdist::InverseMethod::cholesky);

  ws.release();
  CHECK(ws.bytes() == 0);
  check(5, kdist::InverseMethod::cholesky);
  CHECK(ws.allocations() > grown);
}

TEST_CASE("estimate_clock_offset recovers a known offset within its bound", "[core][timer]") {
  const double true_offset = 5.25;
  // Local send at t, remote reads its clock after delay d1, reply arrives after d2.
  std::vector<kdist::ClockSample> samples;
  const double delays[][2] = {{3e-3, 1e-3}, {2e-4, 9e-4}, {5e-5, 4e-5}, {1e-2, 2e-3}};
  double t = 100.0;
  for (const auto& d : delays) {
    samples.push_back({t, t + d[0] + true_offset, t + d[0] + d[1]});
    t += 1.0;
  }
  const kdist::ClockOffset est = kdist::estimate_clock_offset(samples);
  CHECK(std::abs(est.offset - true_offset) <= est.uncertainty + 1e-12);
  CHECK(est.uncertainty == Approx(0.5 * (5e-5 + 4e-5)));
  REQUIRE_THROWS_AS(kdist::estimate_clock_offset({}), kdist::InvalidArgument);
  REQUIRE_THROWS_AS(kdist::estimate_clock_offset({{1.0, 0.0, 0.5}}), kdist::InvalidArgument);
}

TEST_CASE("Clock gives iteration-relative, offset-shifted time", "[core][timer]") {
  kdist::Clock clock;
  clock.set_offset(10.0);
  const double local = kdist::Clock::local_now();
  CHECK(clock.now() >= local + 10.0);
  clock.start_iteration();
  CHECK(clock.iteration() == 0);
  CHECK(clock.since_iteration() >= 0.0);
  CHECK(clock.to_global(1.0) == 11.0);
}

TEST_CASE("Timeline writes Chrome trace-event JSON", "[core][timeline]") {
  kdist::Clock clock;
  clock.set_offset(2.0);
  kdist::Timeline tl(3, &clock);
  const int fwd = tl.track("forward");
  const int comm = tl.track("factor allreduce");
  CHECK(tl.track("forward") == fwd);
  tl.record(fwd, "layer 0", 1.0, 1.5);  // disabled: ignored
  { kdist::Timeline::Scope s(tl, comm, "ignored"); }
  CHECK(tl.size() == 0);
  tl.enable();
  tl.record(fwd, "layer 0", 1.0, 1.5);
  { kdist::Timeline::Scope s(tl, comm, "A[0] + A[1]"); }
  REQUIRE(tl.size() == 2);
  REQUIRE_THROWS_AS(tl.record(9, "bad", 0, 1), kdist::InvalidArgument);
  const auto doc = nlohmann::json::parse(tl.to_json());
  int complete = 0;
  for (const auto& e : doc.at("traceEvents")) {
    CHECK(e.at("pid") == 3);
    if (e.at("ph") == "X") {
      ++complete;
      if (e.at("name") == "layer 0") {
        CHECK(e.at("tid") == fwd);
        CHECK(e.at("ts").get<double>() == Approx(3.0e6));
        CHECK(e.at("dur").get<double>() == Approx(0.5e6));
      } else {
        CHECK(e.at("name") == "A[0] + A[1]");
        CHECK(e.at("tid") == comm);
        CHECK(e.at("dur").get<double>() >= 0.0);
      }
    }
  }
  CHECK(complete == 2);
  const auto merged = nlohmann::json::parse(kdist::Timeline::merge({tl.to_json(), tl.to_json()}));
  CHECK(merged.at("traceEvents").size() == 2 * doc.at("traceEvents").size());
  REQUIRE_THROWS_WITH(tl.write("/nonexistent-dir/trace.json"), Catch::Contains("/nonexistent-dir/trace.json"));
}
