// core/cholesky.hpp: the Cholesky factor against its definition (R^T R = A + gamma I, R upper),
// the two solves against the dense product with the inverse spd_inverse makes, on column
// subviews too, and the errors. Kernels run on TestExec / TestMem (test_space.hpp).
#include <catch2/catch.hpp>
#include <kdist/core/cholesky.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "reference.hpp"
#include "test_space.hpp"

using kdist_test::bytes_of;
using kdist_test::Dense;
using kdist_test::device_matrix;
using kdist_test::device_square;
using kdist_test::TestExec;
using kdist_test::TestMatrix;
using kdist_test::to_host;

namespace {

template <class T>
TestMatrix<T> random_matrix(int rows, int cols, unsigned seed, const char* label) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Dense v(static_cast<std::size_t>(rows) * cols);
  for (double& x : v) x = u(rng);
  return device_matrix<T>(label, rows, cols, [&](int i, int j) { return v[i * cols + j]; });
}

/// max |op(X) - op(Y)| / max |Y| over two host mirrors of equal extents.
template <class X, class Y>
double relative_difference(const X& x, const Y& y) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < x.extent(0); ++i)
    for (std::size_t j = 0; j < x.extent(1); ++j) {
      diff = std::max(diff, std::abs(static_cast<double>(x(i, j)) - static_cast<double>(y(i, j))));
      scale = std::max(scale, std::abs(static_cast<double>(y(i, j))));
    }
  return diff / scale;
}

template <class T>
void check_factor_and_solves(int n) {
  const bool dbl = std::is_same<T, double>::value;
  const double gamma = 1e-3, tol = dbl ? 1e-10 : 2e-4;
  std::mt19937_64 rng(77 + n);
  const Dense a = kdist_test::matrix_with_spectrum(kdist_test::geometric_spectrum(n, 1.0, 1e-2), rng);
  const auto A = device_square<T>(a, n, "A");
  const auto A_before = bytes_of(A);
  TestMatrix<T> R("R", n, n), inv("inv", n, n);
  kdist::cholesky_factor(TestExec(), A, gamma, R);
  kdist::spd_inverse(TestExec(), A, gamma, inv);
  INFO("n " << n << (dbl ? " double" : " float"));
  CHECK(bytes_of(A) == A_before);

  // R^T R = A + gamma I over R's upper triangle (its lower one is unspecified).
  const auto Rh = to_host(R);
  double res = 0;
  for (int i = 0; i < n; ++i) {
    CHECK(Rh(i, i) > 0);
    for (int j = i; j < n; ++j) {
      double s = 0;
      for (int k = 0; k <= i; ++k) s += static_cast<double>(Rh(k, i)) * static_cast<double>(Rh(k, j));
      res = std::max(res, std::abs(s - a[i * n + j] - (i == j ? gamma : 0.0)));
    }
  }
  CHECK(res <= (dbl ? 1e-12 : 1e-5));

  // Left: X := (A + gamma I)^-1 X against inv X; right: Y := Y (A + gamma I)^-1 against Y inv.
  // The left solve also on a block of columns, the right one on a block of rows (strided).
  for (const int k : {1, 7}) {
    const auto X = random_matrix<T>(n, k, 5u + k, "X"), Y = random_matrix<T>(k, n, 9u + k, "Y");
    TestMatrix<T> want_x("want_x", n, k), want_y("want_y", k, n);
    kdist::gemm(TestExec(), "N", "N", T(1), inv, X, T(0), want_x);
    kdist::gemm(TestExec(), "N", "N", T(1), Y, inv, T(0), want_y);
    kdist::cholesky_solve_left(TestExec(), R, X);
    kdist::cholesky_solve_right(TestExec(), Y, R);
    INFO("k " << k);
    CHECK(relative_difference(to_host(X), to_host(want_x)) <= tol);
    CHECK(relative_difference(to_host(Y), to_host(want_y)) <= tol);
  }
  const auto W = random_matrix<T>(n, 6, 3u, "W");
  const auto W_before = to_host(W);
  const auto block = Kokkos::subview(W, Kokkos::ALL, std::make_pair(2, 5));
  TestMatrix<T> want("want", n, 3);
  kdist::gemm(TestExec(), "N", "N", T(1), inv, block, T(0), want);
  kdist::cholesky_solve_left(TestExec(), R, block);
  const auto Wh = to_host(W);
  CHECK(relative_difference(to_host(block), to_host(want)) <= tol);
  bool others_kept = true;
  for (int i = 0; i < n; ++i)
    for (int j : {0, 1, 5}) others_kept = others_kept && Wh(i, j) == W_before(i, j);
  CHECK(others_kept);
}

}  // namespace

