// kfac::Preconditioner against a dense double reference written here with naive loops: the
// global batch is split over the ranks, so every rank count must give the same preconditioned
// gradients; every strategy, placement and fusion planner too. Also the Kronecker-factored
// Fisher block at vanishing damping. The state file and bad input: test_kfac_state.cpp.
#include <mpi.h>
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <kdist/kfac/preconditioner.hpp>
#include <vector>

#include "kfac_network.hpp"

using namespace kfac_test;

TEST_CASE("kfac: preconditioned gradients equal the dense double reference for every strategy", "[kfac]") {
  const auto layers = network();
  const int steps = 4;
  struct Variant {
    const char* name;
    Options options;
    Hooks hooks = Hooks::views;
  };
  std::vector<Variant> variants;
  for (Strategy s : {Strategy::spd, Strategy::mpdkfac, Strategy::dkfac}) {
    Options o = base_options();
    o.strategy = s;
    variants.push_back({to_string(s), o});
  }
  for (comm::Planner p : {comm::Planner::none, comm::Planner::threshold, comm::Planner::mgwfbp}) {
    Options o = base_options();
    o.planner = p;
    o.threshold_bytes = 200;
    variants.push_back({comm::to_string(p), o});
  }
  {
    // The default splits each layer's preconditioning into blocks of its outputs or of its inputs
    // (both at 2-4 ranks, with short last blocks: the next test case); this computes all of it on
    // every rank.
    Options o = base_options();
    o.split_preconditioning = false;
    variants.push_back({"preconditioning on every rank", o});
  }
  {
    Options o = base_options();
    o.placement = PlacementKind::channel;
    variants.push_back({"channel placement", o});
  }
  // The default keeps the factors applied whole as Cholesky factors (the next test cases); these
  // invert every factor, split and not split.
  for (const bool split : {true, false}) {
    Options o = base_options();
    o.cholesky_solves = CholeskySolves::never;
    o.split_preconditioning = split;
    variants.push_back({split ? "every factor inverted" : "every factor inverted, preconditioning on every rank", o});
  }
  // Inverses costed high: every factor CT at P > 1 (the default models make them all NCT here).
  for (PlacementKind kind : {PlacementKind::lbp, PlacementKind::channel, PlacementKind::optimal}) {
    Options o = base_options();
    o.placement = kind;
    o.cost_models = expensive_inverse_models();
    o.inverse_every = 2;
    variants.push_back({kind == PlacementKind::lbp       ? "CT, lbp"
                        : kind == PlacementKind::channel ? "CT, channel"
                                                         : "CT, optimal",
                        o});
  }
  {
    Options o = base_options();
    o.placement = PlacementKind::optimal;
    o.inverse_method = InverseMethod::eigen;
    o.kl_clip = 1e-3;
    o.factor_every = 2;
    o.inverse_every = 3;
    variants.push_back({"optimal placement, eigen, clipped, k1 = 2, k2 = 3", o});
  }
  // The baselines skip factor steps too: their factors travel on another schedule than spd's.
  for (Strategy s : {Strategy::mpdkfac, Strategy::dkfac}) {
    Options o = base_options();
    o.strategy = s;
    o.factor_every = 2;
    o.inverse_every = 3;
    variants.push_back({s == Strategy::mpdkfac ? "mpdkfac, k1 = 2, k2 = 3" : "dkfac, k1 = 2, k2 = 3", o});
  }
  // kfac-jax's lazy sync: the factors all-reduced on inverse steps only. With k1 = 2 the inverse
  // step 3 makes no factor: it all-reduces the running ones, rank-local since step 2.
  for (const auto& [s, k1] : {std::pair{Strategy::spd, 1}, {Strategy::spd, 2}, {Strategy::mpdkfac, 2}}) {
    Options o = base_options();
    o.strategy = s;
    o.factor_every = k1;
    o.inverse_every = 3;
    o.factor_sync = FactorSync::before_inverses;
    variants.push_back({s == Strategy::spd ? (k1 == 1 ? "spd, factors synced before inverses, k2 = 3"
                                                      : "spd, factors synced before inverses, k1 = 2, k2 = 3")
                                           : "mpdkfac, factors synced before inverses, k1 = 2, k2 = 3",
                        o});
  }
  variants.push_back({"Conv2d hooked with im2col patches and their ones column", base_options(), Hooks::patches});
  variants.push_back({"Dense hooked with LayoutLeft views", base_options(), Hooks::layout_left});
  for (const auto& v : variants) {
    INFO(v.name << " on " << world_size() << " ranks");
    comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
    Preconditioner<double, TestMem> kfac(kfac_engine, layers, v.options);
    const auto& owner = kfac.placement().owner;
    if (!v.options.cost_models.empty() && world_size() > 1) CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
    const auto got = train(kfac, layers, 0, steps, 0, v.hooks);
    std::vector<std::vector<double>> want_factors;
    const auto want = reference(layers, v.options, steps, &want_factors);
    for (int s = 0; s < steps; ++s) {
      INFO("step " << s);
      CHECK(max_relative(got[s], want[s]) < 1e-6);
    }
    // factor(f) is the running factor in full: kdist keeps only its upper triangle.
    for (int f = 0; f < kfac.factors(); ++f) {
      const auto F = kdist_test::to_host(kfac.factor(f));
      std::vector<double> got_factor;
      for (std::size_t i = 0; i < F.extent(0); ++i)
        for (std::size_t j = 0; j < F.extent(1); ++j) got_factor.push_back(F(i, j));
      INFO("factor " << f);
      CHECK(max_relative(got_factor, want_factors[static_cast<std::size_t>(f)]) < 1e-12);
    }
    CHECK(kfac.stats().steps == steps);
  }
}

