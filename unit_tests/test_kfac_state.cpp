// kfac::Preconditioner: resume from a state file, failed saves, bad input on every rank, and the
// hook-order checker.
#include <mpi.h>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <kdist/kfac/preconditioner.hpp>
#include <vector>

#include "kfac_network.hpp"

using namespace kfac_test;

TEST_CASE("kfac: a resumed run makes bit-identical updates", "[kfac]") {
  const auto layers = network();
  Options o = base_options();
  o.kl_clip = 1e-3;
  o.inverse_every = 2;
  const std::string path = "test_kfac_state.bin";
  comm::Engine straight_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> straight(straight_engine, layers, o);
  train(straight, layers, 0, 3);
  straight.save(path);
  const auto want = train(straight, layers, 3, 3);
  comm::Engine resumed_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> resumed(resumed_engine, layers, o);
  resumed.load(path);
  CHECK(resumed.steps() == 3);
  const auto got = train(resumed, layers, 3, 3);
  CHECK(got == want);

  // Another layer list, dtype or rank count: a clear error on every rank, nothing changed.
  comm::Engine other_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> other(other_engine, {Dense(7, 4, true)}, o);
  CHECK_THROWS_WITH(other.load(path), Catch::Contains("layers"));
  CHECK(other.steps() == 0);
  comm::Engine single_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<float, TestMem> single(single_engine, layers, o);
  CHECK_THROWS_WITH(single.load(path), Catch::Contains("float32"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(path.c_str());
}

TEST_CASE("kfac: a failed save leaves the previous file intact", "[kfac]") {
  const auto layers = network();
  comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(kfac_engine, layers, base_options());
  CHECK_THROWS_AS(kfac.save("/nonexistent-dir/state.bin"), Error);
  train(kfac, layers, 0, 1);  // still usable: the save failed before anything collective broke
}

TEST_CASE("kfac: bad input raises on every rank without a hang", "[kfac][leaks-comm]") {
  const auto layers = network();
  const comm::Communicator world(MPI_COMM_WORLD);
  TestExec exec;
  SECTION("options out of range") {
    for (auto bad : std::vector<std::function<void(Options&)>>{
             [](Options& o) { o.damping = 0; }, [](Options& o) { o.factor_decay = 1; },
             [](Options& o) { o.factor_decay = -0.1; }, [](Options& o) { o.factor_every = 0; },
             [](Options& o) { o.inverse_every = 0; }}) {
      Options o = base_options();
      bad(o);
      auto make = [&](const Options& x) {
        comm::Engine k_engine{world};
        Preconditioner<double, TestMem> k(k_engine, layers, x);
      };
      CHECK_THROWS_AS(make(o), InvalidArgument);
    }
  }
  SECTION("unknown layer") {
    comm::Engine kfac_engine{world};
    Preconditioner<double, TestMem> kfac(kfac_engine, layers, base_options());
    CHECK_THROWS_WITH(kfac.on_forward(exec, 3, dense_input<double>(layers[1], 0, 1)), Catch::Contains("layer 3"));
  }
  // A rank that fails first tells the others, which may then raise RemoteError carrying its
  // message before they reach the same check themselves: either way the message is there.
  SECTION("hooks out of order, twice, and step too early") {
    comm::Engine a_engine{world};
    Preconditioner<double, TestMem> a(a_engine, layers, base_options());
    CHECK_THROWS_WITH(a.on_forward(exec, 1, dense_input<double>(layers[1], 0, 1)), Catch::Contains("out of order"));
    comm::Engine b_engine{world};
    Preconditioner<double, TestMem> b(b_engine, layers, base_options());
    CHECK_THROWS_WITH(
        [&] {
          b.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
          b.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
        }(),
        Catch::Contains("out of order"));
    comm::Engine c_engine{world};
    Preconditioner<double, TestMem> c(c_engine, layers, base_options());
    auto g = gradients<double>(layers, 0);
    CHECK_THROWS_WITH(c.step(exec, g), Catch::Contains("before every layer's hooks"));
  }
  SECTION("wrong extents and kinds") {
    comm::Engine a_engine{world};
    Preconditioner<double, TestMem> a(a_engine, layers, base_options());
    CHECK_THROWS_WITH(
        [&] {
          a.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
          a.on_forward(exec, 1, dense_input<double>(layers[2], 0, 2));
        }(),
        Catch::Contains("Dense(7, 4"));
    comm::Engine b_engine{world};
    Preconditioner<double, TestMem> b(b_engine, layers, base_options());
    CHECK_THROWS_WITH(b.on_forward(exec, 0, dense_input<double>(layers[1], 0, 1)), Catch::Contains("rank 4"));
    comm::Engine c_engine{world};
    Preconditioner<double, TestMem> c(c_engine, layers, base_options());
    CHECK_THROWS_WITH(
        [&] {
          run_hooks(c, layers, 0);
          auto g = gradients<double>(layers, 0);
          g[1].weight = DeviceMatrixR<double>("dW", 4, 6);
          c.step(exec, g);
        }(),
        Catch::Contains("takes a weight gradient 4 x 7"));
  }
  SECTION("ranks that disagree on the layer list: a mismatch on every rank, not a wrong answer") {
    if (world_size() > 1) {
      const bool odd = world_rank() == 1;
      const std::vector<Layer> mine = {Dense(7, 4, true), Dense(4, odd ? 2 : 3, false)};
      comm::Engine kfac_engine{world};
      Preconditioner<double, TestMem> kfac(kfac_engine, mine, base_options());
      CHECK_THROWS_AS(train(kfac, mine, 0, 1), Error);
    }
  }
  SECTION("ranks that disagree on split preconditioning: a mismatch on every rank, not a hang") {
    if (world_size() > 1) {
      // Rank 1 preconditions everything itself; the others wait in the all-gather of the blocks,
      // and rank 1's next operation (the next step's factor reduction) meets it.
      Options o = base_options();
      o.split_preconditioning = world_rank() != 1;
      comm::Engine kfac_engine{world};
      Preconditioner<double, TestMem> kfac(kfac_engine, layers, o);
      CHECK_THROWS_AS(train(kfac, layers, 0, 2), Error);
    }
  }
  SECTION("ranks that disagree on the placement: a mismatch on every rank, not a hang") {
    if (world_size() > 1) {
      // Rank 1 broadcasts every inverse from its owner (sequential, all CT); the others place for
      // the channel, which with the default models inverts these small factors everywhere.
      Options o = base_options();
      o.placement = world_rank() == 1 ? PlacementKind::sequential : PlacementKind::channel;
      comm::Engine kfac_engine{world};
      Preconditioner<double, TestMem> kfac(kfac_engine, layers, o);
      CHECK_THROWS_AS(train(kfac, layers, 0, 2), Error);
    }
  }
  SECTION("NaN in one rank's activations: that rank names it, the others hear it") {
    comm::Engine kfac_engine{world};
    Preconditioner<double, TestMem> kfac(kfac_engine, layers, base_options());
    const bool poisoned = world_rank() == world_size() - 1;
    auto run = [&] {
      kfac.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
      auto x = dense_input<double>(layers[1], 0, 1);
      if (poisoned) kdist_test::fill(Kokkos::subview(x, 0, Kokkos::ALL), [](std::size_t) { return NAN; });
      kfac.on_forward(exec, 1, x);
      kfac.on_forward(exec, 2, dense_input<double>(layers[2], 0, 2));
      for (int l = 2; l >= 0; --l)
        l == 0 ? kfac.on_backward(exec, l, conv_output_grad<double>(layers[0], 0, 0))
               : kfac.on_backward(exec, l, dense_output_grad<double>(layers[l], 0, l));
      auto g = gradients<double>(layers, 0);
      kfac.step(exec, g);
    };
    if (poisoned)
      CHECK_THROWS_AS(run(), NonFiniteError);
    else if (world_size() > 1)
      CHECK_THROWS_WITH(run(),
                        Catch::Contains("layer 1") && Catch::Contains("rank " + std::to_string(world_size() - 1)));
  }
  SECTION("a factor that is not SPD after damping") {
    Options o = base_options();
    const std::string path = "test_kfac_bad_state.bin";
    {
      comm::Engine kfac_engine{world};
      Preconditioner<double, TestMem> kfac(kfac_engine, layers, o);
      kfac.save(path);
    }
    if (world_rank() == 0) {
      // Make G2 (factor 3: after A0, A1, A2 of dimensions 13, 8, 4) negative definite: -10 I.
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const std::size_t header_end =
          all.find('\n', all.find('\n') + 1) + 1 + std::stoul(all.substr(all.find('\n') + 1));
      std::size_t offset = header_end;
      for (int d : {13, 8, 4}) offset += static_cast<std::size_t>(d) * d * sizeof(double);
      for (int i = 0; i < 3; ++i) {
        const double v = -10;
        f.seekp(static_cast<std::streamoff>(offset + (i * 3 + i) * sizeof(double)));
        f.write(reinterpret_cast<const char*>(&v), sizeof v);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    comm::Engine kfac_engine{world};
    Preconditioner<double, TestMem> kfac(kfac_engine, layers, o);
    kfac.load(path);
    // Step 0 updates the factors: the corrupted G2 is blended (decay 0.8) into -8 I + 0.2 G_new,
    // still not SPD after damping 0.05.

    auto run = [&] {
      run_hooks(kfac, layers, 0);
      auto g = gradients<double>(layers, 0);
      kfac.step(exec, g);
    };
    // The owner (every rank when G2 is NCT) raises NumericalError, the others RemoteError with it.

    CHECK_THROWS_WITH(run(), Catch::Contains("G2") && Catch::Contains("not positive definite"));
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::remove(path.c_str());
  }
}

TEST_CASE("HookOrder: forward 0..L-1, backward L-1..0, then step; messages name the hook, layer and rank",
          "[kfac][hooks]") {
  kdist::kfac::impl::HookOrder order(3, 5);
  CHECK(order.check_layer("on_forward", 3).find("layer 3 is not one of the 3 layers (rank 5)") != std::string::npos);
  CHECK(order.check_layer("on_forward", 2).empty());
  CHECK(order.check_between_steps("save").empty());
  CHECK(order.check_forward(1).find("expected layer 0 next") != std::string::npos);
  CHECK(order.check_backward(2).find("before every layer's on_forward (0 of 3 ran; rank 5)") != std::string::npos);
  for (int l = 0; l < 3; ++l) {
    CHECK(order.check_forward(l).empty());
    order.advance_forward();
  }
  CHECK(order.check_forward(0).find("every layer's on_forward already ran") != std::string::npos);
  CHECK(order.check_between_steps("save").find("inside a step") != std::string::npos);
  CHECK(order.check_step().find("0 of 3 on_backward") != std::string::npos);
  CHECK(order.check_backward(0).find("expected layer 2 next") != std::string::npos);
  for (int l = 2; l >= 0; --l) {
    CHECK(order.check_backward(l).empty());
    order.advance_backward();
  }
  CHECK(order.check_step().empty());
  order.start_step();
  CHECK(order.check_forward(0).empty());
  CHECK(order.check_between_steps("load").empty());
}
