// K-FAC in a training loop: a two-layer network y = W2 relu(W1 x + b1) fitting a fixed random
// teacher, data split over the ranks. Run: mpiexec -n 2 build/examples/kfac_embedding
#include <kdist/kfac/preconditioner.hpp>

#include <mpi.h>
#include <cmath>
#include <cstdio>
#include <random>

using namespace kdist;
using Mat = Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace>;
using Grad = kfac::Preconditioner<double, Kokkos::HostSpace>::Gradient;

// C = A B^T (+ bias), or with `t` C = A^T B: the dense layer's three products, host loops.
void mul(const Mat& A, const Mat& B, const Mat& C, bool t = false) {
  for (size_t i = 0; i < C.extent(0); ++i)
    for (size_t j = 0; j < C.extent(1); ++j) {
      double s = 0;
      for (size_t k = 0; k < (t ? A.extent(0) : A.extent(1)); ++k) s += t ? A(k, i) * B(k, j) : A(i, k) * B(j, k);
      C(i, j) = s;
    }
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    comm::Communicator world(MPI_COMM_WORLD);
    const int n = 32, in = 8, hidden = 16, out = 4, steps = 30;
    kfac::Options options;  // strategy spd: pipelined factors, optimal fusion, LBP placement
    options.damping = 0.01;
    comm::Engine kfac_engine(world);  // K-FAC's own stream: factors never queue behind gradients
    kfac::Preconditioner<double, Kokkos::HostSpace> kfac(
        kfac_engine, {kfac::Dense(in, hidden), kfac::Dense(hidden, out, false)}, options);
    comm::Engine grads(world);  // the caller's own gradient all-reduce
    if (world.rank() == 0) std::printf("%s\n", kfac.describe().c_str());

    std::mt19937 rng(7 + world.rank());
    std::normal_distribution<double> normal;
    Mat x("x", n, in), y("y", n, out), W1("W1", hidden, in), W2("W2", out, hidden), teacher("T", out, in);
    Kokkos::View<double*, Kokkos::HostSpace> b1("b1", hidden);
    for (const Mat& m : {x, W1, W2})
      for (size_t i = 0; i < m.span(); ++i) m.data()[i] = 0.5 * normal(rng);
    std::mt19937 same(1);  // the teacher is the same on every rank
    for (int i = 0; i < out * in; ++i) teacher.data()[i] = normal(same);
    mul(x, teacher, y);
    Mat h("h", n, hidden), p("p", n, out), dp("dp", n, out), dh("dh", n, hidden);
    Grad g1{Mat("dW1", hidden, in), Kokkos::View<double*, Kokkos::HostSpace>("db1", hidden)},
        g2{Mat("dW2", out, hidden), {}};
    Kokkos::DefaultHostExecutionSpace exec;
    double first = 0, loss = 0;
    for (int step = 0; step < steps; ++step) {
      kfac.on_forward(exec, 0, x);  // 1. each layer's input, before its forward
      mul(x, W1, h);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < hidden; ++j) h(i, j) = std::max(0.0, h(i, j) + b1(j));
      kfac.on_forward(exec, 1, h);
      mul(h, W2, p);
      loss = 0;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < out; ++j) {
          loss += 0.5 * (p(i, j) - y(i, j)) * (p(i, j) - y(i, j)) / n;
          dp(i, j) = (p(i, j) - y(i, j)) / n;  // gradient of the mean loss
        }
      kfac.on_backward(exec, 1, dp);  // 2. each layer's output gradient, last layer first
      mul(dp, h, g2.weight, true);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < hidden; ++j) {
          double s = 0;
          for (int k = 0; k < out; ++k) s += dp(i, k) * W2(k, j);
          dh(i, j) = h(i, j) > 0 ? s : 0;
        }
      kfac.on_backward(exec, 0, dh);
      mul(dh, x, g1.weight, true);
      for (int j = 0; j < hidden; ++j) {
        g1.bias(j) = 0;
        for (int i = 0; i < n; ++i) g1.bias(j) += dh(i, j);
      }
      for (const Mat& m : {g1.weight, g2.weight}) {  // the Engine takes rank-1 views
        Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> flat(m.data(), m.span());
        grads.allreduce(exec, flat, comm::ReduceOp::average).wait();
      }
      grads.allreduce(exec, g1.bias, comm::ReduceOp::average).wait();
      kfac.step(exec, {g1, g2});  // 3. precondition in place; the optimizer follows
      for (auto [W, G] : {std::pair{W1, g1.weight}, std::pair{W2, g2.weight}})
        for (size_t i = 0; i < W.span(); ++i) W.data()[i] -= 0.5 * G.data()[i];
      for (int j = 0; j < hidden; ++j) b1(j) -= 0.5 * g1.bias(j);
      if (step == 0) first = loss;
    }
    const kfac::Stats s = kfac.stats();
    std::printf("rank %d: loss %.4f -> %.4f in %d steps; factors %.2g s, inverses %.2g s, precondition %.2g s\n",
                world.rank(), first, loss, steps, s.factor_compute, s.inverse_compute, s.precondition);
    rc = loss < 0.5 * first ? 0 : 1;
  }
  MPI_Finalize();
  return rc;
}
