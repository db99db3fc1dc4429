// bench_kfac: one K-FAC training iteration of a ResNet-50-shaped network, per strategy and per
// ablation switch, with the SPD-KFAC paper's Fig. 9 breakdown (milliseconds per iteration):
//   fwd_bwd      forward and backward of every layer (im2col + gemm, real shapes), hooks excluded
//   grad_comm    the fused gradient all-reduce (averaging) after backward
//   factors      factor products, running averages and packing, in the hooks
//   factor_comm  waiting for the factor all-reduce in step() (what pipelining did not hide)
//   inverses     inverting this rank's CT and all NCT factors
//   inverse_comm waiting for the CT broadcasts
//   precondition V = G^-1 grad A^-1, the all-gather of the split blocks, and the KL clip
//   total        the whole iteration, the maximum over ranks
// and last the iteration time relative to D-KFAC, measured first in the same run.
//
// The network: torchvision ResNet-50's 53 convolutions (v1.5: the stride in the 3x3 conv) and its
// fc layer, in forward order, with every channel count divided by --width and the input side
// 224 / --downscale (so the spatial sizes of every stage shrink alike). Each convolution runs on
// a random input of its own shape (no residual adds, batch norm or ReLU: the convolutions are
// where ResNet's time goes); the output gradient of each is random too. Factors and inverses are
// updated every iteration (k1 = k2 = 1) as in the paper's per-iteration figures. The iterations go
// round-robin over the configurations (one Preconditioner each). Every figure is rank 0's median
// over --iters iterations after --warmup, except total (median of the max over ranks).
//   mpiexec -n 2 build/perf/bench_kfac [--part strategies|ablation|all] [--cost-models FILE] [--json FILE]
// (perf/run_netns.sh runs it on an emulated cluster link).
#include <kdist/comm/fused_allreducer.hpp>
#include <kdist/kfac/preconditioner.hpp>
#include <kdist/nn/conv2d.hpp>
#include <kdist/nn/dense.hpp>
#include <kdist/nn/init.hpp>

#include <mpi.h>
#include <CLI/CLI.hpp>
#include <Kokkos_Random.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>

#include "bench_mpi.hpp"

namespace {

using namespace kdist;
using T = float;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Conv = nn::Conv2d<T, Mem>;
using Dense = nn::Dense<T, Mem>;
using KFAC = kfac::Preconditioner<T, Mem>;

struct ConvSpec {
  int c_in, c_out, k, stride, padding, side;  // side: the input's height and width
};

struct Settings {
  int width = 4, downscale = 4, batch = 8, warmup = 2, iters = 7;
  std::string part = "all", json, cost_models;
  bool replicated_precondition = false;
};

// torchvision ResNet-50 v1.5 convolutions, channels / width, input side 224 / downscale.
std::vector<ConvSpec> resnet50_convs(int width, int downscale) {
  const int side = 224 / downscale;
  std::vector<ConvSpec> L = {{3, 64 / width, 7, 2, 3, side}};
  int in = 64 / width, s = side / 4;  // after the stride-2 conv1 and the stride-2 max pool
  const int planes[] = {64, 128, 256, 512}, blocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage)
    for (int b = 0; b < blocks[stage]; ++b) {
      const int p = planes[stage] / width, stride = stage > 0 && b == 0 ? 2 : 1, s2 = (s + stride - 1) / stride;
      L.push_back({in, p, 1, 1, 0, s});                       // 1x1 reduce
      L.push_back({p, p, 3, stride, 1, s});                   // 3x3
      L.push_back({p, 4 * p, 1, 1, 0, s2});                   // 1x1 expand
      if (b == 0) L.push_back({in, 4 * p, 1, stride, 0, s});  // downsample
      in = 4 * p;
      s = s2;
    }
  return L;
}

template <class V>
void fill_random(const V& v, std::uint64_t seed, double scale) {
  Kokkos::Random_XorShift64_Pool<Exec> pool(seed);
  Kokkos::fill_random(v, pool, static_cast<T>(-scale), static_cast<T>(scale));
}

