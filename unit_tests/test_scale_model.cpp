// The scale model (perf/model) against iterations worked out by hand: a two-layer network with
// linear cost models, whose every phase is derived in the comments below from the timeline the
// header states; P = 1; packing; the platform file, its extrapolation and errors; FLOP-based times.
#include <kdist/core/error.hpp>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "model/platform.hpp"

namespace {

using namespace kdist_perf;
using Approx = Catch::Detail::Approx;

// Layer 0: a = 3, g = 2; layer 1: a = 4, g = 3 (times in seconds, large and round on purpose).
std::vector<LayerTimes> two_layers() {
  LayerTimes l0{"l0", 3, 2, 6, 1.0, 2.0, 0.5, 0.25, 0.4};
  LayerTimes l1{"l1", 4, 3, 12, 2.0, 1.0, 0.5, 0.5, 0.6};
  return {l0, l1};
}

// all-reduce 0.1 + 0.01 b, broadcast 0.2 + 0.001 b, inverse 0.01 d^3, float (4 bytes).
CommModels linear_models() {
  CommModels m;
  m.allreduce = kdist::CostModel::linear(0.1, 0.01);
  m.placement.broadcast = kdist::CostModel::linear(0.2, 0.001);
  m.placement.inverse = kdist::CostModel::linear(0.0, 0.01);
  m.placement.element_bytes = 4;
  return m;
}

Scenario scenario(int P, kdist::kfac::Strategy st) {
  kdist::kfac::Options o;
  o.strategy = st;
  Scenario s;
  s.ranks = P;
  s.switches = kdist::kfac::resolve(o);
  return s;
}

// Shared by the cases at P = 2. End of backward T_b = 6 (fwd + bwd) + 1.75 (factors) = 7.75.
// Gradients, one call each (planner none): (0.1 + 0.24) + (0.1 + 0.48) = 0.92.
// Split preconditioning (kfac::precondition_split): layer 0 over its outputs (busiest rank
// ceil(2/2) * a = 3 against ceil(3/2) * g = 4 over inputs), w = 1: 0.4 * 1/2 + all-reduce(a*w*P*4 / 2
// = 3*1*2*4 / 2 = 12 B) = 0.2 + 0.22; layer 1 over its inputs (ceil(4/2) * 3 = 6 against
// ceil(3/2) * 4 = 8), w = 2: 0.6 * 2/4 + all-reduce(g*w*P*4 / 2 = 3*2*2*4 / 2 = 24 B) = 0.3 + 0.34;
// sum 1.06.
constexpr double kTb = 7.75, kGrad = 0.92, kPrecond = 0.4 * 1 / 2 + 0.22 + 0.6 * 2 / 4 + 0.34;

}  // namespace

TEST_CASE("scale model: D-KFAC at 2 ranks, by hand", "[scale_model]") {
  // Factors packed: A0 6, A1 10, G1 6, G0 3 elements = 100 B; threshold planner: one call, 0.1 + 1.0.
  // Replicated inverses: 0.27 + 0.64 + 0.27 + 0.08 = 1.26 on every rank, nothing broadcast.
  const Prediction p = predict(two_layers(), linear_models(), scenario(2, kdist::kfac::Strategy::dkfac));
  const Breakdown& b = p.phases;
  CHECK(b.fwd_bwd == Approx(6.0));
  CHECK(b.factors == Approx(1.75));
  CHECK(b.grad_comm == Approx(kGrad));
  CHECK(b.factor_comm == Approx(1.1));
  CHECK(b.inverses == Approx(1.26));
  CHECK(b.inverse_comm == Approx(0.0).margin(1e-12));
  CHECK(b.precondition == Approx(kPrecond));
  CHECK(b.total == Approx(kTb + kGrad + 1.1 + 1.26 + kPrecond));
  CHECK(p.factor_plan.groups() == 1);
  // The gradient passes (gather, clip, scatter) count once per layer; split over inputs, the
  // un-blocking copy adds one more (a third).
  std::vector<LayerTimes> copying = two_layers();
  copying[0].precondition_copy = 0.1;
  copying[1].precondition_copy = 0.2;
  const Prediction c = predict(copying, linear_models(), scenario(2, kdist::kfac::Strategy::dkfac));
  CHECK(c.phases.precondition == Approx(kPrecond + 0.1 + 0.2 * 4 / 3));
}

