// Options::low_rank_dense: a Dense layer preconditioned from its batch, sum over ranks of
// (A^-1 [x 1]ᵀ)(G^-1 dyᵀ)ᵀ, against the dense double reference of the full product (kfac_network.hpp)
// at every rank count; the ranks' and the rows' mean both recognised on uneven shares, per-rank
// gradients, and a gradient that is not the batch's refused on every rank.
#include <mpi.h>
#include <catch2/catch.hpp>
#include <kdist/kfac/impl/low_rank.hpp>
#include <kdist/kfac/preconditioner.hpp>
#include <vector>

#include "kfac_network.hpp"

using namespace kfac_test;

namespace {

// Dense(40, 24) goes low rank at every rank count (12 global rows: 41 x 24 against at most 12 rows);
// Dense(24, 3) never (its full product is cheaper); the Conv2d is never a candidate.
std::vector<Layer> low_rank_network() {
  return {Conv2d(2, 3, 3, 2, 2, 1, true), Dense(40, 24, true), Dense(24, 3, false)};
}

Options low_rank_options() {
  Options o = base_options();
  o.low_rank_dense = true;
  return o;
}

std::vector<std::vector<double>> run(const Options& o, int steps, const GradientValue& value,
                                     long long* low_rank = nullptr) {
  const auto layers = low_rank_network();
  comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(engine, layers, o);
  const auto got = train(kfac, layers, 0, steps, value);
  if (low_rank) *low_rank = kfac.stats().low_rank_products;
  return got;
}

}  // namespace

TEST_CASE("kfac low rank: which layers it pays for", "[kfac]") {
  using kdist::kfac::impl::low_rank_cheaper;
  CHECK(low_rank_cheaper(785, 256, 64, 2));        // the MLP's first layer at 64 rows a rank
  CHECK_FALSE(low_rank_cheaper(257, 128, 64, 2));  // its second
  CHECK_FALSE(low_rank_cheaper(1569, 128, 64, 2));
  CHECK(low_rank_cheaper(1569, 128, 64, 1));  // unsplit (per-rank gradients)
}

TEST_CASE("kfac low rank: preconditioned gradients equal the dense double reference", "[kfac]") {
  struct Variant {
    const char* name;
    Options options;
  };
  std::vector<Variant> variants{{"factors kept as R where they may be", low_rank_options()}};
  Options o = low_rank_options();
  o.cholesky_solves = CholeskySolves::never;
  variants.push_back({"every factor inverted", o});
  o = low_rank_options();
  o.split_preconditioning = false;
  variants.push_back({"preconditioning on every rank", o});
  o = low_rank_options();
  o.factor_every = 2;
  o.inverse_every = 3;
  o.kl_clip = 1e-3;
  variants.push_back({"k1 = 2, k2 = 3, KL clip", o});
  o.factor_sync = FactorSync::before_inverses;
  o.factor_every = 1;
  variants.push_back({"factors synced before inverses, k2 = 3, KL clip", o});
  const int steps = 4;
  for (const auto& v : variants) {
    INFO(v.name << " on " << world_size() << " ranks");
    long long low_rank = 0;
    const auto got = run(v.options, steps, batch_gradients(), &low_rank);
    const auto want = reference(low_rank_network(), v.options, steps, nullptr, batch_gradients());
    for (int s = 0; s < steps; ++s) {
      INFO("step " << s);
      CHECK(max_relative(got[s], want[s]) < 1e-9);
    }
    CHECK(low_rank == steps);  // Dense(40, 24) alone, on every step
  }
}

TEST_CASE("kfac low rank: uneven shares, the rows' mean and the ranks' mean alike", "[kfac]") {
  UnevenShares uneven;
  Options full = base_options();
  for (const auto& [name, value] :
       {std::make_pair("rows' mean", batch_gradients()), std::make_pair("ranks' mean", ranks_mean_gradients())}) {
    INFO(name << " on " << world_size() << " ranks");
    long long low_rank = 0;
    const auto got = run(low_rank_options(), 3, value, &low_rank);
    const auto want = run(full, 3, value);
    for (std::size_t s = 0; s < got.size(); ++s) CHECK(max_relative(got[s], want[s]) < 1e-9);
    CHECK(low_rank == 3);
  }
}