// The network with its inputs, output gradients and gradient reduction; one Preconditioner per
// configuration is attached in turn.
class Network {
 public:
  Network(const Settings& s, comm::Communicator& world) : grads_engine_(world) {
    const auto specs = resnet50_convs(s.width, s.downscale);
    std::uint64_t seed = 1 + 1000 * static_cast<std::uint64_t>(world.rank());
    for (const ConvSpec& c : specs) {
      conv_.emplace_back(c.c_in, c.c_out, c.k, c.k, c.stride, c.padding, false);
      const int out = (c.side + 2 * c.padding - c.k) / c.stride + 1;
      x_.emplace_back("x", s.batch, c.c_in, c.side, c.side);
      y_.emplace_back("y", s.batch, c.c_out, out, out);
      dy_.emplace_back("dy", s.batch, c.c_out, out, out);
      dx_.emplace_back("dx", s.batch, c.c_in, c.side, c.side);
      nn::he_init(Exec(), conv_.back(), seed++);
      fill_random(x_.back(), seed++, 1.0);
      fill_random(dy_.back(), seed++, 1.0 / s.batch);
    }
    const int features = specs.back().c_out;
    fc_ = std::make_unique<Dense>(features, 1000, true);
    nn::he_init(Exec(), *fc_, seed++);
    fc_x_ = nn::Tensor2<T, Mem>("fc_x", s.batch, features);
    fc_y_ = nn::Tensor2<T, Mem>("fc_y", s.batch, 1000);
    fc_dy_ = nn::Tensor2<T, Mem>("fc_dy", s.batch, 1000);
    fc_dx_ = nn::Tensor2<T, Mem>("fc_dx", s.batch, features);
    fill_random(fc_x_, seed++, 1.0);
    fill_random(fc_dy_, seed++, 1.0 / s.batch);
    std::vector<comm::FusedAllreducer<T, Mem>::Tensor> tensors;
    for (const auto& p : parameters()) {
      tensors.push_back({p.name, p.gradient.extent(0), false});
      grads_.push_back(Kokkos::View<T*, Mem>(const_cast<T*>(p.gradient.data()), p.gradient.extent(0)));
    }
    fused_ = std::make_unique<comm::FusedAllreducer<T, Mem>>(grads_engine_, tensors);
    Kokkos::fence();
  }

  std::vector<kfac::Layer> kfac_layers() const {
    std::vector<kfac::Layer> l;
    for (const Conv& c : conv_) l.push_back(c.kfac_layer());
    l.push_back(fc_->kfac_layer());
    return l;
  }
  void attach(KFAC* kfac) {
    for (std::size_t l = 0; l < conv_.size(); ++l) conv_[l].attach(kfac, kfac ? static_cast<int>(l) : -1);
    fc_->attach(kfac, kfac ? static_cast<int>(conv_.size()) : -1);
  }
  std::vector<KFAC::Gradient> gradients() const {
    std::vector<KFAC::Gradient> g;
    for (const Conv& c : conv_) g.push_back(c.gradient());
    g.push_back(fc_->gradient());
    return g;
  }
  int layers() const { return static_cast<int>(conv_.size()) + 1; }

  void forward(const Exec& exec) {
    for (std::size_t l = 0; l < conv_.size(); ++l) conv_[l].forward(exec, x_[l], y_[l]);
    fc_->forward(exec, fc_x_, fc_y_);
  }
  void backward(const Exec& exec) {
    fc_->backward(exec, fc_dy_, fc_dx_);
    for (std::size_t l = conv_.size(); l-- > 0;)
      if (l == 0)
        conv_[l].backward(exec, dy_[l]);
      else
        conv_[l].backward(exec, dy_[l], dx_[l]);
  }
  void reduce_gradients(const Exec& exec) {
    fused_->begin();
    for (std::size_t i = 0; i < grads_.size(); ++i) fused_->ready(exec, static_cast<int>(i), grads_[i]);
    fused_->wait(exec);
  }