TEST_CASE("kfac: factors synced before inverse steps only are rank-local in between, and saved in sync", "[kfac]") {
  const auto layers = network();
  Options o = base_options();
  o.inverse_every = 3;
  o.factor_sync = FactorSync::before_inverses;
  comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(engine, layers, o);
  CHECK_THAT(kfac.describe(), Catch::Contains("factors all-reduced before inverse steps only"));
  const int steps = 5;  // synced at steps 0 and 3; step 4's factors are each rank's own
  const auto got = train(kfac, layers, 0, steps);
  std::vector<std::vector<double>> want_factors;
  const auto want = reference(layers, o, steps, &want_factors);
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s);
    CHECK(max_relative(got[s], want[s]) < 1e-6);
  }
  CHECK(kfac.stats().factor_syncs == 2);
  REQUIRE(kfac.factors_local());
  const auto factors_off = [&] {
    double worst = 0;
    for (int f = 0; f < kfac.factors(); ++f) {
      const auto F = kdist_test::to_host(kfac.factor(f));
      std::vector<double> flat(F.data(), F.data() + F.size());  // symmetric: either order
      worst = std::max(worst, max_relative(flat, want_factors[static_cast<std::size_t>(f)]));
    }
    return worst;
  };
  if (world_size() > 1) CHECK(factors_off() > 1e-6);  // each rank's batches differ
  StateWriter out(Preconditioner<double, TestMem>::kStateKind);
  CHECK_THROWS_WITH(kfac.save_to(out), Catch::Contains("rank-local at step 5") && Catch::Contains("sync_factors()") &&
                                           Catch::Contains("rank " + std::to_string(world_rank())));
  kfac.sync_factors(TestExec());
  CHECK_FALSE(kfac.factors_local());
  CHECK(kfac.stats().factor_syncs == 3);
  CHECK(factors_off() < 1e-12);
  kfac.sync_factors(TestExec());  // in sync already: no all-reduce
  CHECK(kfac.stats().factor_syncs == 3);
  CHECK_NOTHROW(kfac.save_to(out));
  // save() syncs first: a run resumed from its file starts from the global factors.
  train(kfac, layers, steps, 1);
  REQUIRE(kfac.factors_local());
  const std::string path = "test_kfac_lazy_sync.bin";
  kfac.save(path);
  CHECK_FALSE(kfac.factors_local());
  comm::Engine resumed_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> resumed(resumed_engine, layers, o);
  resumed.load(path);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(path.c_str());
  for (int f = 0; f < kfac.factors(); ++f) {
    INFO("factor " << f);
    const auto a = kdist_test::to_host(kfac.factor(f)), b = kdist_test::to_host(resumed.factor(f));
    CHECK(std::equal(a.data(), a.data() + a.size(), b.data()));
  }
  // Every factor step syncs by default.
  Options every = o;
  every.factor_sync = FactorSync::every_step;
  comm::Engine every_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> each(every_engine, layers, every);
  train(each, layers, 0, steps);
  CHECK(each.stats().factor_syncs == steps);
  CHECK_FALSE(each.factors_local());
}

