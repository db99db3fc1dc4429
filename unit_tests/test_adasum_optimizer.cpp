// adasum/: delta optimizer and the gradient-reduction option, against serial references. The
// optimizer, its local SGD step and the fused reductions run on TestExec over TestMem views
// (test_space.hpp); inputs and references are built on the host.
#include <catch2/catch.hpp>
#include <kdist/adasum/delta_optimizer.hpp>
#include <kdist/adasum/gradient_reduction.hpp>

#include <chrono>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

#include "adasum_reference.hpp"
#include "test_space.hpp"

using kdist_test::TestExec;
using kdist_test::TestMem;
using kdist_test::to_host;
using kdist_test::Vec;
namespace adasum = kdist::adasum;
using Param = adasum::DeltaOptimizer<double, TestMem>::Param;

namespace {
Vec random_vec(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g;
  Vec v(n);
  for (auto& x : v) x = g(rng);
  return v;
}
Param param(const std::string& label, const Vec& v) {
  return kdist_test::device_vector(label, v);
}
// The user's optimizer: SGD with momentum-free update p -= lr g, a kernel on `exec`.
void sgd(const TestExec& exec, const std::vector<Param>& ps, const std::vector<Param>& gs, double lr) {
  for (std::size_t k = 0; k < ps.size(); ++k) {
    const Param p = ps[k], g = gs[k];
    Kokkos::parallel_for(
        "test::sgd", Kokkos::RangePolicy<TestExec>(exec, 0, p.extent(0)),
        KOKKOS_LAMBDA(const std::size_t i) { p(i) -= lr * g(i); });
  }
}
/// One step of `fused`: tensor t is this rank's slice [bounds[t], bounds[t+1]) of `mine`, handed
/// to ready() in order after pause(t); returns the tensors, reduced.
template <class FA, class Pause>
std::vector<typename FA::Vector> reduce_slices(FA& fused, const std::vector<typename FA::Tensor>& specs,
                                               const std::vector<std::size_t>& bounds, const Vec& mine,
                                               const Pause& pause) {
  std::vector<typename FA::Vector> ts;
  fused.begin();
  for (std::size_t t = 0; t < specs.size(); ++t) {
    ts.emplace_back(specs[t].label, specs[t].dim);
    const std::size_t off = bounds[t];
    kdist_test::fill(ts[t], [&mine, off](std::size_t i) { return mine[off + i]; });
    pause(t);
    fused.ready(TestExec(), static_cast<int>(t), ts[t]);
  }
  fused.wait(TestExec());
  return ts;
}
/// Every parameter's values, concatenated, read through host mirrors.
Vec concat(const std::vector<Param>& ps) {
  Vec out;
  for (const Param& p : ps) {
    const auto h = to_host(p);
    for (std::size_t i = 0; i < h.extent(0); ++i) out.push_back(h(i));
  }
  return out;
}
}  // namespace

TEST_CASE("delta optimizer: start + Adasum(p_local - start), the plain step at one rank", "[adasum][optimizer]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  const int P = world.size(), me = world.rank();
  const std::vector<std::size_t> sizes{6, 1, 40};
  std::vector<Param> ps, gs;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    ps.push_back(param("w" + std::to_string(k), random_vec(sizes[k], 100 + k)));  // same start everywhere
    gs.push_back(param("g" + std::to_string(k), random_vec(sizes[k], 1000 * (me + 1) + k)));
  }
  const double lr = 0.1;
  // Reference: every rank's delta is -lr g_r; the result is start + tree(deltas).
  std::vector<std::size_t> bounds{0};
  for (auto s : sizes) bounds.push_back(bounds.back() + s);
  const Vec start = concat(ps);
  std::vector<Vec> deltas;
  for (int r = 0; r < P; ++r) {
    Vec d;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const Vec g = random_vec(sizes[k], 1000 * (r + 1) + k);
      for (double x : g) d.push_back(-lr * x);
    }
    deltas.push_back(d);
  }
  const Vec tree = kdist_test::adasum_tree(deltas, bounds);

  adasum::DeltaOptimizer<double, TestMem> opt(eng, ps);
  opt.step(TestExec(), gs, [&] { sgd(TestExec(), ps, gs, lr); });
  const Vec got = concat(ps);
  Vec want;
  for (std::size_t j = 0; j < start.size(); ++j) want.push_back(start[j] + tree[j]);
  CHECK(kdist_test::rel_l2(got, want) < 1e-14);
  // At one rank the plain step, to rounding: start + (p - start) rounds twice (bit for bit on the
  // host; not on an H200, whose step fuses the multiply-add).
  if (P == 1) {
    std::vector<Param> plain;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      plain.push_back(param("p" + std::to_string(k), random_vec(sizes[k], 100 + k)));
    sgd(TestExec(), plain, gs, lr);
    CHECK(kdist_test::rel_l2(got, concat(plain)) < 1e-15);
  }
}

