// adasum/: the operator (serial) and the distributed all-reduce against the documented tree.
// combine() and allreduce() run on TestExec over TestMem views (test_space.hpp); inputs and the
// serial references are built on the host.
#include <catch2/catch.hpp>
#include <kdist/adasum/allreduce.hpp>
#include <kdist/adasum/calibrate.hpp>
#include <kdist/adasum/host_kernels.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <type_traits>

#include "adasum_reference.hpp"
#include "test_space.hpp"

using kdist_test::TestExec;
using kdist_test::TestVector;
using kdist_test::to_host;
using kdist_test::Vec;
namespace adasum = kdist::adasum;

namespace {

std::vector<std::size_t> bounds_of(const std::vector<std::size_t>& sizes) {
  std::vector<std::size_t> b{0};
  for (auto s : sizes) b.push_back(b.back() + s);
  return b;
}

/// A TestMem vector holding x rounded to T.
template <class T>
TestVector<T> view_of(const Vec& x, const std::string& label = "x") {
  TestVector<T> v(label, x.size());
  kdist_test::fill(v, [&x](std::size_t i) { return x[i]; });
  return v;
}

/// A TestMem vector of n elements, element i = f(i) (built on the host).
template <class T, class F>
TestVector<T> view_from(const std::string& label, std::size_t n, F f) {
  TestVector<T> v(label, n);
  kdist_test::fill(v, f);
  return v;
}

/// The values of a TestMem vector, read through a host mirror.
template <class T>
Vec vec_of(const TestVector<T>& v) {
  const auto h = to_host(v);
  Vec x(h.extent(0));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(h(i));
  return x;
}

/// Balanced tree of the kdist operator over many vectors (serial).
template <class T>
Vec operator_tree(std::vector<Vec> xs, const std::vector<std::size_t>& bounds) {
  std::vector<TestVector<T>> level;
  for (auto& x : xs) level.push_back(view_of<T>(x));
  while (level.size() > 1) {
    decltype(level) next;
    for (std::size_t i = 0; i + 1 < level.size(); i += 2) {
      adasum::combine(TestExec(), level[i], level[i + 1], bounds);
      next.push_back(level[i]);
    }
    if (level.size() % 2) next.push_back(level.back());
    level = next;
  }
  return vec_of<T>(level[0]);
}

// Rank r's input: deterministic, different per rank, exactly representable in T.
template <class T>
Vec input(int rank, std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed * 1000 + rank);
  std::normal_distribution<double> g;
  Vec x(n);
  for (auto& v : x) v = static_cast<double>(static_cast<T>(g(rng)));
  return x;
}

}  // namespace

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

// ---- the distributed all-reduce ----------------------------------------------------------------

