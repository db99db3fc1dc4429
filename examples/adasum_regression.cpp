// Minimal Adasum training loop: each rank fits y = w.x + b on its own shard of synthetic data
// with plain SGD, and kdist combines the ranks' parameter updates with Adasum after each local
// step. Run: mpiexec -n 3 build/examples/adasum_regression
#include <kdist/adasum/delta_optimizer.hpp>

#include <cmath>
#include <cstdio>
#include <random>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    kdist::comm::Communicator world(MPI_COMM_WORLD);
    kdist::comm::Engine engine(world);
    using Param = kdist::adasum::DeltaOptimizer<double, Kokkos::HostSpace>::Param;

    const int dim = 8, samples = 64;
    std::vector<double> w_true(dim);
    for (int j = 0; j < dim; ++j) w_true[j] = std::sin(1.0 + j);
    std::mt19937_64 rng(17 + world.rank());  // each rank has its own data shard
    std::normal_distribution<double> g;
    std::vector<std::vector<double>> X(samples, std::vector<double>(dim));
    std::vector<double> y(samples);
    for (int s = 0; s < samples; ++s) {
      y[s] = 0.5;
      for (int j = 0; j < dim; ++j) y[s] += w_true[j] * (X[s][j] = g(rng));
    }

    Param w("w", dim), b("b", 1), gw("grad w", dim), gb("grad b", 1);  // parameters start at 0 everywhere
    kdist::adasum::DeltaOptimizer<double, Kokkos::HostSpace> opt(engine, {w, b});
    auto loss_and_grad = [&] {
      double loss = 0;
      Kokkos::deep_copy(gw, 0.0);
      Kokkos::deep_copy(gb, 0.0);
      for (int s = 0; s < samples; ++s) {
        double err = b(0) - y[s];
        for (int j = 0; j < dim; ++j) err += w(j) * X[s][j];
        loss += err * err / samples;
        for (int j = 0; j < dim; ++j) gw(j) += 2 * err * X[s][j] / samples;
        gb(0) += 2 * err / samples;
      }
      return loss;
    };
    const double lr = 0.1;  // the single-worker rate: Adasum does not grow the effective batch
    const double first = loss_and_grad();
    double last = first;
    for (int step = 0; step < 60; ++step) {
      loss_and_grad();
      opt.step(Kokkos::DefaultHostExecutionSpace(), {gw, gb}, [&] {
        for (int j = 0; j < dim; ++j) w(j) -= lr * gw(j);
        b(0) -= lr * gb(0);
      });
      last = loss_and_grad();
    }
    if (world.rank() == 0) std::printf("adasum_regression: %d ranks, loss %.4g -> %.4g\n", world.size(), first, last);
    rc = last < 1e-3 * first ? 0 : 1;
  }
  MPI_Finalize();
  return rc;
}
