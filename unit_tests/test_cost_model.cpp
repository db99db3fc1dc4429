// Cost models (core/cost_model.hpp): the fit, the table, the typed key and the JSON store; their
// calibration through an Engine (comm/calibrate.hpp) and on an execution space
// (core/inverse_calibration.hpp).
#include <catch2/catch.hpp>
#include <kdist/comm/calibrate.hpp>
#include <kdist/core/atomic_file.hpp>
#include <kdist/core/cost_model.hpp>
#include <kdist/core/inverse_calibration.hpp>

#include "same_on_every_rank.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

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
kdist::comm::CalibrationOptions tiny_calibration(std::size_t max_bytes, int warmup, int repeats) {
  kdist::comm::CalibrationOptions o;
  o.min_bytes = 4;
  o.max_bytes = max_bytes;
  o.warmup = warmup;
  o.repeats = repeats;
  return o;
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

TEST_CASE("CostModel from one measurement gives it back, stays monotone and round-trips", "[core][cost]") {
  const CostModel m = CostModel::from_measurements({1000}, {1.0});
  CHECK(m.time(1000) == 1.0);  // was the unmeasured default, 20 us + 1000 B / 5 GB/s
  CHECK(m.time(2000) == Approx(2.0));
  for (double b = 1; b < 1e6; b *= 1.7) CHECK(m.time(b) <= m.time(b * 1.7));
  CHECK(CostModel::from_measurements({0}, {3e-6}).time(0) == 3e-6);
  const CostKey key{CostOp::spd_inverse, DType::float64, 1, "local"};
  CostModelStore store;
  store.set(key, m);
  const std::string path = "kdist_cost_model_one." + std::to_string(world_rank()) + ".json";
  store.save(path);
  CHECK(CostModelStore::load(path).get(key).time(1500) == Approx(m.time(1500)));
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
  const CostModel one = kdist::calibrate_inverse(64, 30.0, 1);  // default execution space
  REQUIRE(one.x().size() == 1);
  CHECK(one.time(one.x()[0]) == one.t()[0]);  // the measurement, not the unmeasured default
  REQUIRE_THROWS_AS(kdist::calibrate_inverse(32, 30.0), kdist::InvalidArgument);
}

TEST_CASE("calibrate_collective measures every size and agrees across ranks", "[comm][cost][mpi]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine engine(world);
  kdist::comm::CalibrationOptions o = tiny_calibration(64, 1, 2);
  for (CostOp op : {CostOp::allreduce, CostOp::broadcast}) {
    const CostModel m = kdist::comm::calibrate_collective(engine, op, DType::float64, o);
    REQUIRE(m.x() == std::vector<double>{8, 32});  // float64: from 8 bytes, x4 per step
    for (double t : m.t()) CHECK(t > 0);
    CHECK(kdist_test::same_on_every_rank(m.t()));  // the slowest rank's times, on every rank
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
  const kdist::comm::CalibrationOptions o = tiny_calibration(16, 2, 3);
  const long long samples = 2 * (o.warmup + o.repeats);  // float32: 4 and 16 bytes
  engine.reset_stats();
  kdist::comm::calibrate_collective(engine, CostOp::broadcast, DType::float32, o);
  CHECK(engine.stats().operations == 3 * samples);
  CHECK(engine.in_flight() == 0);
  // Four in flight per sample: four measured operations between the barrier and the max.
  kdist::comm::CalibrationOptions four = o;
  four.in_flight = 4;
  engine.reset_stats();
  const CostModel m = kdist::comm::calibrate_collective(engine, CostOp::allreduce, DType::float32, four);
  CHECK(engine.stats().operations == 6 * samples);
  CHECK(engine.in_flight() == 0);
  CHECK(m.x() == std::vector<double>{4, 16});
  four.in_flight = 0;
  REQUIRE_THROWS_WITH(kdist::comm::calibrate_collective(engine, CostOp::allreduce, DType::float32, four),
                      Catch::Contains("in_flight 0"));
}

// [leaks-comm]: the failed Engine may be destroyed with a collective still posted (README
// "Sanitizer run").
TEST_CASE("calibrate_collective: ranks that disagree on in_flight get an error on every rank",
          "[comm][cost][mpi][leaks-comm]") {
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  if (world.size() == 1) return;
  kdist::comm::Engine engine(world);
  kdist::comm::CalibrationOptions mixed = tiny_calibration(16, 2, 3);
  mixed.in_flight = world.rank() == 1 ? 2 : 1;  // different operations posted: a mismatch, no hang
  CHECK_THROWS_AS(kdist::comm::calibrate_collective(engine, CostOp::allreduce, DType::float32, mixed), kdist::Error);
}

namespace {
/// What CostModelStore::load says about `text` ("" if it loads), flagging foreign exceptions.
std::string load_error(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path);
    out << text;
  }
  try {
    CostModelStore::load(path);
  } catch (const kdist::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("NOT A kdist::Error: ") + e.what();
  }
  return "";
}
nlohmann::json good_entry() {
  return {{"op", "allreduce"}, {"dtype", "float32"},      {"ranks", 2},    {"comm", "world"},
          {"x", {4, 16, 64}},  {"t", {1e-5, 2e-5, 5e-5}}, {"alpha", 1e-5}, {"beta", 1e-9}};
}
/// A file whose entry 1 is good_entry() with `field` set to `value` (erased when value is null).
std::string with_entry_field(const std::string& field, const nlohmann::json& value) {
  nlohmann::json bad = good_entry();
  bad["op"] = "broadcast";
  if (value.is_null())
    bad.erase(field);
  else
    bad[field] = value;
  return nlohmann::json{{"version", 1}, {"entries", {good_entry(), bad}}}.dump();
}
}  // namespace