template <class T>
void check_distributed(const std::vector<std::size_t>& sizes, unsigned seed, int node_size = 0,
                       adasum::Algorithm algorithm = adasum::Algorithm::vhdd) {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  std::unique_ptr<adasum::Topology> topo_owner(node_size ? new adasum::Topology(eng, node_size) : nullptr);
  const adasum::Topology* topo = topo_owner.get();
  const int P = world.size(), me = world.rank();
  const auto bounds = bounds_of(sizes);
  const std::size_t n = bounds.back();
  std::vector<Vec> all;
  for (int r = 0; r < P; ++r) all.push_back(input<T>(r, n, seed));
  auto v = view_of<T>(all[static_cast<std::size_t>(me)]);
  adasum::AdasumCounters cnt;
  adasum::Options options;
  options.algorithm = algorithm;
  options.hierarchy = topo;
  options.counters = &cnt;
  adasum::allreduce(TestExec(), eng, v, bounds, {}, options).wait();

  Vec ref;
  if (topo) {  // Adasum over node averages
    const int k = topo->node().size();
    std::vector<Vec> avgs;
    for (int node = 0; node < P / k; ++node) {
      Vec a(n, 0.0);
      for (int l = 0; l < k; ++l)
        for (std::size_t i = 0; i < n; ++i) a[i] += all[static_cast<std::size_t>(node * k + l)][i] / k;
      avgs.push_back(a);
    }
    ref = kdist_test::adasum_tree(avgs, bounds);
  } else {
    ref = kdist_test::adasum_tree(all, bounds);
  }
  INFO("P " << P << " n " << n << " tensors " << sizes.size() << (topo ? " hierarchical" : " flat") << ", "
            << adasum::to_string(algorithm));
  CHECK(kdist_test::rel_l2(vec_of(v), ref) <= 100 * std::numeric_limits<T>::epsilon());

  // Bit-identical on every rank (compared through host copies: MPI reads host memory here).
  const auto mine = to_host(v);
  std::vector<T> everyone(n * static_cast<std::size_t>(P));
  MPI_Allgather(mine.data(), static_cast<int>(n * sizeof(T)), MPI_BYTE, everyone.data(),
                static_cast<int>(n * sizeof(T)), MPI_BYTE, MPI_COMM_WORLD);
  bool identical = true;
  for (int r = 0; r < P; ++r)
    identical = identical && std::memcmp(everyone.data() + r * n, mine.data(), n * sizeof(T)) == 0;
  CHECK(identical);

  const bool doubling = !topo && algorithm == adasum::Algorithm::doubling;
  if (doubling) {
    // Whole vectors: log2 P' exchanges of n (the fold's n more on either side of a pair), no partials round.
    int L = 0;
    while ((2 << L) <= P) ++L;
    const int q = P - (1 << L);
    const bool folded_away = me < 2 * q && me % 2 == 1, folds_in = me < 2 * q && me % 2 == 0;
    const long long elements = folded_away ? static_cast<long long>(n) : (L + folds_in) * static_cast<long long>(n);
    CHECK(cnt.vector_bytes_sent == elements * static_cast<long long>(sizeof(T)));
    CHECK(cnt.vector_exchanges == (folded_away ? 2 : L + 2 * folds_in));  // a fold is two steps
    CHECK(cnt.partial_reductions == 0);
  }
  if (!topo && !doubling) {
    // Traffic bounds of VHDD (an all-gather followed by a local tree would send (P-1) n).
    int Pp = 1, L = 0;
    while (Pp * 2 <= P) {
      Pp *= 2;
      ++L;
    }
    const int q = P - Pp;
    const double fold = me < 2 * q ? static_cast<double>(n) : 0.0;
    const double bound = (2.0 * (Pp - 1) / Pp * n + L + fold) * sizeof(T);
    INFO("rank " << me << " sent " << cnt.vector_bytes_sent << " B in " << cnt.vector_exchanges << " exchanges; bound "
                 << bound);
    CHECK(static_cast<double>(cnt.vector_bytes_sent) <= bound);
    CHECK(cnt.vector_exchanges <= 2 * L + 2);
    CHECK(cnt.partial_reductions <= L);
  }
}

TEMPLATE_TEST_CASE("Adasum all-reduce equals the documented tree, bit-identical on every rank", "[adasum][mpi]", float,
                   double) {
  for (adasum::Algorithm a : {adasum::Algorithm::vhdd, adasum::Algorithm::doubling}) {
    check_distributed<TestType>({1000}, 1, 0, a);
    check_distributed<TestType>({5, 0, 1, 777, 3, 64}, 2, 0, a);
    check_distributed<TestType>({1}, 3, 0, a);
    check_distributed<TestType>({3, 2}, 4, 0, a);  // fewer elements than ranks at 5-8
  }
}

TEST_CASE("Adasum: automatic takes doubling below small_bytes, the two agree to rounding, the choice is checked",
          "[adasum][mpi]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  const int P = world.size(), me = world.rank();
  const std::vector<std::size_t> b{0, 100, 300};
  const Vec x = input<double>(me, 300, 21);
  auto run = [&](adasum::Options o) {
    adasum::AdasumCounters c;
    o.counters = &c;
    auto v = view_of<double>(x);
    adasum::allreduce(TestExec(), eng, v, b, {}, o).wait();
    return std::make_pair(vec_of(v), c);
  };
  adasum::Options vhdd, doubling, automatic;
  vhdd.algorithm = adasum::Algorithm::vhdd;
  doubling.algorithm = adasum::Algorithm::doubling;
  const auto rv = run(vhdd), rd = run(doubling), ra = run(automatic);  // 2400 B < kDefaultSmallBytes
  CHECK(kdist_test::rel_l2(rv.first, rd.first) < 1e-13);
  CHECK(ra.first == rd.first);
  CHECK(ra.second.partial_reductions == 0);
  automatic.small_bytes = 2400;  // not below: VHDD
  const auto rb = run(automatic);
  CHECK(rb.first == rv.first);
  CHECK(rb.second.partial_reductions == rv.second.partial_reductions);
  if (P > 1) {
    // Ranks that choose differently get an error on every rank from the Engine's check, no hang.
    adasum::Options mixed;
    mixed.algorithm = me == P - 1 ? adasum::Algorithm::vhdd : adasum::Algorithm::doubling;
    auto v = view_of<double>(x);
    CHECK_THROWS_WITH(adasum::allreduce(TestExec(), eng, v, b, {}, mixed).wait(), Catch::Contains("adasum"));
  }
}

