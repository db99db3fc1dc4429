// comm/: fusion planners against exhaustive search, fused == unfused all-reduce. The
// FusedAllreducer runs on TestExec with its buffers and tensors in TestMem (test_space.hpp).
#include <catch2/catch.hpp>
#include <kdist/comm/fused_allreducer.hpp>
#include <kdist/core/cost_model.hpp>

#include <cstdio>
#include <random>

#include "deep_copies.hpp"
#include "test_space.hpp"

using namespace kdist::comm;
using kdist::CostModel;
using kdist_test::TestExec;
using kdist_test::TestMem;
using kdist_test::to_host;

namespace {
std::vector<FusionTensor> random_instance(std::mt19937_64& rng, int n) {
  std::uniform_int_distribution<int> size(1, 4000);
  std::exponential_distribution<double> gap(1.0 / 2e-4);
  std::vector<FusionTensor> t(static_cast<std::size_t>(n));
  double r = 0;
  for (auto& x : t) {
    r += gap(rng);
    x = {static_cast<std::size_t>(size(rng)) * 256, r};
  }
  return t;
}
double exhaustive_best(const std::vector<FusionTensor>& t, const CostFunction& c) {
  const int n = static_cast<int>(t.size());
  double best = 1e300;
  for (unsigned mask = 0; mask < (1u << (n - 1)); ++mask) {  // bit k set: split after tensor k
    FusionPlan p;
    for (int k = 0; k < n - 1; ++k)
      if (mask & (1u << k)) p.group_end.push_back(k + 1);
    p.group_end.push_back(n);
    best = std::min(best, plan_finish_time(t, p, c));
  }
  return best;
}
}  // namespace

TEST_CASE("optimal planner equals exhaustive search and never loses to the baselines", "[comm][fusion]") {
  std::mt19937_64 rng(2024);
  const CostModel c = CostModel::linear(50e-6, 1.0 / 2e9);
  int strictly_better = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 1 + trial % 12;
    const auto t = random_instance(rng, n);
    const double opt = plan_finish_time(t, plan_optimal(t, c), c);
    CHECK(opt == Approx(exhaustive_best(t, c)).epsilon(1e-12));
    const double mg = plan_finish_time(t, plan_mgwfbp(t, c, c(0.0)), c);
    const double th = plan_finish_time(t, plan_threshold(t, 64u << 20), c);
    const double none = plan_finish_time(t, plan_none(n), c);
    CHECK(opt <= mg + 1e-15);
    CHECK(opt <= th + 1e-15);
    CHECK(opt <= none + 1e-15);
    CHECK(opt >= finish_time_lower_bound(t, c) - 1e-15);
    if (opt < mg * (1 - 1e-9) && opt < th * (1 - 1e-9)) ++strictly_better;
  }
  CHECK(strictly_better >= 1);
}

TEST_CASE("a fixed instance where the optimal plan strictly beats MG-WFBP and the threshold", "[comm][fusion]") {
  // alpha = 1, beta = 1 per byte. A large tensor ready first, then two small ones. MG-WFBP merges
  // the second small one's predecessor into the large one's call (the gap 0.5 is below alpha) and
  // finishes at 16; the threshold plan waits for everything (16.5); the optimum sends the large
  // tensor alone at once and the two small ones together: 15.5.
  const CostModel c = CostModel::linear(1.0, 1.0);
  const std::vector<FusionTensor> t = {{10, 1.5}, {1, 2.0}, {1, 3.5}};
  const double opt = plan_finish_time(t, plan_optimal(t, c), c);
  const double mg = plan_finish_time(t, plan_mgwfbp(t, c, 1.0), c);
  const double th = plan_finish_time(t, plan_threshold(t, 1000), c);
  CHECK(plan_optimal(t, c).group_end == std::vector<int>{1, 3});
  CHECK(plan_mgwfbp(t, c, 1.0).group_end == std::vector<int>{2, 3});
  CHECK(opt == Approx(15.5));
  CHECK(mg == Approx(16.0));
  CHECK(th == Approx(16.5));
}