TEST_CASE("CostModelStore::load rejects wrong types with a kdist::Error naming file and field", "[core][cost]") {
  const std::string path = "kdist_cost_bad_types." + std::to_string(world_rank()) + ".json";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"version": "1", "entries": []})", {"'version'", "integer"}},
      {R"({"version": 1.5, "entries": []})", {"'version'", "integer"}},
      {R"({"version": 1, "entries": {}})", {"'entries'", "array"}},
      {R"({"version": 1})", {"'entries'", "missing"}},
      {R"([1, 2])", {"object"}},
      {R"({"version": 1, "entries": [5]})", {"entry 0", "object"}},
      {with_entry_field("op", 3), {"entry 1", "'op'", "string"}},
      {with_entry_field("op", "allgather"), {"entry 1", "'op'", "allgather"}},
      {with_entry_field("dtype", "float16"), {"entry 1 (broadcast)", "'dtype'", "float16"}},
      {with_entry_field("ranks", "2"), {"entry 1 (broadcast/float32", "'ranks'", "integer"}},
      {with_entry_field("ranks", 2.5), {"entry 1 (broadcast/float32", "'ranks'", "integer"}},
      {with_entry_field("comm", 7), {"entry 1 (broadcast/float32", "'comm'", "string"}},
      {with_entry_field("t", nullptr), {"entry 1 (broadcast/float32", "'t'", "missing"}},
      {with_entry_field("t", "fast"), {"entry 1 (broadcast/float32", "'t'", "array"}},
      {with_entry_field("x", {4, "16", 64}), {"entry 1 (broadcast/float32", "'x'[1]", "number"}},
      {with_entry_field("alpha", "1e-5"), {"entry 1 (broadcast/float32", "'alpha'", "number"}},
      {with_entry_field("beta", nullptr), {"entry 1 (broadcast/float32", "'beta'", "missing"}},
  };
  for (const auto& c : cases) {
    INFO(c.first);
    const std::string what = load_error(path, c.first);
    CHECK_THAT(what, Catch::StartsWith("kdist::CostModelStore::load: '" + path + "'"));
    for (const std::string& s : c.second) CHECK_THAT(what, Catch::Contains(s));
  }
  std::remove(path.c_str());
}