TEMPLATE_TEST_CASE("cholesky_factor: R^T R = A + gamma I, and its solves equal the inverse's products",
                   "[core][cholesky]", float, double) {
  for (int n : {1, 2, 17, 64, 200, 520}) check_factor_and_solves<TestType>(n);
}

TEMPLATE_TEST_CASE("cholesky_factor: non-SPD and non-finite input throw NumericalError, input unchanged",
                   "[core][cholesky][errors]", float, double) {
  const int n = 24;
  std::mt19937_64 rng(11);
  auto spec = kdist_test::geometric_spectrum(n, 1.0, 0.1);
  spec[n / 2] = -1.0;  // indefinite even after damping 0.1
  const auto A = device_square<TestType>(kdist_test::matrix_with_spectrum(spec, rng), n, "G[2]");
  const auto before = bytes_of(A);
  TestMatrix<TestType> R("R", n, n);
  try {
    kdist::cholesky_factor(TestExec(), A, 0.1, R);
    FAIL("an indefinite matrix was factored");
  } catch (const kdist::NumericalError& e) {
    CHECK(e.dim() == n);
    CHECK(e.info() > 0);
    CHECK_THAT(e.what(), Catch::Contains("kdist::cholesky_factor") && Catch::Contains("not positive definite") &&
                             Catch::Contains("dimension 24") && Catch::Contains("damping 0.1"));
  }
  CHECK(bytes_of(A) == before);

  Dense b = kdist_test::matrix_with_spectrum(kdist_test::geometric_spectrum(n, 1.0, 0.5), rng);
  b[3 * n + 5] = std::numeric_limits<double>::quiet_NaN();
  b[5 * n + 3] = std::numeric_limits<double>::infinity();  // below the diagonal: not read
  const auto B = device_square<TestType>(b, n, "A[7]");
  try {
    kdist::cholesky_factor(TestExec(), B, 1e-3, R);
    FAIL("a non-finite matrix was factored");
  } catch (const kdist::NumericalError& e) {
    CHECK(e.info() == 0);
    CHECK_THAT(e.what(), Catch::Contains("non-finite input") && Catch::Contains("1 NaN/Inf") &&
                             Catch::Contains("'A[7]'") && Catch::Contains("dimension 24"));
  }
  CHECK_THROWS_WITH(kdist::cholesky_factor(TestExec(), A, std::nan(""), R), Catch::Contains("non-finite damping"));
}

TEST_CASE("cholesky solves reject a right-hand side that does not fit R, and R inside X", "[core][cholesky][errors]") {
  TestMatrix<double> R("R", 4, 4), X("X", 5, 2), Y("Y", 2, 3), S("S", 4, 3);
  CHECK_THROWS_WITH(kdist::cholesky_solve_left(TestExec(), R, X),
                    Catch::Contains("kdist::cholesky_solve_left") && Catch::Contains("'X' (5 x 2)") &&
                        Catch::Contains("'R' (4 x 4)") && Catch::Contains("rows"));
  CHECK_THROWS_WITH(kdist::cholesky_solve_right(TestExec(), Y, R), Catch::Contains("kdist::cholesky_solve_right") &&
                                                                       Catch::Contains("'Y' (2 x 3)") &&
                                                                       Catch::Contains("columns"));
  CHECK_THROWS_WITH(kdist::cholesky_solve_left(TestExec(), S, X), Catch::Contains("must be square"));
  TestMatrix<double> big("big", 4, 8);
  const auto left = Kokkos::subview(big, Kokkos::ALL, std::make_pair(0, 4));
  const auto right = Kokkos::subview(big, Kokkos::ALL, std::make_pair(2, 6));
  CHECK_THROWS_WITH(kdist::cholesky_solve_left(TestExec(), left, right), Catch::Contains("kdist::cholesky_solve_left"));
}
