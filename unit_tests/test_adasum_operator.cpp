// adasum/: the pair operator and the host kernels, serial, against the references of
// adasum_reference.hpp (naive loops in double), on TestExec over TestMem views.
#include <catch2/catch.hpp>
#include <kdist/adasum/allreduce.hpp>
#include <kdist/adasum/host_kernels.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <type_traits>

#include "adasum_reference.hpp"
#include "adasum_test_util.hpp"
#include "test_space.hpp"

// TestExec, TestVector, Vec, the adasum namespace alias and the shared helpers.
using namespace kdist_test::adasum_util;

// ---- the operator, serial ------------------------------------------------------------------

TEST_CASE("operator equals the reference pair tensor by tensor", "[adasum][operator]") {
  const auto bounds = bounds_of({5, 0, 1, 300, 2});
  const Vec a = input<double>(0, bounds.back(), 3), b = input<double>(1, bounds.back(), 3);
  auto va = view_of<double>(a), vb = view_of<double>(b);
  adasum::combine(TestExec(), va, vb, bounds);
  CHECK(kdist_test::rel_l2(vec_of(va), kdist_test::adasum_pair(a, b, bounds)) < 1e-15);
  // Per tensor, not per buffer: treating the buffer as one vector gives something else.
  CHECK(kdist_test::rel_l2(vec_of(va), kdist_test::adasum_pair(a, b, {0, bounds.back()})) > 1e-3);
}

TEST_CASE("1024 parallel vectors scaled by the smallest normal float give their mean", "[adasum][operator]") {
  // Accumulated in float, |x|^2 ~ 1e-76 underflows to 0, the coefficients become 1 and the
  // result is the sum; in double it is the mean.
  const std::size_t n = 16;
  Vec u(n);
  for (std::size_t i = 0; i < n; ++i) u[i] = 1.0 + 0.25 * static_cast<double>(i % 5);
  std::vector<Vec> xs(1024);
  for (auto& x : xs) {
    x = u;
    for (auto& v : x) v = static_cast<double>(static_cast<float>(v * std::numeric_limits<float>::min()));
  }
  const Vec got = operator_tree<float>(xs, {0, n});
  CHECK(kdist_test::rel_l2(got, xs[0]) < 100 * std::numeric_limits<float>::epsilon());
}

TEMPLATE_TEST_CASE("parallel vectors with scales from tiny to sqrt(max/(4n)), shuffled, give their mean",
                   "[adasum][operator]", float, double) {
  using T = TestType;
  const std::size_t n = 8;
  // float: the whole normal range. double: squared norms below sqrt(DBL_MIN) are, by the
  // operator's definition, treated as zero (coefficient 1), so the mean property holds only from
  // scales whose squared norm clears that guard (~1e-77); start there.
  const double tiny = std::is_same<T, float>::value ? static_cast<double>(std::numeric_limits<float>::min()) : 1e-75;
  const double huge = std::sqrt(static_cast<double>(std::numeric_limits<T>::max()) / (4.0 * n));
  const int count = 64;
  std::vector<double> scales;  // geometric, computed in logs (huge / tiny overflows for double)
  for (int i = 0; i < count; ++i)
    scales.push_back(std::exp(std::log(tiny) + (std::log(huge) - std::log(tiny)) * i / (count - 1)));
  std::mt19937_64 rng(5);
  std::shuffle(scales.begin(), scales.end(), rng);
  Vec u(n);
  for (std::size_t i = 0; i < n; ++i) u[i] = 0.5 + 0.125 * static_cast<double>(i);
  std::vector<Vec> xs;
  for (double s : scales) {
    Vec x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<double>(static_cast<T>(s * u[i]));
    xs.push_back(x);
  }
  // Parallel inputs: every pairwise step is the mean, so a balanced tree of 64 is the mean.
  Vec mean(n, 0.0);
  for (const auto& x : xs)
    for (std::size_t i = 0; i < n; ++i) mean[i] += x[i] / count;
  CHECK(kdist_test::rel_l2(operator_tree<T>(xs, {0, n}), mean) < 100 * std::numeric_limits<T>::epsilon());
}