 private:
  std::vector<nn::Parameter<T, Mem>> parameters() const {
    std::vector<nn::Parameter<T, Mem>> p;
    for (const Conv& c : conv_)
      for (const auto& q : c.parameters()) p.push_back(q);
    for (const auto& q : fc_->parameters()) p.push_back(q);
    return p;
  }

  comm::Engine grads_engine_;
  std::vector<Conv> conv_;
  std::vector<nn::Tensor4<T, Mem>> x_, y_, dy_, dx_;
  std::unique_ptr<Dense> fc_;
  nn::Tensor2<T, Mem> fc_x_, fc_y_, fc_dy_, fc_dx_;
  std::vector<Kokkos::View<T*, Mem>> grads_;
  std::unique_ptr<comm::FusedAllreducer<T, Mem>> fused_;
};

struct Breakdown {
  double fwd_bwd = 0, grad_comm = 0, factors = 0, factor_comm = 0, inverses = 0, inverse_comm = 0, precondition = 0,
         total = 0;
};

struct Config {
  std::string name;
  kfac::Options options;
};

// One iteration with `kfac` attached: each phase on this rank, total as the max over ranks.
Breakdown iteration(Network& net, KFAC& kfac) {
  Exec exec;
  net.attach(&kfac);
  kfac.reset_stats();
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = Clock::local_now();
  net.forward(exec);
  net.backward(exec);
  exec.fence();
  const double t1 = Clock::local_now();
  net.reduce_gradients(exec);
  const double t2 = Clock::local_now();
  kfac.step(exec, net.gradients());
  exec.fence();
  const double t3 = Clock::local_now();
  net.attach(nullptr);
  const kfac::Stats k = kfac.stats();
  return {(t1 - t0) - k.factor_compute,
          t2 - t1,
          k.factor_compute,
          k.factor_comm_exposed,
          k.inverse_compute,
          k.inverse_comm_exposed,
          k.precondition,
          kdist_bench::max_over_ranks(t3 - t0)};
}

// Every configuration's Preconditioner exists at once and the iterations go round-robin over
// them, so a drift of the machine's speed (this VM's drifts by 1.5x within an hour) lands on every
// configuration alike; then the median over iterations of each phase, in milliseconds.
std::vector<Breakdown> measure(const Settings& s, comm::Communicator& world, Network& net,
                               const std::vector<Config>& configs) {
  std::vector<std::unique_ptr<KFAC>> kfacs;
  for (const Config& c : configs) kfacs.push_back(std::make_unique<KFAC>(world, net.kfac_layers(), c.options));
  std::vector<std::vector<Breakdown>> runs(configs.size());
  for (int it = 0; it < s.warmup + s.iters; ++it)
    for (std::size_t c = 0; c < configs.size(); ++c) {
      const Breakdown b = iteration(net, *kfacs[c]);
      if (it >= s.warmup) runs[c].push_back(b);
    }
  std::vector<Breakdown> medians;
  for (const auto& r : runs) {
    auto med = [&](double Breakdown::*field) {
      std::vector<double> v;
      for (const Breakdown& b : r) v.push_back(b.*field * 1e3);
      return kdist_bench::median(v);
    };
    medians.push_back({med(&Breakdown::fwd_bwd), med(&Breakdown::grad_comm), med(&Breakdown::factors),
                       med(&Breakdown::factor_comm), med(&Breakdown::inverses), med(&Breakdown::inverse_comm),
                       med(&Breakdown::precondition), med(&Breakdown::total)});
  }
  return medians;
}