// The last rank fails its Engine with `why` instead of calling run(); every other rank's run()
// must throw naming it, no hang. Returns true on the ranks that ran.
bool last_rank_fails_instead(kdist::comm::Engine& eng, const std::function<void()>& run, const std::string& why) {
  const int P = eng.size(), me = eng.rank();
  if (me == P - 1) {
    eng.fail(std::runtime_error(why));
    CHECK_FALSE(eng.healthy());
    return false;
  }
  CHECK_THROWS_WITH(run(), Catch::Contains("rank " + std::to_string(P - 1) + " failed") && Catch::Contains(why));
  return true;
}

TEST_CASE("Adasum doubling with its data in the check: a rank that fails instead is named on every rank",
          "[adasum][mpi]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  const int P = world.size(), me = world.rank();
  if (P < 2) return;
  kdist::comm::Engine eng(world);
  adasum::Options doubling;
  doubling.algorithm = adasum::Algorithm::doubling;
  const Vec x = input<double>(me, 300, 21);
  auto v = view_of<double>(x);
  last_rank_fails_instead(
      eng,
      [&] {
        adasum::allreduce(TestExec(), eng, v, {0, 100, 300}, {}, doubling).wait();
      },
      "rank gave up before its all-reduce");
}

TEST_CASE("Adasum doubling: level 0 rides in the signature check on a power of two, same bits either way",
          "[adasum][mpi]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  const int P = world.size(), me = world.rank();
  const std::vector<std::size_t> b{0, 100, 300};
  const Vec x = input<double>(me, 300, 21);
  adasum::Options doubling;
  doubling.algorithm = adasum::Algorithm::doubling;
  auto run = [&](kdist::comm::Engine& eng) {
    auto v = view_of<double>(x);
    const long long calls = eng.stats().payload_calls;
    adasum::allreduce(TestExec(), eng, v, b, {}, doubling).wait();
    return std::make_pair(vec_of(v), eng.stats().payload_calls - calls);
  };
  kdist::comm::Engine checked(world), unchecked(world, kdist::comm::EngineOptions{false});
  const auto with_check = run(checked), without = run(unchecked);
  CHECK(with_check.first == without.first);
  int levels = 0;
  while ((2 << levels) <= P) ++levels;
  const bool power_of_two = (P & (P - 1)) == 0;
  // The MPI calls that move payload: a send and a receive per level, minus level 0's when it
  // went with the check (and the check is not counted as payload).
  if (P > 1 && power_of_two) {
    INFO("doubling over " << P << " ranks, which path ran");
    CHECK(with_check.second == 2 * (levels - 1));
    CHECK(without.second == 2 * levels);
    // Above 64 KiB level 0 goes through MPI again: the check's copies would cost more.
    const Vec big = input<double>(me, 9000, 21);
    auto v = view_of<double>(big);
    const long long calls = checked.stats().payload_calls;
    adasum::allreduce(TestExec(), checked, v, {0, 9000}, {}, doubling).wait();
    CHECK(checked.stats().payload_calls - calls == 2 * levels);
  }
  if (P > 1) {
    // Ranks that double vectors of different sizes send check messages of different sizes: the
    // signature tells them apart on every rank, no truncation and no hang.
    const Vec y = input<double>(me, me == P - 1 ? 301 : 300, 21);
    auto v = view_of<double>(y);
    const std::vector<std::size_t> by{0, 100, y.size()};
    CHECK_THROWS_AS(adasum::allreduce(TestExec(), checked, v, by, {}, doubling).wait(), kdist::comm::MismatchError);
  }
}

