// Cost models (core/cost_model.hpp): the fit, the table, the typed key and the JSON store; their
// calibration through an Engine (comm/calibrate.hpp) and on an execution space
// (core/inverse_calibration.hpp).
#include <catch2/catch.hpp>
#include <kdist/comm/calibrate.hpp>
#include <kdist/core/cost_model.hpp>
#include <kdist/core/inverse_calibration.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

using kdist::AlphaBeta;
using kdist::CostKey;
using kdist::CostModel;
using kdist::CostModelStore;
using kdist::CostOp;
using kdist::DType;
using kdist::fit_alpha_beta;

namespace {
int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
}  // namespace

TEST_CASE("fit_alpha_beta recovers alpha and beta within 5 %", "[core][cost]") {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(0.0, 0.02);
  const double alpha = 25e-6, beta = 1.0 / 3e9;
  std::vector<double> x, t;
  for (double b = 4; b <= 64.0 * (1 << 20); b *= 2) {
    x.push_back(b);
    t.push_back((alpha + beta * b) * (1.0 + noise(rng)));
  }
  const AlphaBeta ab = fit_alpha_beta(x, t);
  CHECK(std::abs(ab.alpha / alpha - 1) < 0.05);
  CHECK(std::abs(ab.beta / beta - 1) < 0.05);
  REQUIRE_THROWS_AS(fit_alpha_beta({1.0}, {1.0}), kdist::InvalidArgument);
}

TEST_CASE("CostModel table is monotone, interpolates, and round-trips through JSON", "[core][cost]") {
  const CostModel m = CostModel::from_measurements({1000, 10, 100}, {3e-6, 2e-6, 1e-6});  // dip at 100
  CHECK(m.x() == std::vector<double>{10, 100, 1000});
  CHECK(m.t() == std::vector<double>{2e-6, 2e-6, 3e-6});
  CHECK(m.time(100) == 2e-6);
  CHECK(m.time(500) > 2e-6);
  CHECK(m.time(500) < 3e-6);
  CHECK(m.time(1e9) >= 3e-6);
  for (double b = 1; b < 1e6; b *= 1.7) CHECK(m.time(b) <= m.time(b * 1.7));
  const CostKey key{CostOp::allreduce, DType::float32, 2, "world"};
  CostModelStore store;
  store.set(key, m);
  // One file per rank: ranks run this test concurrently.
  const std::string path = "kdist_cost_model_test." + std::to_string(world_rank()) + ".json";
  store.save(path);
  const CostModelStore back = CostModelStore::load(path);
  CHECK(back.has(key));
  CHECK(back.get(key).time(500) == Approx(m.time(500)));
  CHECK(back.get({CostOp::spd_inverse, DType::float64, 1, "local"}).time(1e9) == Approx(0.1));  // stated default
  REQUIRE_THROWS_WITH(CostModelStore::load("/no/such/file.json"), Catch::Contains("/no/such/file.json"));
  std::remove(path.c_str());
}

TEST_CASE("CostOp and CostKey spell the file format's strings", "[core][cost]") {
  for (CostOp op : {CostOp::allreduce, CostOp::broadcast, CostOp::adasum, CostOp::spd_inverse}) {
    CostOp back = CostOp::allreduce;
    REQUIRE(kdist::parse_cost_op(kdist::to_string(op), &back));
    CHECK(back == op);
  }
  CostOp unused;
  CHECK_FALSE(kdist::parse_cost_op("all_reduce", &unused));
  CHECK(kdist::to_string(CostOp::spd_inverse) == std::string("spd_inverse"));
  CHECK(CostKey{CostOp::broadcast, DType::float64, 4, "node"}.str() == "broadcast/float64/4/node");
}

TEST_CASE("calibrate_inverse times spd_inverse on an execution space", "[core][cost]") {
  const CostModel m = kdist::calibrate_inverse(Kokkos::DefaultHostExecutionSpace(), 128, 30.0, 1);
  REQUIRE(m.x() == std::vector<double>{64.0 * 64 * 64, 128.0 * 128 * 128});
  CHECK(m.t()[0] > 0);
  CHECK(m.t()[1] >= m.t()[0]);
  CHECK(kdist::calibrate_inverse(64, 30.0, 1).x().size() == 1);  // default execution space
  REQUIRE_THROWS_AS(kdist::calibrate_inverse(32, 30.0), kdist::InvalidArgument);
}

TEST_CASE("calibrate_collective measures every size and agrees across ranks", "[comm][cost][mpi]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine engine(world);
  kdist::comm::CalibrationOptions o;
  o.min_bytes = 4;
  o.max_bytes = 64;
  o.warmup = 1;
  o.repeats = 2;
  for (CostOp op : {CostOp::allreduce, CostOp::broadcast}) {
    const CostModel m = kdist::comm::calibrate_collective(engine, op, DType::float64, o);
    REQUIRE(m.x() == std::vector<double>{8, 32});  // float64: from 8 bytes, x4 per step
    for (double t : m.t()) CHECK(t > 0);
  }
  REQUIRE_THROWS_AS(kdist::comm::calibrate_collective(engine, CostOp::adasum, DType::float32, o),
                    kdist::InvalidArgument);
  o.repeats = 0;
  REQUIRE_THROWS_WITH(kdist::comm::calibrate_collective(engine, CostOp::allreduce, DType::float32, o),
                      Catch::Contains("repeats 0"));
}

TEST_CASE("calibrate_collective runs every collective through the engine", "[comm][cost][mpi]") {
  // Per sample: a 1-element all-reduce as the barrier, the measured operation, and a 1-element
  // max all-reduce of the elapsed time. Nothing may bypass the engine on its communicator.
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine engine(world);
  kdist::comm::CalibrationOptions o;
  o.min_bytes = 4;
  o.max_bytes = 16;
  o.warmup = 2;
  o.repeats = 3;
  const long long samples = 2 * (o.warmup + o.repeats);  // float32: 4 and 16 bytes
  engine.reset_stats();
  kdist::comm::calibrate_collective(engine, CostOp::broadcast, DType::float32, o);
  CHECK(engine.stats().operations == 3 * samples);
  CHECK(engine.in_flight() == 0);
}