TEST_CASE("delta optimizer clips the gradients before the local step", "[adasum][optimizer]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  std::vector<Param> ps{param("w", Vec(4, 1.0))}, gs{param("g", Vec{3.0, 4.0, 0.0, 0.0})};  // |g| = 5
  std::vector<double> seen;
  adasum::DeltaOptimizer<double, TestMem> opt(eng, ps);
  opt.step(
      TestExec(), gs,
      [&] {
        const auto g = to_host(gs[0]);  // the clipped gradients the local step sees
        seen = {g(0), g(1)};
        sgd(TestExec(), ps, gs, 1.0);
      },
      /*max_grad_norm=*/1.0);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == Approx(0.6));
  CHECK(seen[1] == Approx(0.8));
  // Every rank took the same step, so Adasum of identical deltas is that delta.
  const auto p = to_host(ps[0]);
  CHECK(p(0) == Approx(0.4));
  CHECK(p(1) == Approx(0.2));
  CHECK(p(2) == 1.0);
}

TEST_CASE("delta optimizer: a failed all-reduce leaves every rank's parameters as before the step",
          "[adasum][optimizer]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  const int P = world.size(), me = world.rank();
  const Vec w0{1.0, 0.5, -2.0}, b0{0.25};
  std::vector<Param> ps{param("w", w0), param("b", b0)};
  // Every rank steps differently; the last rank's gradient is NaN, so the all-reduce raises
  // NonFiniteError everywhere. Without the restore each rank kept its own local step (and the
  // last its NaNs): the ranks diverged.
  std::vector<Param> gs{param("gw", Vec(3, me + 1.0)),
                        param("gb", Vec{me == P - 1 ? std::numeric_limits<double>::quiet_NaN() : 1.0})};
  adasum::DeltaOptimizer<double, TestMem> opt(eng, ps);
  REQUIRE_THROWS_AS(opt.step(TestExec(), gs, [&] { sgd(TestExec(), ps, gs, 0.1); }), kdist::NonFiniteError);
  CHECK(concat(ps) == Vec{1.0, 0.5, -2.0, 0.25});
  // The optimizer goes on with the next batch from the shared parameters.
  std::vector<Param> ok{param("gw", Vec(3, 1.0)), param("gb", Vec{1.0})};
  opt.step(TestExec(), ok, [&] { sgd(TestExec(), ps, ok, 0.5); });
  CHECK(kdist_test::rel_l2(concat(ps), Vec{0.5, 0.0, -2.5, -0.25}) < 1e-14);
}

TEST_CASE("delta optimizer: a local step that throws on one rank fails every rank, parameters restored",
          "[adasum][optimizer][reliability]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  const int P = world.size(), me = world.rank();
  const Vec w0{1.0, 0.5, -2.0};
  std::vector<Param> ps{param("w", w0)}, gs{param("gw", Vec(3, 1.0))};
  adasum::DeltaOptimizer<double, TestMem> opt(eng, ps);
  // The last rank's optimizer fails after moving its parameters; the others are in the all-reduce
  // by then (before, they waited there for ever).
  const auto step = [&] {
    sgd(TestExec(), ps, gs, 0.1);
    if (me == P - 1) throw std::runtime_error("optimizer state lost");
  };
  if (me == P - 1)
    REQUIRE_THROWS_WITH(opt.step(TestExec(), gs, step), "optimizer state lost");
  else
    REQUIRE_THROWS_WITH(opt.step(TestExec(), gs, step),
                        Catch::Contains("rank " + std::to_string(P - 1)) && Catch::Contains("optimizer state lost"));
  CHECK(concat(ps) == w0);
  CHECK_FALSE(eng.healthy());
}

TEST_CASE("gradient reduction option: sum, average and Adasum through FusedAllreducer", "[adasum][fusion]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  const int P = world.size(), me = world.rank();
  using FA = kdist::comm::FusedAllreducer<double, TestMem>;
  const std::vector<FA::Tensor> specs{{"conv.w", 30, false}, {"conv.b", 3, false}, {"fc.w", 50, false}};
  std::vector<std::size_t> bounds{0, 30, 33, 83};
  std::vector<Vec> inputs;
  for (int r = 0; r < P; ++r) inputs.push_back(random_vec(83, 7 + r));
  for (auto mode :
       {adasum::GradientReduction::sum, adasum::GradientReduction::average, adasum::GradientReduction::adasum}) {
    FA fused(eng, specs, adasum::make_reduction<double, TestMem>(mode));
    fused.set_plan(kdist::comm::plan_threshold({{240, 0}, {24, 0}, {400, 0}}, 300));
    const auto ts = reduce_slices(fused, specs, bounds, inputs[static_cast<std::size_t>(me)], [](std::size_t) {});
    const Vec got = concat(ts);
    Vec want(83, 0.0);
    if (mode == adasum::GradientReduction::adasum) {
      want = kdist_test::adasum_tree(inputs, bounds);  // per tensor, across the fusion groups too
    } else {
      for (const auto& x : inputs)
        for (std::size_t i = 0; i < 83; ++i) want[i] += x[i];
      if (mode == adasum::GradientReduction::average)
        for (auto& w : want) w /= P;
    }
    INFO("mode " << static_cast<int>(mode));
    CHECK(kdist_test::rel_l2(got, want) < 1e-13);
  }
}