TEST_CASE("planner basics", "[comm][fusion]") {
  const std::vector<FusionTensor> t = {{100, 0}, {200, 0}, {50, 0}, {400, 0}, {10, 0}};
  CHECK(plan_none(5).group_end == std::vector<int>{1, 2, 3, 4, 5});
  CHECK(plan_threshold(t, 300).group_end == std::vector<int>{2, 3, 4, 5});
  CHECK(plan_threshold(t, 300).group_of(2) == 1);
  CHECK(plan_threshold(t, 10000).groups() == 1);
}

TEMPLATE_TEST_CASE("FusedAllreducer equals unfused all-reduce for every planner", "[comm][fusion][mpi]", float,
                   double) {
  using T = TestType;
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  const int P = world.size(), me = world.rank();
  using FA = FusedAllreducer<T, TestMem>;
  // Flat tensors from 1 to 1e6 elements and packed symmetric ones; A2 comes back as its upper
  // triangle only (its lower one holds -1, which must survive).
  std::vector<typename FA::Tensor> specs = {{"g0", 1, false},  {"A0", 7, true},        {"g1", 1000, false},
                                            {"G0", 33, true},  {"g2", 1000000, false}, {"g3", 3, false},
                                            {"A1", 128, true}, {"g4", 50000, false},   {"A2", 20, true, true}};
  std::vector<FusionTensor> sizes;
  for (std::size_t i = 0; i < specs.size(); ++i) sizes.push_back({specs[i].elements() * sizeof(T), 1e-4 * i});
  const CostModel cost = CostModel::linear(30e-6, 1.0 / 2e9);
  for (Planner pl : {Planner::none, Planner::threshold, Planner::mgwfbp, Planner::optimal}) {
    PlannerOptions opt;
    opt.planner = pl;
    opt.threshold_bytes = 64 * 1024;
    FA fused(eng, specs, FA::sum());
    fused.set_plan(decide_plan_on_root(eng, sizes, cost, opt));
    const FusionPlan plan = fused.plan();
    std::vector<typename FA::Vector> flat(specs.size());
    std::vector<typename FA::Symmetric> sym(specs.size());
    const long long calls_before = eng.stats().collective_calls;
    fused.begin();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].symmetric) {
        const int d = static_cast<int>(specs[i].dim);
        const bool upper = specs[i].upper_only;
        sym[i] = kdist_test::device_matrix<T>(specs[i].label, d, d, [me, upper](int a, int b) {
          return upper && a > b ? -1 : (me + 1) * (std::min(a, b) + 2 * std::max(a, b)) % 13;
        });
        fused.ready(TestExec(), static_cast<int>(i), sym[i]);
      } else {
        flat[i] = typename FA::Vector(specs[i].label, specs[i].dim);
        kdist_test::fill(flat[i], [me, i](std::size_t k) { return (me + 1) * ((k + i) % 11); });
        fused.ready(TestExec(), static_cast<int>(i), flat[i]);
      }
    }
    fused.wait(TestExec());
    INFO("planner " << to_string(pl) << " groups " << plan.groups());
    CHECK(eng.stats().collective_calls - calls_before == plan.groups());
    const double tri = P * (P + 1) / 2.0;  // sum over ranks of (rank + 1)
    bool ok = true;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].symmetric) {
        const auto h = to_host(sym[i]);
        const int d = static_cast<int>(specs[i].dim);
        for (int a = 0; a < d; ++a)
          for (int b = 0; b < d; ++b) {
            double ref = 0;
            for (int r = 0; r < P; ++r) ref += (r + 1) * (std::min(a, b) + 2 * std::max(a, b)) % 13;
            if (specs[i].upper_only && a > b) ref = -1;
            ok = ok && static_cast<double>(h(a, b)) == ref;
          }
      } else {
        const auto h = to_host(flat[i]);
        for (std::size_t k = 0; k < specs[i].dim; ++k) ok = ok && static_cast<double>(h(k)) == tri * ((k + i) % 11);
      }
    }
    CHECK(ok);
  }
}