TEST_CASE("scale model: SPD-KFAC at 2 ranks, by hand", "[scale_model]") {
  // Ready times: A0 0.5, A1 0.5 + 1 + 0.5 = 2, G1 4 + 0.5 = 4.5, G0 5.5 + 0.25 = 5.75. One call
  // each finishes at 5.97 < T_b, which no plan can beat (G0 alone needs 5.75 + 0.22): nothing exposed.
  // LBP: inverse 0.27 / 0.64 / 0.08 against broadcast 0.224 / 0.24 / 0.212 for d = 3 / 4 / 2, so G0
  // is NCT; A1 (d = 4) goes to rank 0, then A0 and G1 (d = 3, index order) to rank 1.
  // Broadcast order by ready time: A0 (rank 1, inverted by 0.27) sent 0.27 -> 0.494, G1 (rank 1,
  // by 0.54) sent 0.54 -> 0.764, A1 (rank 0, by 0.64) sent 0.764 -> 1.004. Rank 0 computes 0.64 + 0.08.
  // (The earlier rank-major rounds sent A1 first and ended at 1.328.)
  const Prediction p = predict(two_layers(), linear_models(), scenario(2, kdist::kfac::Strategy::spd));
  const Breakdown& b = p.phases;
  CHECK(p.placement.owner == std::vector<int>{1, 0, 1, -1});
  CHECK(b.factor_comm == Approx(0.0).margin(1e-12));
  CHECK(p.factor_comm_unpipelined == Approx(1.1));
  CHECK(b.inverses == Approx(0.72));
  CHECK(b.inverse_comm == Approx(1.004 - 0.72));
  CHECK(b.total == Approx(kTb + kGrad + 1.004 + kPrecond));
  CHECK(kdist::kfac::broadcast_order(p.placement) == std::vector<int>{0, 2, 1});
  // The placement is kfac::place's, not a copy of it.
  const auto again =
      kdist::kfac::place(placement_items(two_layers()), linear_models().placement, 2, kdist::kfac::PlacementKind::lbp);
  CHECK(again.owner == p.placement.owner);
}

TEST_CASE("scale model: exposed factor communication when backward ends first", "[scale_model]") {
  // Compute 100x faster: ready times 0.005, 0.02, 0.045, 0.0575 and T_b = 0.0775. One call per
  // tensor ends at 1.405, A0 alone then the rest at 1.205, all in one call at 0.0575 + 1.1: optimal
  // takes that, and exposes 1.1575 - 0.0775. The bound is max(0.0575 + 0.22, 0.005 + 1.1) - T_b.
  auto layers = two_layers();
  for (auto& l : layers)
    for (double* t : {&l.forward, &l.backward, &l.factor_a, &l.factor_g}) *t /= 100;
  const Prediction p = predict(layers, linear_models(), scenario(2, kdist::kfac::Strategy::spd));
  CHECK(p.factor_plan.groups() == 1);
  CHECK(p.phases.factor_comm == Approx(0.0575 + 1.1 - 0.0775));
  CHECK(p.factor_comm_bound == Approx(0.005 + 1.1 - 0.0775));
}

TEST_CASE("scale model: packing and unpacking of the factors", "[scale_model]") {
  // 0.1 to pack and 0.05 to unpack each factor. Not pipelined: 0.4 + 1.1 + 0.2 after the gradients.
  // Pipelined: packing moves into the hooks (factors + 0.4, T_b + 0.4), unpacking stays exposed.
  // Inverses (LBP as in the case above, order A0, G1, A1): the owner packs each CT inverse and the
  // others unpack it. A0 (rank 1, 0.27 + 0.1) sent 0.37 -> 0.594, G1 (rank 1, by 0.74) 0.74 -> 0.964,
  // A1 (rank 0, by 0.74) 0.964 -> 1.204. Rank 0: inverses 0.64 + 0.08 (G0) = 0.72, work 0.82, then
  // unpacks A0 (0.87) and G1 (max(0.87, 0.964) + 0.05 = 1.014) and waits A1: 1.204, so 0.384 of
  // broadcast wait. Rank 1 unpacks A1 after 1.204: 1.254, the phase's end.
  auto layers = two_layers();
  for (auto& l : layers) {
    l.pack_a = l.pack_g = 0.1;
    l.unpack_a = l.unpack_g = 0.05;
  }
  const Prediction d = predict(layers, linear_models(), scenario(2, kdist::kfac::Strategy::dkfac));
  CHECK(d.phases.factor_comm == Approx(1.7));
  const Prediction s = predict(layers, linear_models(), scenario(2, kdist::kfac::Strategy::spd));
  CHECK(s.phases.factors == Approx(2.15));
  CHECK(s.phases.factor_comm == Approx(0.2));
  CHECK(s.phases.inverses == Approx(0.72));
  CHECK(s.phases.inverse_comm == Approx(0.384));
  CHECK(s.inverse_phase == Approx(1.254));
  CHECK(s.phases.total == Approx(kTb + 0.4 + kGrad + 0.2 + 1.254 + kPrecond));
}

TEST_CASE("scale model: forward and backward beside the pipelined all-reduce", "[scale_model]") {
  // Measured 0.5 slower per layer with the pipelined reduction in flight: only pipelined strategies
  // see it, in fwd_bwd and in the end of backward (T_b 7.75 + 2 for SPD-KFAC, packing 0 here).
  auto layers = two_layers();
  for (auto& l : layers) {
    l.forward_pipelined = l.forward + 0.25;
    l.backward_pipelined = l.backward + 0.25;
  }
  const Prediction d = predict(layers, linear_models(), scenario(2, kdist::kfac::Strategy::dkfac));
  CHECK(d.phases.fwd_bwd == Approx(6.0));
  const Prediction s = predict(layers, linear_models(), scenario(2, kdist::kfac::Strategy::spd));
  CHECK(s.phases.fwd_bwd == Approx(7.0));
  CHECK(s.phases.total == Approx(kTb + 1.0 + kGrad + 1.004 + kPrecond));
  // Ready times shift too: A1 after A0's hook, forward (1.25) and its own hook: 0.5 + 1.25 + 0.5.
  CHECK(factor_tensors(layers, 4, true)[1].ready == Approx(2.25));
}