TEST_CASE("zero vectors, single-element and empty tensors, many small fused tensors", "[adasum][operator]") {
  const auto bounds = bounds_of({3, 1, 0, 4});
  const Vec zero(8, 0.0), b = input<double>(1, 8, 9);
  auto v0 = view_of<double>(zero), vb = view_of<double>(b);
  adasum::combine(TestExec(), v0, vb, bounds);
  CHECK(vec_of(v0) == b);  // Adasum(0, b) = b
  auto z1 = view_of<double>(zero), z2 = view_of<double>(zero);
  adasum::combine(TestExec(), z1, z2, bounds);
  CHECK(vec_of(z1) == zero);  // Adasum(0, 0) = 0
  // 300 tiny tensors fused in one buffer == each combined on its own.
  std::vector<std::size_t> sizes;
  for (int i = 0; i < 300; ++i) sizes.push_back(1 + i % 3);
  const auto fb = bounds_of(sizes);
  const Vec a = input<double>(2, fb.back(), 4), c = input<double>(3, fb.back(), 4);
  auto fa = view_of<double>(a), fc = view_of<double>(c);
  adasum::combine(TestExec(), fa, fc, fb);
  CHECK(kdist_test::rel_l2(vec_of(fa), kdist_test::adasum_pair(a, c, fb)) < 1e-15);
  TestVector<double> e1("e1", 8), e2("e2", 7);
  REQUIRE_THROWS_AS(adasum::combine(TestExec(), e1, e2, bounds), kdist::InvalidArgument);
  REQUIRE_THROWS_WITH(adasum::combine(TestExec(), e1, e1, bounds_of({3, 3})), Catch::Contains("bounds"));
}

TEMPLATE_TEST_CASE("apply's device kernel (a few elements a thread) gives apply_one's bits, in place too",
                   "[adasum][operator]", float, double) {
  using T = TestType;
  const Vec xa = input<T>(0, 1000, 52), xb = input<T>(1, 1000, 52);
  for (const std::size_t lo : {std::size_t(0), std::size_t(3)})
    for (const std::size_t len : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 997}) {
      INFO("elements [" << lo << ", " << lo + len << ")");
      std::vector<T> want(xa.begin(), xa.end());
      for (std::size_t i = lo; i < lo + len; ++i) want[i] = adasum::impl::apply_one(0.73, T(xa[i]), -1.21, T(xb[i]));
      auto a = view_of<T>(xa), b = view_of<T>(xb), out = view_of<T>(xa), a2 = view_of<T>(xa), b2 = view_of<T>(xb);
      adasum::impl::apply_entries(TestExec(), out.data(), a.data(), b.data(), lo, lo + len, 0.73, -1.21);
      adasum::impl::apply_entries(TestExec(), a.data(), a.data(), b.data(), lo, lo + len, 0.73, -1.21);     // over a
      adasum::impl::apply_entries(TestExec(), b2.data(), a2.data(), b2.data(), lo, lo + len, 0.73, -1.21);  // over b
      TestExec().fence();
      CHECK(vec_of(out) == Vec(want.begin(), want.end()));
      CHECK(vec_of(a) == Vec(want.begin(), want.end()));
      std::vector<T> want_b(xb.begin(), xb.end());
      for (std::size_t i = lo; i < lo + len; ++i) want_b[i] = want[i];
      CHECK(vec_of(b2) == Vec(want_b.begin(), want_b.end()));
    }
}

TEMPLATE_TEST_CASE("partials' device kernel (a few strided elements a thread) sums what a naive loop sums",
                   "[adasum][operator]", float, double) {
  using T = TestType;
  const Vec xa = input<T>(0, 1000, 53), xb = input<T>(1, 1000, 53);
  auto a = view_of<T>(xa), b = view_of<T>(xb);
  for (const std::size_t lo : {std::size_t(0), std::size_t(3)})
    for (const std::size_t len : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 63, 64, 65, 257, 997}) {
      INFO("elements [" << lo << ", " << lo + len << ")");
      double want[3] = {}, scale[3] = {};  // the sums, and the sums of their terms' magnitudes
      for (std::size_t i = lo; i < lo + len; ++i) {
        const double x = T(xa[i]), y = T(xb[i]);
        want[0] += x * y, want[1] += x * x, want[2] += y * y;
        scale[0] += std::abs(x * y), scale[1] += x * x, scale[2] += y * y;
      }
      double got[3] = {-1, -1, -1};
      adasum::impl::partials_strided(TestExec(), a.data() + lo, b.data() + lo, len, got);
      // Recursive summation in double, in either order: within (len + 1) u of the terms' magnitudes
      // (a float product is exact in double). A lost or doubled element is a whole term off.
      const double bound = 2.0 * static_cast<double>(len + 1) * std::numeric_limits<double>::epsilon();
      for (int k = 0; k < 3; ++k) CHECK(std::abs(got[k] - want[k]) <= bound * scale[k]);
    }
  // A NaN in a and an Inf in b show in their squared norms, whichever thread reads them.
  Vec bad_a = xa, bad_b = xb;
  bad_a[700] = std::numeric_limits<double>::quiet_NaN();
  bad_b[1] = std::numeric_limits<double>::infinity();
  auto na = view_of<T>(bad_a), nb = view_of<T>(bad_b);
  double got[3] = {};
  adasum::impl::partials_strided(TestExec(), na.data(), nb.data(), 997, got);
  CHECK(std::isnan(got[1]));
  CHECK(!std::isfinite(got[2]));
}