// Tensors of 0 to 300 elements, so that blocks, chunks and halves end inside and between them.
std::vector<std::size_t> awkward_bounds() {
  return bounds_of({5, 0, 130, 1, 64, 300, 0, 77, 129});
}

// The two halves' partials of a 2-rank VHDD, each summed by partials() on the host space in one
// pass and then added: what the unchunked exchange computed before chunking existed.
template <class T>
std::vector<T> two_rank_vhdd(const Vec& x0, const Vec& x1, const std::vector<std::size_t>& b) {
  const std::size_t n = x0.size(), mid = n / 2, tensors = b.size() - 1;
  std::vector<T> a(x0.begin(), x0.end()), c(x1.begin(), x1.end());
  std::vector<double> lo(3 * tensors), hi(3 * tensors), sum(3 * tensors);
  const Kokkos::DefaultHostExecutionSpace host;
  adasum::partials(host, a.data(), c.data(), 0, mid, b, lo.data());
  adasum::partials(host, a.data() + mid, c.data() + mid, mid, n - mid, b, hi.data());
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = lo[i] + hi[i];
  adasum::apply(host, a.data(), a.data(), c.data(), 0, n, b, sum.data());
  return a;
}

TEMPLATE_TEST_CASE(
    "Adasum: chunked exchanges give the unchunked result bit for bit, chunk ends inside and between "
    "tensors",
    "[adasum][mpi]", float, double) {
  using T = TestType;
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  const int P = world.size(), me = world.rank();
  // 64-element blocks and chunk ends of 3, 7, 64 and 100 elements fall inside tensors, at their
  // ends and across empty ones; the largest chunk covers every half (one message per exchange).
  const auto bounds = awkward_bounds();
  const std::size_t n = bounds.back();
  const Vec x = input<T>(me, n, 31);
  std::unique_ptr<adasum::Topology> pairs(P % 2 == 0 ? new adasum::Topology(eng, 2) : nullptr);
  const adasum::Topology* hierarchy = nullptr;
  auto run = [&](std::size_t chunk_elements, adasum::AdasumCounters* c) {
    adasum::Options o;
    o.algorithm = adasum::Algorithm::vhdd;
    o.chunk_bytes = chunk_elements * sizeof(T);
    o.counters = c;
    o.hierarchy = hierarchy;
    auto v = view_of<T>(x);
    adasum::allreduce(TestExec(), eng, v, bounds, {}, o).wait();
    const auto h = to_host(v);
    return std::vector<T>(h.data(), h.data() + n);
  };
  adasum::AdasumCounters whole, tiny;
  const std::vector<T> ref = run(n, &whole);
  int Pp = 1;
  while (Pp * 2 <= P) Pp *= 2;
  const int q = P - Pp;
  const bool folded_away = me < 2 * q && me % 2 == 1, folds_in = me < 2 * q && me % 2 == 0;
  // One message per exchange, except the fold's receive.
  CHECK(whole.vector_messages == whole.vector_exchanges - (folds_in ? 1 : 0) - (folded_away ? 1 : 0));
  for (std::size_t k : {3, 7, 64, 100}) {
    INFO("P " << P << " chunks of " << k << " elements");
    adasum::AdasumCounters c;
    CHECK(run(k, &c) == ref);
    CHECK(c.vector_bytes_sent == whole.vector_bytes_sent);
    CHECK(c.vector_exchanges == whole.vector_exchanges);
    if (P > 1 && !folded_away) CHECK(c.vector_messages > whole.vector_messages);  // the halves went in chunks
  }
  if (P == 2 && Kokkos::DefaultHostExecutionSpace().concurrency() == 1) {
    // Equal to the unchunked pass over each half (the order before chunking).
    std::vector<Vec> all;
    for (int r = 0; r < 2; ++r) all.push_back(input<T>(r, n, 31));
    CHECK(two_rank_vhdd<T>(all[0], all[1], bounds) == ref);
    CHECK(run(3, &tiny) == ref);
  }
  if (pairs) {  // hierarchical, nodes of 2: the cross-node levels chunk the same way
    hierarchy = pairs.get();
    const std::vector<T> h = run(n, nullptr);
    CHECK(run(3, nullptr) == h);
    CHECK(run(64, nullptr) == h);
    hierarchy = nullptr;
  }
  if (P > 1) {
    // Ranks that chunk differently are caught by the Engine's check on every rank, no hang.
    adasum::Options mixed;
    mixed.algorithm = adasum::Algorithm::vhdd;
    mixed.chunk_bytes = (me == P - 1 ? 5 : 9) * sizeof(T);
    auto v = view_of<T>(x);
    CHECK_THROWS_WITH(adasum::allreduce(TestExec(), eng, v, bounds, {}, mixed).wait(), Catch::Contains("chunks of"));
  }
}

