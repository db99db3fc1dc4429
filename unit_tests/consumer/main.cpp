// Uses the installed kdist: factor product, SPD inverse and clock sync on two ranks.
#include <mpi.h>
#include <kdist/comm/clock_sync.hpp>
#include <kdist/config.hpp>
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
    kdist::Clock clock;
    kdist::comm::synchronize_clock(MPI_COMM_WORLD, clock);
    std::printf("consumer: kdist %s, residual %s\n", KDIST_VERSION, bad ? "BAD" : "ok");
  }
  MPI_Finalize();
  return bad;
}