TEMPLATE_TEST_CASE("host kernels (AVX2, AVX-512 where the CPU has them) give the scalar kernels' bits",
                   "[adasum][operator]", float, double) {
  using T = TestType;
  using adasum::impl::Isa;
  INFO("widest on this CPU: " << adasum::impl::to_string(adasum::impl::host_isa()));
  const Vec xa = input<T>(0, 1000, 51), xb = input<T>(1, 1000, 51);
  const std::vector<T> a(xa.begin(), xa.end()), b(xb.begin(), xb.end());
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(adasum::impl::host_isa())) {
      REQUIRE_THROWS_WITH(adasum::impl::apply_isa(isa, (T*)nullptr, a.data(), b.data(), 0, 1.0, 1.0),
                          Catch::Contains("apply_isa") && Catch::Contains("does not run"));
      continue;
    }
    INFO("path " << adasum::impl::to_string(isa));
    for (std::size_t len : {0,   1,   3,   4,   5,   7,   8,   9,   15,  16,  17,  63,  64, 65,
                            127, 128, 129, 191, 192, 200, 255, 256, 257, 320, 511, 512, 999}) {
      INFO("length " << len);
      double fast[3] = {0.5, 0, -1}, cached[3] = {0.5, 0, -1}, slow[3] = {0.5, 0, -1};
      adasum::impl::add_blocks_isa(isa, a.data(), b.data(), 1, 1 + len, fast);
      adasum::impl::add_blocks_isa(isa, a.data(), b.data(), 1, 1 + len, cached, adasum::impl::Locality::cache);
      for (std::size_t s0 = 1; s0 < 1 + len; s0 += adasum::impl::kBlock)
        adasum::impl::add_block(a.data(), b.data(), s0, std::min(s0 + adasum::impl::kBlock, 1 + len), slow);
      CHECK(std::memcmp(fast, slow, sizeof fast) == 0);
      CHECK(std::memcmp(cached, slow, sizeof cached) == 0);  // four blocks at once: the same bits
      std::vector<T> out_fast(len), out_slow(len);
      adasum::impl::apply_isa(isa, out_fast.data(), a.data() + 1, b.data() + 1, len, 0.73, -1.21);
      for (std::size_t i = 0; i < len; ++i) out_slow[i] = adasum::impl::apply_one(0.73, a[1 + i], -1.21, b[1 + i]);
      CHECK(out_fast == out_slow);
      // Writing a second copy over b itself (the in-place push): both copies are the result.
      std::vector<T> b_then_result(b.begin() + 1, b.begin() + 1 + static_cast<long>(len)), out2(len);
      adasum::impl::apply_isa(isa, out2.data(), a.data() + 1, b_then_result.data(), len, 0.73, -1.21,
                              b_then_result.data());
      CHECK(out2 == out_slow);
      CHECK(b_then_result == out_slow);
    }
  }
  // Passes that fit in L2 interleave blocks; larger ones (and an unknown L2 above 1 MiB) do not.
  const std::size_t l2 = adasum::impl::l2_cache_bytes() ? adasum::impl::l2_cache_bytes() : std::size_t(1) << 20;
  CHECK(adasum::impl::locality_of(l2) == adasum::impl::Locality::cache);
  CHECK(adasum::impl::locality_of(l2 + 1) == adasum::impl::Locality::memory);
  // The dispatching entry points are the widest path.
  double host[3] = {}, widest[3] = {};
  adasum::impl::add_blocks_host(a.data(), b.data(), 0, 999, host);
  adasum::impl::add_blocks_isa(adasum::impl::host_isa(), a.data(), b.data(), 0, 999, widest);
  CHECK(std::memcmp(host, widest, sizeof host) == 0);
}