std::vector<Config> configs(const Settings& s) {
  kfac::Options base;
  base.damping = 1e-2;
  base.factor_every = 1;
  base.inverse_every = 1;
  base.profile_steps = 1;
  base.split_preconditioning = !s.replicated_precondition;
  base.cost_models = s.cost_models;
  std::vector<Config> c;
  for (kfac::Strategy st : {kfac::Strategy::dkfac, kfac::Strategy::mpdkfac, kfac::Strategy::spd}) {
    kfac::Options o = base;
    o.strategy = st;
    if (s.part != "ablation" || st == kfac::Strategy::dkfac) c.push_back({kfac::to_string(st), o});
  }
  if (s.part == "strategies") return c;
  for (bool pipelined : {false, true})
    for (kfac::PlacementKind pl :
         {kfac::PlacementKind::replicated, kfac::PlacementKind::sequential, kfac::PlacementKind::lbp})
      for (comm::Planner pn :
           {comm::Planner::none, comm::Planner::threshold, comm::Planner::mgwfbp, comm::Planner::optimal}) {
        kfac::Options o = base;
        o.pipelined = pipelined;
        o.placement = pl;
        o.planner = pn;
        c.push_back(
            {std::string(pipelined ? "pipe" : "nopipe") + "/" + kfac::to_string(pl) + "/" + comm::to_string(pn), o});
      }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    CLI::App app{"kdist: one K-FAC iteration of a scaled ResNet-50, Fig. 9 breakdown per strategy and ablation"};
    Settings s;
    app.add_option("--part", s.part, "strategies (spd, mpdkfac, dkfac), ablation, or all")
        ->check(CLI::IsMember({"strategies", "ablation", "all"}))
        ->capture_default_str();
    app.add_option("--width", s.width, "divide every channel count by this")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--downscale", s.downscale, "input side 224 / this")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--batch", s.batch, "images per rank")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--warmup", s.warmup, "iterations not counted")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_option("--iters", s.iters, "iterations measured")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_flag("--replicated-precondition", s.replicated_precondition, "every rank preconditions every layer");
    app.add_option("--cost-models", s.cost_models,
                   "kdist_calibrate output for the planners and LBP (default: the stated defaults)");
    app.add_option("--json", s.json, "write the rows to this JSON file");
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      rc = rank == 0 ? app.exit(e) : (e.get_exit_code() != 0 ? 2 : 0);
      MPI_Finalize();
      return rc;
    }
    try {
      comm::Communicator world(MPI_COMM_WORLD);
      Network net(s, world);
      kdist_bench::Table table("bench_kfac", {"config", "fwd_bwd_ms", "grad_comm_ms", "factors_ms", "factor_comm_ms",
                                              "inverses_ms", "inverse_comm_ms", "precond_ms", "total_ms", "vs_dkfac"});
      table.set_print(rank == 0);
      table.context("ranks", world.size());
      table.context("network", "ResNet-50 convolutions + fc, channels / " + std::to_string(s.width) + ", input " +
                                   std::to_string(224 / s.downscale) + "x" + std::to_string(224 / s.downscale));
      table.context("batch_per_rank", s.batch);
      table.context("iters", s.iters);
      if (rank == 0)
        std::printf(
            "# bench_kfac: %d layers (ResNet-50 convs + fc, channels / %d, input %dx%d), batch %d per rank, "
            "%d rank(s), k1 = k2 = 1, preconditioning %s; ms per iteration, medians of %d\n",
            net.layers(), s.width, 224 / s.downscale, 224 / s.downscale, s.batch, world.size(),
            s.replicated_precondition ? "on every rank" : "split", s.iters);
      table.print_header();
      const std::vector<Config> runs = configs(s);
      const std::vector<Breakdown> results = measure(s, world, net, runs);
      for (std::size_t c = 0; c < runs.size(); ++c) {
        const Breakdown& b = results[c];
        table.row({runs[c].name, b.fwd_bwd, b.grad_comm, b.factors, b.factor_comm, b.inverses, b.inverse_comm,
                   b.precondition, b.total, b.total / results[0].total});
      }
      if (rank == 0) table.write_json(s.json);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_kfac (rank %d): %s\n", rank, e.what());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