TEST_CASE("CostModelStore::load rejects values out of range, naming file, entry and field", "[core][cost]") {
  const std::string path = "kdist_cost_bad_values." + std::to_string(world_rank()) + ".json";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {with_entry_field("x", {4, -16, 64}), {"'x'[1]", "-16", "positive"}},
      {with_entry_field("x", {0, 16, 64}), {"'x'[0]", "positive"}},
      {with_entry_field("t", {1e-5, -2e-5, 5e-5}), {"'t'[1]", "positive"}},
      {with_entry_field("t", {1e-5, 0.0, 5e-5}), {"'t'[1]", "positive"}},
      {with_entry_field("alpha", -1e-5), {"'alpha'", "non-negative"}},
      {with_entry_field("beta", -1e-9), {"'beta'", "non-negative"}},
      {with_entry_field("ranks", 0), {"'ranks'", ">= 1"}},
      {with_entry_field("ranks", -3), {"'ranks'", ">= 1"}},
      {with_entry_field("t", {1e-5, 2e-5}), {"'x'", "'t'", "3", "2"}},
      {with_entry_field("x", {16, 16, 16}), {"sizes are all equal"}},  // a fit error, in context
  };
  for (const auto& c : cases) {
    INFO(c.first);
    const std::string what = load_error(path, c.first);
    CHECK_THAT(what, Catch::StartsWith("kdist::CostModelStore::load: '" + path + "' entry 1 (broadcast/float32"));
    for (const std::string& s : c.second) CHECK_THAT(what, Catch::Contains(s));
  }
  // Without a table (fewer than two points) alpha and beta are the model: still checked.
  nlohmann::json lone = good_entry();
  lone["x"] = nlohmann::json::array();
  lone["t"] = nlohmann::json::array();
  lone["beta"] = -1.0;
  CHECK_THAT(load_error(path, nlohmann::json{{"version", 1}, {"entries", {lone}}}.dump()),
             Catch::Contains("entry 0 (allreduce/float32/2/world)") && Catch::Contains("'beta'"));
  lone["beta"] = 1e-9;
  CHECK(load_error(path, nlohmann::json{{"version", 1}, {"entries", {lone}}}.dump()).empty());
  std::remove(path.c_str());
}

TEST_CASE("CostModelStore::load rejects a document with more after it, and a key given twice", "[core][cost]") {
  const std::string path = "kdist_cost_extra." + std::to_string(world_rank()) + ".json";
  const std::string good = nlohmann::json{{"version", 1}, {"entries", {good_entry()}}}.dump();
  CHECK(load_error(path, good + "\n").empty());
  CHECK_THAT(load_error(path, good + "{\"version\": 7}"), Catch::Contains("is not valid JSON"));
  CHECK_THAT(load_error(path, nlohmann::json{{"version", 1}, {"entries", {good_entry(), good_entry()}}}.dump()),
             Catch::Contains("entry 1 (allreduce/float32/2/world)") && Catch::Contains("repeats the key"));
  std::remove(path.c_str());
}