TEMPLATE_TEST_CASE("Adasum on a SharedBuffer: in place or through MPI, flat or with nodes, the same bits as a view",
                   "[adasum][mpi]", float, double) {
  using T = TestType;
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  const int P = world.size(), me = world.rank();
  const auto bounds = awkward_bounds();
  const std::size_t n = bounds.back();
  adasum::SharedBuffer<T> buf(eng, n);
  REQUIRE(buf.size() == n);
  std::unique_ptr<adasum::Topology> pairs(P % 2 == 0 && P > 2 ? new adasum::Topology(eng, 2) : nullptr);
  int pow2 = 1;
  while (pow2 * 2 <= P) pow2 *= 2;
  std::vector<const adasum::Topology*> layouts{nullptr};  // flat, and nodes of two where P allows
  if (pairs) layouts.push_back(pairs.get());
  for (unsigned seed : {41u, 42u}) {  // twice: the buffer is written again right after completion
    const Vec x = input<T>(me, n, seed);
    for (const adasum::Topology* hierarchy : layouts) {
      adasum::Options o;
      o.algorithm = adasum::Algorithm::vhdd;
      o.hierarchy = hierarchy;
      auto v = view_of<T>(x);
      adasum::allreduce(TestExec(), eng, v, bounds, {}, o).wait();
      const auto ref = to_host(v);
      for (bool in_place : {true, false})
        for (std::size_t chunk : {std::size_t(0), std::size_t(7)}) {
          o.in_place = in_place;
          o.chunk_bytes = chunk * sizeof(T);
          adasum::AdasumCounters c;
          o.counters = &c;
          auto h = buf.view();
          for (std::size_t i = 0; i < n; ++i) h(i) = static_cast<T>(x[i]);
          const long long calls0 = eng.stats().payload_calls;
          adasum::allreduce(eng, buf, bounds, {}, o).wait();
          const long long calls = eng.stats().payload_calls - calls0;
          INFO("P " << P << (hierarchy ? " nodes of 2" : " flat") << (in_place ? ", in place" : ", through MPI")
                    << ", chunk " << chunk << ": " << c.in_place_levels << " levels in place");
          CHECK(std::memcmp(h.data(), ref.data(), n * sizeof(T)) == 0);
          // Which path ran: every level reads in place when ranks share the node (they do under
          // mpiexec here), none when in_place is off; nothing is sent for an in-place level.
          const bool shares = buf.window().node_size() == P;
          const bool folded_away = me < 2 * (P - pow2) && me % 2 == 1;  // takes part in no level
          if (in_place && shares && P > 1 && (!folded_away || hierarchy)) CHECK(c.in_place_levels > 0);
          if (!in_place) CHECK(c.in_place_levels == 0);
          if (in_place && shares && P == pow2 && !hierarchy) {
            CHECK(c.vector_bytes_sent == 0);
            // The messages of the push protocol (a send and a receive each): level l's partials
            // round (l + 1 exchanges), a "ready" token at every level but the first (the
            // check's agreement stands in for it), a "pushed" token per gather level, no more.
            int L = 0;
            while ((2 << L) <= P) ++L;
            if (P > 1) CHECK(calls == L * (L + 1) + 2 * (L - 1) + 2 * L);
          }
        }
    }
  }
  {
    // With the Engine's check off, the first read in place waits for the partner's one-byte
    // message instead of the check's agreement (hear_inputs_final): the same bits.
    kdist::comm::EngineOptions unchecked;
    unchecked.check_consistency = false;
    kdist::comm::Engine quiet(world, unchecked);
    adasum::SharedBuffer<T> qbuf(quiet, n);
    for (unsigned seed : {44u, 45u}) {
      const Vec x = input<T>(me, n, seed);
      adasum::Options o;
      o.algorithm = adasum::Algorithm::vhdd;
      auto v = view_of<T>(x);
      adasum::allreduce(TestExec(), quiet, v, bounds, {}, o).wait();
      const auto ref = to_host(v);
      adasum::AdasumCounters c;
      o.counters = &c;
      auto h = qbuf.view();
      for (std::size_t i = 0; i < n; ++i) h(i) = static_cast<T>(x[i]);
      const long long calls0 = quiet.stats().payload_calls;
      adasum::allreduce(quiet, qbuf, bounds, {}, o).wait();
      const long long unchecked_calls = quiet.stats().payload_calls - calls0;
      INFO("P " << P << ", unchecked Engine, in place: " << c.in_place_levels << " levels in place");
      CHECK(std::memcmp(h.data(), ref.data(), n * sizeof(T)) == 0);
      const bool folded_away = me < 2 * (P - pow2) && me % 2 == 1;
      if (qbuf.window().node_size() == P && P > 1 && !folded_away) CHECK(c.in_place_levels > 0);
      // The checked Engine skips exactly that message (a send and a receive) at a power of two.
      for (std::size_t i = 0; i < n; ++i) buf.view()(i) = static_cast<T>(x[i]);
      const long long calls1 = eng.stats().payload_calls;
      o.counters = nullptr;
      adasum::allreduce(eng, buf, bounds, {}, o).wait();
      CHECK(std::memcmp(buf.data(), ref.data(), n * sizeof(T)) == 0);
      if (buf.window().node_size() == P && P == pow2 && P > 1)
        CHECK(eng.stats().payload_calls - calls1 == unchecked_calls - 2);
    }
  }
  // NaN on the last rank, in place: every rank names the tensor and the rank.
  auto h = buf.view();
  const Vec x = input<T>(me, n, 43);
  for (std::size_t i = 0; i < n; ++i) h(i) = static_cast<T>(x[i]);
  if (me == P - 1) h(bounds[5] + 3) = std::numeric_limits<T>::quiet_NaN();
  adasum::Options o;
  o.algorithm = adasum::Algorithm::vhdd;
  CHECK_THROWS_WITH(adasum::allreduce(eng, buf, bounds, {}, o).wait(),
                    Catch::Contains("tensor 5") && Catch::Contains("rank " + std::to_string(P - 1)));
  // An empty SharedBuffer of no tensors (bounds {0}) does nothing, in place or not.
  adasum::SharedBuffer<T> empty(eng, 0);
  for (bool in_place : {true, false}) {
    o.in_place = in_place;
    adasum::allreduce(eng, empty, {0}, {}, o).wait();
  }
  if (P > 1) {
    // Ranks that ask for different sizes get an error on every rank.
    CHECK_THROWS_AS(adasum::SharedBuffer<T>(eng, me == 0 ? 10 : 11), kdist::InvalidArgument);
    // Ranks that disagree on reading in place get the Engine's mismatch on every rank, no hang,
    // before anyone reads a peer's block (the last use of this Engine: it refuses work after).
    adasum::Options mixed;
    mixed.algorithm = adasum::Algorithm::vhdd;
    mixed.in_place = me != P - 1;
    CHECK_THROWS_WITH(adasum::allreduce(eng, buf, bounds, {}, mixed).wait(), Catch::Contains("in place"));
  }
}

