// Uses the installed kdist: factor product, SPD inverse, clock sync, and the README's fused,
// planned gradient reduction ("Embedding a fused gradient reduction"), on two ranks.
#include <mpi.h>
#include <kdist/comm/clock_sync.hpp>
#include <kdist/comm/fused_allreducer.hpp>
#include <kdist/config.hpp>
#include <kdist/core/cost_model.hpp>
#include <kdist/core/inverse.hpp>
#include <kdist/core/products.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int bad = 0;
  {
    Kokkos::ScopeGuard guard(argc, argv);
    using Exec = Kokkos::DefaultHostExecutionSpace;
    Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace> X("X", 16, 3);
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 3; ++c) X(r, c) = std::sin(1.0 + r * 3 + c);
    kdist::Matrix<double, Kokkos::HostSpace> A("A", 4, 4), inv("inv", 4, 4);
    kdist::factor_product(Exec(), X, A, 1.0 / 16, true);
    kdist::spd_inverse(Exec(), A, 1e-3, inv);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        double s = 1e-3 * inv(i, j);
        for (int k = 0; k < 4; ++k) s += A(i, k) * inv(k, j);
        if (std::abs(s - (i == j)) > 1e-8) bad = 1;
      }

    // ---- README: embedding a fused gradient reduction ----
    using Space = Kokkos::DefaultExecutionSpace;
    kdist::comm::Communicator world(MPI_COMM_WORLD);
    kdist::comm::Engine engine(world);
    kdist::comm::FusedAllreducer<float> grads(engine, {{"fc1.w", 784 * 256}, {"fc1.b", 256}, {"fc2.w", 256 * 10}});
    std::vector<Kokkos::View<float*>> g = {Kokkos::View<float*>("fc1.w", 784 * 256), Kokkos::View<float*>("fc1.b", 256),
                                           Kokkos::View<float*>("fc2.w", 256 * 10)};
    for (int step = 0; step < 4; ++step) {
      grads.begin();
      for (int i = 0; i < 3; ++i) {  // in ready order, as your backward pass produces them
        Kokkos::deep_copy(Space(), g[static_cast<std::size_t>(i)], 1.0f);
        grads.ready(Space(), i, g[static_cast<std::size_t>(i)]);
      }
      grads.wait(Space());  // g[i] := average over ranks
      if (step == 1) grads.replan(kdist::CostModel(), {kdist::comm::Planner::optimal});
    }
    kdist::Clock clock;
    kdist::comm::synchronize_clock(engine, clock);  // the installed comm unit, through the Engine
    auto back = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), g[1]);
    if (back(0) != 1.0f) bad = 1;
    std::printf("consumer: kdist %s, residual %s\n", KDIST_VERSION, bad ? "BAD" : "ok");
  }
  MPI_Finalize();
  return bad;
}