TEST_CASE("fit_alpha_beta: huge, non-finite and degenerate inputs get the right error", "[core][cost]") {
  // t = 1e308 used to underflow the normal equations into "sizes are all equal".
  const AlphaBeta flat = fit_alpha_beta({1, 2}, {1e308, 1e308});
  CHECK(flat.alpha == Approx(1e308));
  CHECK(flat.beta * 2 <= 1e-12 * flat.alpha);  // beta x is negligible over the range
  const AlphaBeta mixed = fit_alpha_beta({4, 16, 64}, {1e-5, 2e-5, 1e308});
  CHECK(std::isfinite(mixed.alpha));
  CHECK(std::isfinite(mixed.beta));
  const AlphaBeta tiny = fit_alpha_beta({1e-300, 2e-300}, {1e-300, 2e-300});  // t = x
  CHECK(tiny.alpha == Approx(0.0).margin(1e-310));
  CHECK(tiny.beta == Approx(1.0));
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  REQUIRE_THROWS_WITH(fit_alpha_beta({1, 2}, {1e-5, inf}), Catch::Contains("time 1") && Catch::Contains("finite"));
  REQUIRE_THROWS_WITH(fit_alpha_beta({1, nan}, {1e-5, 2e-5}), Catch::Contains("size 1") && Catch::Contains("finite"));
  REQUIRE_THROWS_WITH(fit_alpha_beta({1, -2}, {1e-5, 2e-5}), Catch::Contains("size 1"));
  REQUIRE_THROWS_WITH(fit_alpha_beta({1, 2}, {1e-5, -2e-5}), Catch::Contains("time 1") && Catch::Contains("positive"));
  REQUIRE_THROWS_WITH(fit_alpha_beta({3, 3, 3}, {1e-5, 2e-5, 3e-5}), Catch::Contains("sizes are all equal"));
  REQUIRE_THROWS_WITH(fit_alpha_beta({1, 2, 3}, {1e-5, 2e-5}), Catch::Contains("3 sizes and 2 times"));
}

TEST_CASE("fit_alpha_beta keeps alpha and beta non-negative", "[core][cost]") {
  // Times that fall with size would need beta < 0; times growing faster than linear, alpha < 0.
  const AlphaBeta falling = fit_alpha_beta({1, 2, 4}, {3e-5, 2e-5, 1e-5});
  CHECK(falling.beta == 0.0);
  CHECK(falling.alpha > 0.0);
  const AlphaBeta convex = fit_alpha_beta({1, 2, 4, 8}, {1e-6, 1e-5, 1e-4, 1e-3});
  CHECK(convex.alpha == 0.0);
  CHECK(convex.beta > 0.0);
}

TEST_CASE("CostModel::linear and from_measurements reject negative and non-finite values", "[core][cost]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  REQUIRE_THROWS_AS(CostModel::linear(-1e-6, 1e-9), kdist::InvalidArgument);
  REQUIRE_THROWS_AS(CostModel::linear(1e-6, -1e-9), kdist::InvalidArgument);
  REQUIRE_THROWS_WITH(CostModel::linear(nan, 1e-9), Catch::Contains("alpha"));
  REQUIRE_THROWS_WITH(CostModel::linear(1e-6, inf), Catch::Contains("beta"));
  REQUIRE_THROWS_WITH(CostModel::from_measurements({-1, 2}, {1e-6, 2e-6}), Catch::Contains("size 0"));
  REQUIRE_THROWS_WITH(CostModel::from_measurements({1, 2}, {1e-6, nan}), Catch::Contains("time 1"));
  REQUIRE_THROWS_WITH(CostModel::from_measurements({1}, {-1e-6}), Catch::Contains("time 0"));
  REQUIRE_THROWS_WITH(CostModel::from_measurements({}, {}), Catch::Contains("no measurements"));
  CHECK(CostModel::linear(0.0, 0.0).time(1e9) == 0.0);
}

TEST_CASE("CostModelStore::save to an unwritable place names the path and leaves the old file", "[core][cost]") {
  CostModelStore store;
  store.set({CostOp::allreduce, DType::float32, 1, "world"}, CostModel::linear(1e-5, 1e-9));
  REQUIRE_THROWS_WITH(store.save("/nonexistent-kdist-dir/c.json"),
                      Catch::StartsWith("kdist::CostModelStore::save: cannot write '/nonexistent-kdist-dir/c.json'"));
  // The destination is a directory: the temporary is written, the rename fails and it is removed.
  const std::string dir = "kdist_cost_save_dir." + std::to_string(world_rank());
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  REQUIRE(::mkdir((dir + "/x").c_str(), 0755) == 0);
  REQUIRE_THROWS_WITH(store.save(dir), Catch::Contains("cannot replace '" + dir + "'"));
  CHECK(::access(kdist::impl::atomic_temporary_path(dir).c_str(), F_OK) != 0);
  ::rmdir((dir + "/x").c_str());
  ::rmdir(dir.c_str());
}