TEST_CASE("Adasum in place: a rank that fails instead of submitting is named on every rank, nobody reads its block",
          "[adasum][mpi]") {
  // With the check on, the first read of a partner's block waits for the check's agreement, not
  // a message of its own: a partner that never submits must stop everyone before that read.
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  const int P = world.size(), me = world.rank();
  if (P < 2) return;
  kdist::comm::Engine eng(world);
  const auto bounds = awkward_bounds();
  adasum::SharedBuffer<float> buf(eng, bounds.back());
  for (std::size_t i = 0; i < buf.size(); ++i) buf.data()[i] = 1.0f + static_cast<float>(me);
  adasum::Options o;
  o.algorithm = adasum::Algorithm::vhdd;
  if (last_rank_fails_instead(
          eng, [&] { adasum::allreduce(eng, buf, bounds, {}, o).wait(); },
          "rank gave up before its in-place all-reduce"))  // nothing ran: the block is as written
    CHECK(std::all_of(buf.data(), buf.data() + buf.size(), [me](float x) { return x == 1.0f + me; }));
}

TEST_CASE("Adasum: the default chunk comes from the L2 cache size", "[adasum]") {
  const std::size_t c = adasum::default_chunk_bytes();
  CHECK(c >= (64u << 10));
  CHECK(c <= (1u << 20));
}