TEST_CASE("kfac: split preconditioning takes the axis whose busiest rank does less", "[kfac]") {
  using kdist::kfac::precondition_split;
  using kdist::kfac::SplitAxis;
  const auto is = [](kdist::kfac::PreconditionSplit s, SplitAxis axis, int block) {
    return s.axis == axis && s.block == block;
  };
  CHECK(is(precondition_split(785, 256, 2), SplitAxis::outputs, 128));  // the MLP's first layer
  CHECK(is(precondition_split(129, 10, 16), SplitAxis::inputs, 9));     // 9 * 10 < 1 * 129
  CHECK(is(precondition_split(129, 10, 2), SplitAxis::outputs, 5));     // 5 * 129 < 65 * 10
  CHECK(is(precondition_split(13, 3, 2), SplitAxis::inputs, 7));        // blocks 7 and 6
  CHECK(is(precondition_split(8, 4, 2), SplitAxis::outputs, 2));        // a tie keeps the outputs
  CHECK(is(precondition_split(4, 2, 3), SplitAxis::outputs, 1));        // rank 2 has no block
  CHECK(is(precondition_split(5, 7, 1), SplitAxis::outputs, 7));
  // A one-output layer splits over its inputs at every rank count: blocks of 3 and 2 rows at 2
  // ranks, 2, 2, 1 at 3, and 2, 2, 1 and none at 4; Dense(7, 4) over outputs at 2 and 4 ranks,
  // over inputs at 3.
  const std::vector<Layer> narrow = {Dense(7, 4, true), Dense(4, 1, true)};
  {
    comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
    Preconditioner<double, TestMem> kfac(kfac_engine, narrow, base_options());
    const auto got = train(kfac, narrow, 0, 3);
    const auto want = reference(narrow, base_options(), 3);
    for (int s = 0; s < 3; ++s) CHECK(max_relative(got[s], want[s]) < 1e-6);
  }
  // The test network at 2 ranks: the convolution (a 13, g 3) over inputs, Dense(7, 4) (a 8, g 4)
  // over outputs, Dense(4, 3) (a 4, g 3) over inputs in blocks of 2; the dense reference above
  // checks the numbers at every rank count.
  if (world_size() != 2) return;
  comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(kfac_engine, network(), base_options());
  CHECK_THAT(kfac.describe(), Catch::Contains("blocks of 7 inputs") && Catch::Contains("blocks of 2 outputs"));
}

// Which factors are kept as R (cholesky_solves always, as base_options sets): at 1 rank (nothing
// split) all; at 2-4 ranks A where a layer is split over outputs and G where it is split over
// inputs (the splits: the test case above); none with never or with the eigen method. The CT variant's placement models
// those factors' work as potrf's.
TEST_CASE("kfac: the factors applied whole are kept as Cholesky factors", "[kfac]") {
  const auto forms = [](const Options& o) {
    comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
    Preconditioner<double, TestMem> kfac(kfac_engine, network(), o);
    std::vector<int> held;
    for (int f = 0; f < kfac.factors(); ++f) held.push_back(kfac.holds_cholesky(f) ? 1 : 0);
    return held;
  };
  // Factors in reduction order: A0 (the convolution), A1, A2, G2, G1, G0.
  const std::vector<int> every = {1, 1, 1, 1, 1, 1}, none = {0, 0, 0, 0, 0, 0};
  const std::vector<std::vector<int>> by_ranks = {every, {0, 1, 0, 1, 0, 1}, {1, 0, 1, 0, 1, 0}, {0, 1, 0, 1, 0, 1}};
  const int P = world_size();
  if (P <= 4) CHECK(forms(base_options()) == by_ranks[static_cast<std::size_t>(P - 1)]);
  Options whole = base_options(), off = base_options(), eigen = base_options();
  whole.split_preconditioning = false;
  off.cholesky_solves = CholeskySolves::never;
  eigen.inverse_method = InverseMethod::eigen;
  CHECK(forms(whole) == every);
  CHECK(forms(off) == none);
  CHECK(forms(eigen) == none);
}