// Eight Adasum groups in flight on an Engine with two tag blocks: the composites reuse each block
// four times, each posting only once the one before it on its block has finished (test_engine
// checks the order itself). The ranks reach the tensors at different times.
TEST_CASE("Adasum through FusedAllreducer with more groups in flight than tag blocks", "[adasum][fusion]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::EngineOptions few_tags;
  few_tags.tag_limit = 3 * kdist::comm::Schedule::kMaxTag - 1;  // blocks 0 (send/recv), 1 and 2
  kdist::comm::Engine eng(world, few_tags);
  const int P = world.size(), me = world.rank();
  using FA = kdist::comm::FusedAllreducer<double, TestMem>;
  std::vector<FA::Tensor> specs;
  std::vector<std::size_t> bounds{0};
  for (int t = 0; t < 8; ++t) {
    specs.push_back({"t" + std::to_string(t), static_cast<std::size_t>(40 + 300 * (t % 3)), false});
    bounds.push_back(bounds.back() + specs.back().dim);
  }
  std::vector<Vec> inputs;
  for (int r = 0; r < P; ++r) inputs.push_back(random_vec(bounds.back(), 11 + r));
  FA fused(eng, specs, adasum::make_reduction<double, TestMem>(adasum::GradientReduction::adasum));
  fused.set_plan(kdist::comm::FusionPlan{{1, 2, 3, 4, 5, 6, 7, 8}});  // a group per tensor
  const auto ts = reduce_slices(fused, specs, bounds, inputs[static_cast<std::size_t>(me)], [me](std::size_t t) {
    if ((t + static_cast<std::size_t>(me)) % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  CHECK(kdist_test::rel_l2(concat(ts), kdist_test::adasum_tree(inputs, bounds)) < 1e-13);
  // One rank asks for too few tags: every rank refuses, none waits in the constructor.
  kdist::comm::EngineOptions too_few;
  too_few.tag_limit = me == P - 1 ? 2 * kdist::comm::Schedule::kMaxTag - 2 : 0;
  CHECK_THROWS_WITH(kdist::comm::Engine(world, too_few),
                    Catch::Contains("a rank's EngineOptions::tag_limit is below 8191") &&
                        Catch::Contains("this rank's is " + std::to_string(too_few.tag_limit)));
}

TEST_CASE("gradient reduction option: Adasum rejects symmetric (packed) tensors, sum takes them", "[adasum][fusion]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  const int P = world.size();
  using FA = kdist::comm::FusedAllreducer<double, TestMem>;
  // Packed, the 3x3 matrix's off-diagonal entries appear once: Adasum's dot products would
  // weigh them half as much as in the matrix (it silently did).
  const std::vector<FA::Tensor> specs{{"fc.b", 2, false}, {"kfac.A", 3, true}};
  FA::Vector bias("fc.b", 2);
  FA::Symmetric factor("kfac.A", 3, 3);
  Kokkos::deep_copy(bias, 1.0);
  Kokkos::deep_copy(factor, 2.0);
  FA adasum_fused(eng, specs, adasum::make_reduction<double, TestMem>(adasum::GradientReduction::adasum));
  adasum_fused.begin();
  adasum_fused.ready(TestExec(), 0, bias);  // a flat tensor alone in its group: fine
  REQUIRE_THROWS_WITH(adasum_fused.ready(TestExec(), 1, factor),
                      Catch::Contains("Adasum") && Catch::Contains("symmetric tensor 'kfac.A'") &&
                          Catch::Contains("6 packed elements") &&
                          Catch::Contains("rank " + std::to_string(world.rank())));
  adasum_fused.wait_reduced();  // the first group's reduction completes; the Engine is healthy
  CHECK(eng.healthy());
  FA sum_fused(eng, specs, adasum::make_reduction<double, TestMem>(adasum::GradientReduction::sum));
  sum_fused.begin();
  sum_fused.ready(TestExec(), 0, bias);
  sum_fused.ready(TestExec(), 1, factor);
  sum_fused.wait(TestExec());
  CHECK(to_host(factor)(2, 0) == 2.0 * P);
}