TEST_CASE("Adasum: an empty buffer of no tensors (bounds {0}) does nothing, on either algorithm", "[adasum][mpi]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  for (adasum::Algorithm a : {adasum::Algorithm::vhdd, adasum::Algorithm::doubling}) {
    TestVector<float> empty("empty", 0);
    adasum::Options o;
    o.algorithm = a;
    adasum::AdasumCounters c;
    o.counters = &c;
    adasum::allreduce(TestExec(), eng, empty, {0}, {}, o).wait();
    CHECK(c.vector_bytes_sent == 0);
    TestVector<float> e2("e2", 0);
    adasum::combine(TestExec(), empty, e2, {0});
  }
  // The engine is still usable afterwards.
  auto v = view_from<double>("v", 4, [](std::size_t i) { return 1.0 + static_cast<double>(i); });
  adasum::allreduce(TestExec(), eng, v, {0, 4}).wait();
  CHECK(vec_of(v)[3] == Approx(4.0));
}

TEST_CASE("Adasum of orthogonal inputs is their sum; of parallel inputs, their mean", "[adasum][mpi]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  const int P = world.size(), me = world.rank();
  const std::size_t n = 64;
  // Orthogonal: disjoint supports.
  auto o = view_from<double>("o", n, [P, me](std::size_t i) { return static_cast<int>(i % P) == me ? 1.0 + me : 0.0; });
  adasum::allreduce(TestExec(), eng, o, {0, n}).wait();
  const Vec ho = vec_of(o);
  double err = 0;
  for (std::size_t i = 0; i < n; ++i) err = std::max(err, std::abs(ho[i] - (1.0 + static_cast<double>(i % P))));
  CHECK(err < 1e-14);
  // Parallel: x_r = (r + 1) u.
  std::vector<Vec> all;
  for (int r = 0; r < P; ++r) {
    Vec x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = (r + 1) * (1.0 + 0.5 * static_cast<double>(i % 3));
    all.push_back(x);
  }
  auto p = view_of<double>(all[static_cast<std::size_t>(me)], "p");
  adasum::allreduce(TestExec(), eng, p, {0, n}).wait();
  const Vec ref = kdist_test::adasum_tree(all, {0, n});
  CHECK(kdist_test::rel_l2(vec_of(p), ref) < 1e-14);
  if ((P & (P - 1)) == 0) {  // power of two: the plain mean
    Vec mean(n, 0.0);
    for (const auto& x : all)
      for (std::size_t i = 0; i < n; ++i) mean[i] += x[i] / P;
    CHECK(kdist_test::rel_l2(vec_of(p), mean) < 1e-14);
  }
}

TEST_CASE("hierarchical Adasum equals Adasum over node averages and differs from flat", "[adasum][mpi]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  const int P = world.size();
  if (P % 2 != 0) return;  // node size 2
  check_distributed<double>({100, 1, 37}, 7, 2);
  check_distributed<float>({9}, 8, 2);
  kdist::comm::Engine eng(world);
  adasum::Topology topo(eng, 2);
  if (P == 4) {
    // Adasum(avg(x0, x1), avg(x2, x3)) != flat Adasum(x0, x1, x2, x3) on the same inputs.
    const std::vector<std::size_t> b{0, 50};
    auto h = view_of<double>(input<double>(world.rank(), 50, 11));
    auto f = view_of<double>(input<double>(world.rank(), 50, 11));
    adasum::allreduce(TestExec(), eng, h, b, {}, &topo).wait();
    adasum::allreduce(TestExec(), eng, f, b).wait();
    CHECK(kdist_test::rel_l2(vec_of(h), vec_of(f)) > 1e-3);
  }
  if (P >= 4) REQUIRE_THROWS_WITH(adasum::Topology(eng, P - 1), Catch::Contains("does not divide"));
}