// measured keeps R where the timed solves beat the inverse over an inverse period:
// among always's factors, alike on every rank (the slowest rank's times), and the updates are
// still the reference's whichever form each factor takes.
TEST_CASE("kfac: measured Cholesky solves decide alike on every rank, among the factors applied whole", "[kfac]") {
  const auto layers = network();
  Options measured = base_options();
  measured.cholesky_solves = CholeskySolves::measured;
  comm::Engine always_engine{comm::Communicator(MPI_COMM_WORLD)}, kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> always(always_engine, layers, base_options());
  Preconditioner<double, TestMem> kfac(kfac_engine, layers, measured);
  std::vector<int> held, lowest, highest;
  for (int f = 0; f < kfac.factors(); ++f) {
    held.push_back(kfac.holds_cholesky(f) ? 1 : 0);
    if (kfac.holds_cholesky(f)) CHECK(always.holds_cholesky(f));
  }
  lowest = highest = held;
  MPI_Allreduce(MPI_IN_PLACE, lowest.data(), static_cast<int>(held.size()), MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, highest.data(), static_cast<int>(held.size()), MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lowest == highest);
  CHECK_THAT(kfac.describe(), Catch::Contains("Cholesky solves measured"));
  const auto got = train(kfac, layers, 0, 3);
  const auto want = reference(layers, measured, 3);
  for (int s = 0; s < 3; ++s) {
    INFO("step " << s << ", rank " << world_rank() << " of " << world_size());
    CHECK(max_relative(got[s], want[s]) < 1e-6);
  }
}

// measured's all-reduce of the times is labelled with inverse_every and every case it timed: ranks
// that disagree on either (the last rank's middle layer one output wider, or its inverses every 2
// steps) are refused at construction on every rank, never given a choice from mixed times.
TEST_CASE("kfac: measured Cholesky solves refuse ranks that disagree on the layers or the period, on every rank",
          "[kfac]") {
  if (world_size() < 2) return;
  const bool odd = world_rank() == world_size() - 1;
  for (const bool wider : {true, false}) {
    INFO((wider ? "a wider layer" : "another inverse period") << " on rank " << world_size() - 1);
    auto layers = network();
    Options o = base_options();
    o.cholesky_solves = CholeskySolves::measured;
    if (odd && wider) layers[1] = Dense(7, 5, true);
    if (odd && !wider) o.inverse_every = 2;
    comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
    const std::string m = message_of([&] { Preconditioner<double, TestMem> kfac(engine, layers, o); });
    CHECK_THAT(m, Catch::Contains("disagree") && Catch::Contains("kfac cholesky solve costs"));
  }
}

// The rule itself: keep R when inverse_every applications' extra solve time stays under potri's;
// a case is timed at d <= 512, k <= 256 and scaled by d^3 (potri) and d^2 k (the products).
TEST_CASE("kfac: the Cholesky-solve rule weighs potri against the solves' extra time", "[kfac]") {
  using kdist::kfac::impl::keeps_cholesky_at;
  using kdist::kfac::impl::measured_case;
  using kdist::kfac::impl::scaled;
  using kdist::kfac::impl::SolveCase;
  using kdist::kfac::impl::SolveTimes;
  const SolveTimes t{6.0, 1.0, 2.0};  // potri, product, solves
  CHECK(keeps_cholesky_at(t, 5));     // 5 * 1 < 6
  CHECK_FALSE(keeps_cholesky_at(t, 6));
  CHECK(keeps_cholesky_at({6.0, 1.0, 0.9}, 1000));  // solves faster than the product: always
  const SolveCase big{1024, 512, false}, m = measured_case(big);
  CHECK((m.d == 512 && m.k == 256 && !m.left));
  const SolveTimes s = scaled(t, m, big);
  CHECK(s.potri == Approx(48.0));
  CHECK(s.product == Approx(8.0));
  CHECK(s.solves == Approx(16.0));
  const SolveCase small{100, 7, true};
  CHECK((measured_case(small).d == 100 && measured_case(small).k == 7));
}