TEST_CASE("FusedAllreducer rejects out-of-order and mis-sized tensors", "[comm][fusion]") {
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  using FA = FusedAllreducer<double, TestMem>;
  FA fused(eng, {{"a", 4, false}, {"b", 5, false}});
  fused.begin();
  FA::Vector b("b", 5), a("a", 3);
  REQUIRE_THROWS_WITH(fused.ready(TestExec(), 1, b), Catch::Contains("out of order") && Catch::Contains("expected 0"));
  REQUIRE_THROWS_WITH(fused.ready(TestExec(), 0, a),
                      Catch::Contains("size 3") && Catch::Contains("registered as size 4"));
}

TEST_CASE("FusedAllreducer::set_plan rejects plans that do not cover each tensor once", "[comm][fusion]") {
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  using FA = FusedAllreducer<double, TestMem>;
  FA fused(eng, {{"a", 4, false}, {"b", 5, false}, {"c", 2, false}});
  const std::string me = "rank " + std::to_string(world.rank());
  // An empty first group (its label would read tensors_[-1]), an end out of order (tensor 2 in
  // no group, never reduced), a repeated end, an end past N, and a plan that stops short.
  REQUIRE_THROWS_WITH(fused.set_plan(FusionPlan{{0, 3}}),
                      Catch::Contains("FusedAllreducer::set_plan") && Catch::Contains("plan {0,3} for 3 tensors") &&
                          Catch::Contains("group 0 ends at 0") && Catch::Contains(me));
  REQUIRE_THROWS_WITH(fused.set_plan(FusionPlan{{2, 1, 3}}),
                      Catch::Contains("plan {2,1,3}") && Catch::Contains("group 1 ends at 1"));
  REQUIRE_THROWS_WITH(fused.set_plan(FusionPlan{{1, 1, 3}}), Catch::Contains("group 1 ends at 1"));
  REQUIRE_THROWS_WITH(fused.set_plan(FusionPlan{{2, 4}}), Catch::Contains("group 1 ends at 4"));
  REQUIRE_THROWS_WITH(fused.set_plan(FusionPlan{{1, 2}}), Catch::Contains("cover 2 of 3"));
  REQUIRE_THROWS_WITH(fused.set_plan(FusionPlan{}), Catch::Contains("cover 0 of 3"));
  // The rejected plans left the previous one in place; a valid plan still reduces every tensor.
  CHECK(fused.plan().group_end == std::vector<int>{1, 2, 3});
  fused.set_plan(FusionPlan{{2, 3}});
  // Rank r holds k (r + 1) in tensor k: the average over P ranks is k (P + 1) / 2, which no
  // tensor left unreduced would hold at P > 1.
  FA::Vector a("a", 4), b("b", 5), c("c", 2);
  const double r1 = world.rank() + 1, mean = (world.size() + 1) / 2.0;
  Kokkos::deep_copy(a, 1.0 * r1);
  Kokkos::deep_copy(b, 2.0 * r1);
  Kokkos::deep_copy(c, 3.0 * r1);
  eng.reset_stats();
  fused.begin();
  fused.ready(TestExec(), 0, a);
  fused.ready(TestExec(), 1, b);
  fused.ready(TestExec(), 2, c);
  fused.wait(TestExec());
  TestExec().fence();
  CHECK(to_host(a)(3) == 1.0 * mean);
  CHECK(to_host(b)(4) == 2.0 * mean);
  CHECK(to_host(c)(1) == 3.0 * mean);
  CHECK(eng.stats().collective_calls == 2);  // one per group of the plan
}