TEST_CASE("NaN or Inf on one rank: every rank throws naming the tensor and the rank", "[adasum][mpi]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  const int P = world.size(), me = world.rank();
  for (bool hier : {false, true}) {
    if (hier && P % 2 != 0) continue;
    std::unique_ptr<adasum::Topology> topo(hier ? new adasum::Topology(eng, 2) : nullptr);
    auto v = view_from<float>("v", 30, [P, me](std::size_t i) {
      if (me == P - 1 && i == 12) return std::numeric_limits<float>::quiet_NaN();
      if (me == 0 && P > 1 && i == 25) return std::numeric_limits<float>::infinity();
      return 1.0f;
    });
    try {
      adasum::allreduce(TestExec(), eng, v, {0, 10, 20, 30}, {"fc1.weight", "fc1.bias", "fc2.weight"}, topo.get())
          .wait();
      FAIL("no error");
    } catch (const adasum::NonFiniteError& e) {
      // The first bad tensor is fc1.bias (index 1) on rank P-1.
      CHECK_THAT(e.what(), Catch::Contains("'fc1.bias'") && Catch::Contains("on rank " + std::to_string(P - 1)));
    }
  }
  // The NaN on each rank in turn (folded-away ranks included): that rank is named.
  for (int culprit = 0; culprit < P; ++culprit) {
    auto v = view_from<double>("v", 30, [me, culprit](std::size_t i) {
      return me == culprit && i == 29 ? std::numeric_limits<double>::quiet_NaN() : 2.0 + me;
    });
    for (adasum::Algorithm a : {adasum::Algorithm::vhdd, adasum::Algorithm::doubling}) {
      INFO("culprit " << culprit << ", " << adasum::to_string(a));
      adasum::Options o;
      o.algorithm = a;
      auto w = view_from<double>("w", 30, [&v](std::size_t) { return 0.0; });
      Kokkos::deep_copy(w, v);
      REQUIRE_THROWS_WITH(adasum::allreduce(TestExec(), eng, w, {0, 10, 20, 30}, {"a", "b", "c"}, o).wait(),
                          Catch::Contains("in 'c' (10 elements) on rank " + std::to_string(culprit) + ";"));
    }
  }
}

TEST_CASE("Adasum: the calibrated crossover between doubling and VHDD", "[adasum][mpi]") {
  using kdist::CostKey;
  using kdist::CostModel;
  using kdist::CostOp;
  using kdist::DType;
  kdist::CostModelStore store;
  CHECK(adasum::small_bytes_from(store, DType::float32, 4) == adasum::kDefaultSmallBytes);
  const CostKey vhdd{CostOp::adasum, DType::float32, 4, "world"},
      doubling{CostOp::adasum, DType::float32, 4, "world/doubling"};
  store.set(vhdd, CostModel::from_measurements({1024, 4096, 16384, 65536}, {4e-5, 4.1e-5, 4.4e-5, 9e-5}));
  CHECK(adasum::small_bytes_from(store, DType::float32, 4) == adasum::kDefaultSmallBytes);  // one of two
  store.set(doubling, CostModel::from_measurements({1024, 4096, 16384, 65536}, {2e-5, 3e-5, 4.4e-5, 2e-4}));
  CHECK(adasum::small_bytes_from(store, DType::float32, 4) == 16384);  // VHDD no slower from 16 KiB
  store.set(doubling, CostModel::from_measurements({1024, 4096, 16384, 65536}, {1e-5, 1e-5, 1e-5, 1e-5}));
  CHECK(adasum::small_bytes_from(store, DType::float32, 4) == 2 * 65536);  // doubling faster everywhere
  CHECK(adasum::small_bytes_from(store, DType::float64, 4) == adasum::kDefaultSmallBytes);

  // Measured here through the engine: both models over the same sizes, every time positive.
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  kdist::comm::CalibrationOptions o;
  o.min_bytes = 64;
  o.max_bytes = 1024;
  o.warmup = 1;
  o.repeats = 2;
  const auto models = adasum::calibrate(eng, DType::float64, o);
  CHECK(models.first.x() == std::vector<double>{64, 256, 1024});
  CHECK(models.second.x() == models.first.x());
  for (double t : models.first.t()) CHECK(t > 0);
  for (double t : models.second.t()) CHECK(t > 0);
  CHECK(eng.in_flight() == 0);
  o.repeats = 0;
  CHECK_THROWS_WITH(adasum::calibrate(eng, DType::float32, o), Catch::Contains("repeats 0"));
  CHECK_THROWS_AS(adasum::calibrate(eng, DType::int32, o), kdist::InvalidArgument);
}