TEST_CASE("kfac: per-rank gradients (Adasum) are each preconditioned whole, with their own KL clip", "[kfac]") {
  // Each rank hands step() its own gradient; the factors are still the global batch's. Every
  // rank's result must be the dense reference for its own gradient: a split would all-gather
  // blocks computed from the other ranks' gradients.
  const auto layers = network();
  Options o = base_options();
  o.gradients = Gradients::per_rank;
  o.kl_clip = 1e-2;
  o.lr = 1.0;
  comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(kfac_engine, layers, o);
  const int salt = world_rank() + 1;
  const auto got = train(kfac, layers, 0, 3, salt);
  const auto want = reference(layers, o, 3, nullptr, salt);
  for (int s = 0; s < 3; ++s) {
    INFO("step " << s << ", rank " << world_rank() << " of " << world_size());
    CHECK(max_relative(got[s], want[s]) < 1e-6);
  }
  CHECK(kfac.last_clip() < 1.0);  // the clip is taken, on this rank's own V
  CHECK_THAT(kfac.describe(), Catch::Contains("on every rank, of its own gradient"));
}

TEST_CASE("kfac: float follows the double reference", "[kfac]") {
  const auto layers = network();
  const Options o = base_options();
  comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<float, TestMem> kfac(kfac_engine, layers, o);
  const auto got = train(kfac, layers, 0, 2);
  const auto want = reference(layers, o, 2);
  for (int s = 0; s < 2; ++s) CHECK(max_relative(got[s], want[s]) < 1e-3);
}

TEST_CASE("kfac: at vanishing damping the update is the Kronecker-factored Fisher block's inverse applied", "[kfac]") {
  const std::vector<Layer> layers = {Dense(3, 2, true)};
  Options o = base_options();
  o.damping = 1e-10;
  o.factor_decay = 0;
  comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(kfac_engine, layers, o);
  const auto got = train(kfac, layers, 0, 1)[0];
  // F = A (x) G acting on vec(X) column-major: solve F vec(V) = vec(X) densely.
  const Mat A = reference_a(layers[0], 0, 0), G = reference_g(layers[0], 0, 0);
  const int a = layers[0].a_dim(), g = layers[0].g_dim();
  Mat F = zeros(a * g, a * g);
  for (int i = 0; i < a; ++i)
    for (int j = 0; j < a; ++j)
      for (int k = 0; k < g; ++k)
        for (int m = 0; m < g; ++m) F[i * g + k][j * g + m] = A[i][j] * G[k][m];
  const Mat Finv = inverse(F);
  std::vector<double> x(static_cast<std::size_t>(a * g));
  for (int c = 0; c < a; ++c)
    for (int r = 0; r < g; ++r) x[c * g + r] = c < 3 ? grad_value(0, 0, r, c) : grad_value(0, 0, r, 99);
  std::vector<double> want;  // back in [dW | db] order: weight rows, then the bias
  for (int r = 0; r < g; ++r)
    for (int c = 0; c < 3; ++c) {
      double v = 0;
      for (int k = 0; k < a * g; ++k) v += Finv[c * g + r][k] * x[k];
      want.push_back(v);
    }
  for (int r = 0; r < g; ++r) {
    double v = 0;
    for (int k = 0; k < a * g; ++k) v += Finv[3 * g + r][k] * x[k];
    want.push_back(v);
  }
  CHECK(max_relative(got, want) < 1e-6);
}