TEST_CASE("scale model: one rank communicates nothing", "[scale_model]") {
  for (auto st : {kdist::kfac::Strategy::dkfac, kdist::kfac::Strategy::mpdkfac, kdist::kfac::Strategy::spd}) {
    const Prediction p = predict(two_layers(), linear_models(), scenario(1, st));
    CHECK(p.phases.grad_comm == 0.0);
    CHECK(p.phases.factor_comm == 0.0);
    CHECK(p.phases.inverse_comm == 0.0);
    CHECK(p.phases.inverses == Approx(1.26));
    CHECK(p.phases.total == Approx(kTb + 1.26 + 1.0));
  }
}

TEST_CASE("scale model: bad input is refused", "[scale_model]") {
  CHECK_THROWS_WITH(predict(two_layers(), linear_models(), scenario(0, kdist::kfac::Strategy::spd)),
                    Catch::Contains("ranks = 0"));
  CHECK_THROWS_WITH(predict({}, linear_models(), scenario(2, kdist::kfac::Strategy::spd)), Catch::Contains("empty"));
  auto layers = two_layers();
  layers[1].backward = -1;
  CHECK_THROWS_WITH(predict(layers, linear_models(), scenario(2, kdist::kfac::Strategy::spd)),
                    Catch::Contains("layer l1"));
}

TEST_CASE("platform file: listed, extrapolated, the exponential inverse, errors", "[scale_model]") {
  const std::string path = "test_scale_model_cluster.json";
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  const std::string good = R"({"name": "t",
    "allreduce": {"by_ranks": {"4": {"alpha": 1e-4, "beta": 1e-9}}},
    "broadcast": {"by_ranks": {"4": {"alpha": 2e-4, "beta": 2e-9}}},
    "inverse": {"alpha": 3.64e-3, "beta": 4.77e-4},
    "compute": {"flops": 1e12, "memory_bandwidth": 1e11, "efficiency": 0.5, "batch": 32}})";
  write(good);
  const Platform p = Platform::from_file(path);
  CHECK(p.batch() == 32);
  CHECK(p.rates().forward_backward == Approx(5e11));
  CHECK(p.rates().memory == Approx(5e10));
  CHECK_FALSE(p.extrapolated(4));
  CHECK(p.at(4).allreduce.time(1e6) == Approx(1e-4 + 1e-3));
  // P = 16 from P' = 4: alpha * 4/2, beta * (15/16) / (3/4).
  CHECK(p.extrapolated(16));
  CHECK(p.at(16).allreduce.time(1e6) == Approx(2e-4 + 1e-3 * (15.0 / 16) / 0.75));
  CHECK(p.at(16).placement.broadcast.time(0) == Approx(4e-4));
  for (int d : {64, 1000, 4608})
    CHECK(p.at(2).placement.inverse_time(d) == Approx(3.64e-3 * std::exp(4.77e-4 * d)).epsilon(0.01));
  write(R"({"name": "t", "allreduce": {"by_ranks": {}}})");
  CHECK_THROWS_WITH(Platform::from_file(path), Catch::Contains("allreduce.by_ranks"));
  std::string bad = good;
  bad.replace(bad.find("\"efficiency\": 0.5"), 17, "\"efficiency\": -1");
  write(bad);
  CHECK_THROWS_WITH(Platform::from_file(path), Catch::Contains("compute.efficiency"));
  std::remove(path.c_str());
  CHECK_THROWS_WITH(Platform::from_file(path), Catch::Contains("cannot be read"));
}

TEST_CASE("FLOP-based layer times and the rates fitted back from them", "[scale_model]") {
  const auto shapes = network_layers("resnet50", 4, 56);
  const ComputeRates r{2e10, 1e10, 3e10, 5e9};
  const auto times = network_times(shapes, 8, r);
  REQUIRE(times.size() == shapes.size());
  // conv1: 16 x 147 weights, output 28 x 28, batch 8: 2 * 8 * 784 * 16 * 147 FLOPs forward.
  CHECK(times[0].forward == Approx(2.0 * 8 * 784 * 16 * 147 / 2e10));
  CHECK(times[0].backward == Approx(times[0].forward));  // no input gradient for the first layer
  CHECK(times[1].backward == Approx(2 * times[1].forward));
  const ComputeRates back = fit_rates(shapes, 8, times);
  CHECK(back.forward_backward == Approx(r.forward_backward));
  CHECK(back.factors == Approx(r.factors));
  CHECK(back.precondition == Approx(r.precondition));
  CHECK(back.memory == Approx(r.memory));
}
