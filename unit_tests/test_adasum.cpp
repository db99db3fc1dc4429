// adasum/: the operator (serial) and the distributed all-reduce against the documented tree.
// combine() and allreduce() run on TestExec over TestMem views (test_space.hpp); inputs and the
// serial references are built on the host.
#include <catch2/catch.hpp>
#include <kdist/adasum/allreduce.hpp>
#include <kdist/adasum/calibrate.hpp>
#include <kdist/adasum/host_kernels.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <type_traits>

#include "adasum_reference.hpp"
#include "adasum_test_util.hpp"
#include "same_on_every_rank.hpp"
#include "test_space.hpp"

// TestExec, TestVector, Vec, the adasum namespace alias and the shared helpers.
using namespace kdist_test::adasum_util;

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
  CHECK(kdist_test::same_on_every_rank(vec_of(v)));

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
  // Beyond 4 ranks (oversubscribed here, milliseconds a message) two sizes still end chunks
  // inside tensors, at every level and in the fold.
  const std::vector<std::size_t> chunks =
      P <= 4 ? std::vector<std::size_t>{3, 7, 64, 100} : std::vector<std::size_t>{7, 100};
  for (std::size_t k : chunks) {
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
  // Every node size that divides P: nodes of 2 and 3 at 6 ranks put the fold (3 nodes) and nodes
  // of more than 2 ranks to the test.
  for (int k = 2; k <= P; ++k) {
    if (P % k != 0) continue;
    check_distributed<double>({100, 1, 37}, 7, k);
    check_distributed<float>({9}, 8, k);
  }
  if (P % 2 != 0) return;
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

// Hidden: run by test_adasum.interleaved_nodes.np4 with MPIR_CVAR_NUM_CLIQUES=2 (MPICH splits the
// world round-robin into two shared-memory "machines", {0,2} and {1,3}). A communicator that swaps
// world ranks 2 and 3 then has nodes {0,3} and {1,2}: their ranks are not in the same order. Keyed
// by rank, the cross group of local position 0 ordered the nodes ({0,3} first) and that of
// position 1 the other way round ({1,2} first): slices of different nodes were mixed (error 1e-2).
TEST_CASE("hierarchical Adasum over shared-memory nodes whose ranks interleave", "[.interleaved-nodes][adasum]") {
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  REQUIRE(world_size == 4);
  const int keys[4] = {0, 1, 3, 2};
  MPI_Comm swapped = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 0, keys[world_rank], &swapped);
  kdist::comm::Communicator world(swapped);
  MPI_Comm_free(&swapped);  // the Communicator holds its own duplicate
  kdist::comm::Engine eng(world);
  adasum::Topology topo(eng, 0);
  const int P = world.size(), me = world.rank();
  // The layout this test needs, as MPI reports it, agreed by every rank (MPI other than MPICH
  // ignores the variable); kdist's Topology must then find the same nodes.
  const std::vector<int> wanted = me == 0 || me == 3 ? std::vector<int>{0, 3} : std::vector<int>{1, 2};
  const std::vector<bool> mates = kdist_test::adasum_util::mpi_node_mates(world.raw());
  bool mine = true;
  for (int r = 0; r < P; ++r) mine = mine && mates[static_cast<std::size_t>(r)] == (r == wanted[0] || r == wanted[1]);
  if (eng.allreduce_values<int>({mine ? 1 : 0}, kdist::comm::ReduceOp::min, "layout")[0] == 0) {
    if (me == 0)
      std::printf("SKIPPED: no shared-memory nodes {0,3} and {1,2} (needs MPICH, MPIR_CVAR_NUM_CLIQUES=2)\n");
    return;
  }
  REQUIRE(topo.node().size() == 2);
  CHECK(topo.node_peer(0) == wanted[0]);
  CHECK(topo.node_peer(1) == wanted[1]);
  const std::vector<std::size_t> bounds{0, 100, 101, 140};
  const std::size_t n = bounds.back();
  std::vector<Vec> all;
  for (int r = 0; r < P; ++r) all.push_back(input<double>(r, n, 21));
  auto v = view_of<double>(all[static_cast<std::size_t>(me)]);
  adasum::allreduce(TestExec(), eng, v, bounds, {}, &topo).wait();
  std::vector<Vec> avgs(2, Vec(n, 0.0));
  for (int r = 0; r < P; ++r)
    for (std::size_t i = 0; i < n; ++i) avgs[r == 0 || r == 3 ? 0 : 1][i] += all[static_cast<std::size_t>(r)][i] / 2;
  CHECK(kdist_test::rel_l2(vec_of(v), kdist_test::adasum_tree(avgs, bounds)) < 1e-12);
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
  // The slowest rank's times: every rank builds the same crossover from them.
  CHECK(kdist_test::same_on_every_rank(models.first.t()));
  CHECK(kdist_test::same_on_every_rank(models.second.t()));
  CHECK(eng.in_flight() == 0);
  o.repeats = 0;
  CHECK_THROWS_WITH(adasum::calibrate(eng, DType::float32, o), Catch::Contains("repeats 0"));
  CHECK_THROWS_AS(adasum::calibrate(eng, DType::int32, o), kdist::InvalidArgument);
}