TEST_CASE("FusedAllreducer::use_storage reduces tensors where they lie in the caller's storage", "[comm][fusion]") {
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  using FA = FusedAllreducer<double, TestMem>;
  // Flat tensors of 3, 4 and 5 elements around a symmetric 3 x 3 one (6 packed elements).
  FA fused(eng, {{"a", 3, false}, {"S", 3, true}, {"b", 4, false}, {"c", 5, false}}, FA::sum());
  FA::Buffer storage("storage", 3 + 6 + 4 + 5);
  fused.use_storage(storage);
  const double r1 = world.rank() + 1, tri = world.size() * (world.size() + 1) / 2.0;
  // Two groups, then one: the slots must follow the groups' offsets either way. a and c live in
  // their slots; b is a view of its own, copied in and out.
  for (const FusionPlan& plan : {FusionPlan{{2, 4}}, FusionPlan{{4}}}) {
    fused.set_plan(plan);
    const auto slot = [&](int i, std::size_t n) {
      return FA::Vector(fused.slot_data(i), n);  // unmanaged: the storage's own elements
    };
    const FA::Vector a = slot(0, 3), c = slot(3, 5);
    FA::Vector b("b", 4);
    REQUIRE(a.data() == storage.data());
    REQUIRE(c.data() == storage.data() + 13);
    const auto S = kdist_test::device_matrix<double>("S", 3, 3, [&](int i, int j) { return r1 * (1 + i + j); });
    kdist_test::fill(a, [&](std::size_t k) { return r1 * (k + 1); });
    kdist_test::fill(b, [&](std::size_t k) { return r1 * (k + 10); });
    kdist_test::fill(c, [&](std::size_t k) { return r1 * (k + 20); });
    kdist_test::DeepCopiesTouching copies(storage.data(), storage.size() * sizeof(double));
    fused.begin();
    fused.ready(TestExec(), 0, a);
    fused.ready(TestExec(), 1, S);
    fused.ready(TestExec(), 2, b);
    fused.ready(TestExec(), 3, c);
    fused.wait(TestExec());
    TestExec().fence();
    INFO("plan of " << plan.groups() << " group(s)");
    CHECK(copies.count() == 2);  // b in and out; a and c reduced where they lie, S packed by a kernel
    const auto ha = to_host(a), hb = to_host(b), hc = to_host(c), hs = to_host(storage);
    const auto hS = to_host(S);
    bool ok = true;
    for (std::size_t k = 0; k < 3; ++k) ok = ok && ha(k) == tri * (k + 1);
    for (std::size_t k = 0; k < 4; ++k) ok = ok && hb(k) == tri * (k + 10) && hs(9 + k) == hb(k);
    for (std::size_t k = 0; k < 5; ++k) ok = ok && hc(k) == tri * (k + 20);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) ok = ok && hS(i, j) == tri * (1 + i + j);
    CHECK(ok);
  }
}

// Storage of the wrong size on one rank fails the Engine: that rank gets its InvalidArgument, the
// others a RemoteError with its reason at their wait, instead of waiting for a group that never
// comes.
TEST_CASE("FusedAllreducer::use_storage refused on one rank: an error on every rank, no hang", "[comm][fusion]") {
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  using FA = FusedAllreducer<double, TestMem>;
  FA fused(eng, {{"a", 3, false}, {"b", 4, false}}, FA::sum());
  const int P = world.size(), me = world.rank();
  const bool bad = me == P - 1;
  FA::Buffer storage("storage", bad ? 6 : 7);  // the last rank's is one element short
  FA::Vector a("a", 3), b("b", 4);
  std::string got;
  try {
    fused.use_storage(storage);
    fused.begin();
    fused.ready(TestExec(), 0, a);
    fused.ready(TestExec(), 1, b);
    fused.wait(TestExec());
  } catch (const RemoteError& e) {
    got = std::string("remote: ") + e.what();
  } catch (const kdist::InvalidArgument& e) {
    got = std::string("own: ") + e.what();
  }
  INFO(got);
  CHECK(got.rfind(bad ? "own: " : "remote: ", 0) == 0);
  CHECK(got.find("use_storage") != std::string::npos);
  CHECK(got.find("must hold the 7 elements of the 2 tensors (rank " + std::to_string(P - 1) + ")") !=
        std::string::npos);
}