TEST_CASE("kfac low rank: per-rank gradients, each rank its own", "[kfac]") {
  UnevenShares uneven;
  Options o = low_rank_options();
  o.gradients = Gradients::per_rank;
  Options full = o;
  full.low_rank_dense = false;
  long long low_rank = 0;
  const auto got = run(o, 3, own_gradients(), &low_rank);
  const auto want = run(full, 3, own_gradients());
  for (std::size_t s = 0; s < got.size(); ++s) CHECK(max_relative(got[s], want[s]) < 1e-9);
  CHECK(low_rank >= 3);  // and Dense(24, 3) too on a rank with 2 rows (4 ranks), each its own choice
}

TEST_CASE("kfac low rank: a gradient that is not the batch's is refused on every rank", "[kfac]") {
  const auto layers = low_rank_network();
  comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(engine, layers, low_rank_options());
  CHECK_THAT(kfac.describe(), Catch::Contains("Dense layers from their batch (low rank) where cheaper"));
  train(kfac, layers, 0, 1, batch_gradients());
  // Weight decay 1e-4 folded into the gradient: lost by the low-rank form, so refused.
  const GradientValue decayed = [](const Layer& L, int step, int l, int i, int j) {
    return batch_gradients()(L, step, l, i, j) + 1e-4 * value(0, l, 5, i * 97 + j);
  };
  run_hooks(kfac, layers, 1);
  auto g = gradients<double>(layers, 1, decayed);
  const auto before = kdist_test::to_host(g[1].weight);
  CHECK_THROWS_WITH(kfac.step(TestExec(), g),
                    Catch::Contains("low_rank_dense") && Catch::Contains("layer 1 Dense(40, 24, bias)") &&
                        Catch::Contains("Weight decay") && Catch::Contains("rank " + std::to_string(world_rank())));
  const auto after = kdist_test::to_host(g[1].weight);  // nothing written back
  CHECK(std::equal(before.data(), before.data() + before.size(), after.data()));
}

TEST_CASE("kfac low rank: one rank's gradient not the batch's fails every rank, no hang", "[kfac]") {
  if (world_size() == 1) return;
  // Averaged gradients that differ between ranks break step()'s contract: rank 0 alone finds its
  // gradient is not the batch's and raises; the others learn it at the all-reduce of the terms.
  const auto layers = low_rank_network();
  comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(engine, layers, low_rank_options());
  const GradientValue mine = [](const Layer& L, int step, int l, int i, int j) {
    return batch_gradients()(L, step, l, i, j) + (world_rank() == 0 ? 1e-4 : 0.0);
  };
  CHECK_THROWS_AS(train(kfac, layers, 0, 2, mine), Error);
}

TEST_CASE("kfac low rank: the hooks check what they keep on steps that make no factor", "[kfac]") {
  const auto layers = low_rank_network();
  Options o = low_rank_options();
  o.factor_every = 2;
  comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(engine, layers, o);
  train(kfac, layers, 0, 1, batch_gradients());
  MPI_Barrier(MPI_COMM_WORLD);  // every rank past step 0's collectives before one fails
  TestExec exec;
  kfac.on_forward(exec, 0, conv_input<double>(layers[0], 1, 0));
  const auto wide = kdist_test::device_matrix<double, Kokkos::LayoutRight>("x", 3, 41, [](int, int) { return 1.0; });
  // Every rank passes the same view; one may learn of another's failure first (RemoteError, its message).
  CHECK_THROWS_WITH(kfac.on_forward(exec, 1, wide),
                    Catch::Contains("activations 'x' (3 x 41) do not have 40 columns") &&
                        Catch::Contains("layer 1 Dense(40, 24, bias), rank"));
}
