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
// fc layer, in forward order (perf/model/networks.hpp, the shapes the scale model projects), with
// every channel count divided by --width and the input side 224 / --downscale (so the spatial
// sizes of every stage shrink alike). Each convolution runs on
// a random input of its own shape (no residual adds, batch norm or ReLU: the convolutions are
// where ResNet's time goes); the output gradient of each is random too. Factors and inverses are
// updated every iteration (k1 = k2 = 1) as in the paper's per-iteration figures. The iterations go
// round-robin over the configurations (one Preconditioner each). Every figure is rank 0's median
// over --iters iterations after --warmup, except total (median of the max over ranks).
//   mpiexec -n 2 build/perf/bench_kfac [--part strategies|ablation|all] [--cost-models FILE] [--json FILE]
//                                      [--profile FILE]
// (perf/run_netns.sh runs it on an emulated cluster link). --profile also writes the per-layer
// compute, inverse and packing times kdist_model replays (class Profile below), sampled in the
// same round-robin.
#include <kdist/comm/fused_allreducer.hpp>
#include <kdist/core/atomic_file.hpp>
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

#include "common/bench_mpi.hpp"
#include "common/mpi_main.hpp"
#include "model/networks.hpp"

namespace {

using namespace kdist;
using T = float;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Conv = nn::Conv2d<T, Mem>;
using Dense = nn::Dense<T, Mem>;
using KFAC = kfac::Preconditioner<T, Mem>;

using Shape = kdist_perf::LayerShape;

struct Settings {
  int width = 4, downscale = 4, batch = 8, warmup = 2, iters = 7;
  std::string part = "all", json, cost_models, profile;
  bool replicated_precondition = false;
};

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
    specs_ = kdist_perf::network_layers("resnet50", s.width, 224 / s.downscale);
    const Shape fc = specs_.back();
    specs_.pop_back();
    const auto& specs = specs_;
    std::uint64_t seed = 1 + 1000 * static_cast<std::uint64_t>(world.rank());
    for (const Shape& c : specs) {
      conv_.emplace_back(c.c_in, c.c_out, c.k_h, c.k_w, c.stride, c.pad_h, false);
      const int out = c.out_h();
      x_.emplace_back("x", s.batch, c.c_in, c.in_h, c.in_w);
      y_.emplace_back("y", s.batch, c.c_out, out, out);
      dy_.emplace_back("dy", s.batch, c.c_out, out, out);
      dx_.emplace_back("dx", s.batch, c.c_in, c.in_h, c.in_w);
      nn::he_init(Exec(), conv_.back(), seed++);
      fill_random(x_.back(), seed++, 1.0);
      fill_random(dy_.back(), seed++, 1.0 / s.batch);
    }
    const int features = fc.c_in;
    fc_ = std::make_unique<Dense>(features, fc.c_out, true);
    nn::he_init(Exec(), *fc_, seed++);
    fc_x_ = nn::Tensor2<T, Mem>("fc_x", s.batch, features);
    fc_y_ = nn::Tensor2<T, Mem>("fc_y", s.batch, fc.c_out);
    fc_dy_ = nn::Tensor2<T, Mem>("fc_dy", s.batch, fc.c_out);
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
  /// Layer l's forward (with its on_forward hook when attached), fenced, in seconds.
  double forward_layer(const Exec& exec, int l) {
    const double t0 = Clock::local_now();
    if (l < static_cast<int>(conv_.size()))
      conv_[static_cast<std::size_t>(l)].forward(exec, x_[static_cast<std::size_t>(l)],
                                                 y_[static_cast<std::size_t>(l)]);
    else
      fc_->forward(exec, fc_x_, fc_y_);
    exec.fence();
    return Clock::local_now() - t0;
  }
  double backward_layer(const Exec& exec, int l) {
    const double t0 = Clock::local_now();
    const auto i = static_cast<std::size_t>(l);
    if (l == static_cast<int>(conv_.size()))
      fc_->backward(exec, fc_dy_, fc_dx_);
    else if (l == 0)
      conv_[i].backward(exec, dy_[i]);
    else
      conv_[i].backward(exec, dy_[i], dx_[i]);
    exec.fence();
    return Clock::local_now() - t0;
  }
  const std::vector<Shape>& specs() const { return specs_; }
  std::size_t gradient_elements(int l) const {
    return l < static_cast<int>(conv_.size()) ? conv_[static_cast<std::size_t>(l)].gradient().weight.size()
                                              : fc_->gradient().weight.size() + fc_->gradient().bias.size();
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
  std::vector<Shape> specs_;
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
// With a profile (class Profile below), one profile sample opens each round.
template <class Sampler>
std::vector<Breakdown> measure(const Settings& s, comm::Communicator& world, Network& net,
                               const std::vector<Config>& configs, Sampler* profile) {
  std::vector<std::unique_ptr<comm::Engine>> engines;  // one stream per configuration, as in use
  std::vector<std::unique_ptr<KFAC>> kfacs;
  for (const Config& c : configs) {
    engines.push_back(std::make_unique<comm::Engine>(world));
    kfacs.push_back(std::make_unique<KFAC>(*engines.back(), net.kfac_layers(), c.options));
  }
  std::vector<std::vector<Breakdown>> runs(configs.size());
  for (int it = 0; it < s.warmup + s.iters; ++it) {
    if (profile) profile->sample(it >= s.warmup);
    for (std::size_t c = 0; c < configs.size(); ++c) {
      const Breakdown b = iteration(net, *kfacs[c]);
      if (it >= s.warmup) runs[c].push_back(b);
    }
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

// G += I. A free function: nvcc refuses a KOKKOS_LAMBDA in a private member function.
template <class M>
void add_identity(const Exec& exec, const M& G) {
  Kokkos::parallel_for(
      "bench_kfac::identity", Kokkos::RangePolicy<Exec>(exec, 0, static_cast<int>(G.extent(0))),
      KOKKOS_LAMBDA(const int j) { G(j, j) += typename M::value_type(1); });
}

// Per-layer compute times for the scale model (perf/model, kdist_model --profile), sampled once per
// round of the round-robin so that they see the same machine as the configurations:
//  - a D-KFAC Preconditioner is attached, so the hooks compute and blend factors without
//    communicating; each layer's forward and backward is fenced and timed, and the hook's share is
//    read from the Preconditioner's own factor_compute counter around the call; then the same with
//    an SPD-KFAC one, whose hooks also pack each factor and progress the pipelined all-reduce (on
//    these two cores that progress is CPU work: TCP or shared-memory copies), and whose layers then
//    run beside the transfer (the kernel's TCP work takes the same cores);
//  - both products of V = G^-1 [dW|db] A^-1 per layer as real gemms of the layer's shapes, and the
//    Preconditioner's own passes over the gradient (gather, the clip's inner product, scatter);
//  - the SPD inverse of every distinct factor dimension (F^T F / d + I: SPD and well conditioned
//    like a running factor; an ill-conditioned F^T F ran 1.5x slower in OpenBLAS here), and packing
//    and unpacking it as the FusedAllreducer does.
// Medians over the rounds, rank 0's.
class Profile {
 public:
  Profile(const Settings& s, comm::Communicator& world, Network& net)
      : net_(net),
        kfac_engine_(world),
        pipelined_engine_(world),
        kfac_(kfac_engine_, net.kfac_layers(), options(kfac::Strategy::dkfac, s)),
        pipelined_(pipelined_engine_, net.kfac_layers(), options(kfac::Strategy::spd, s)) {
    const auto L = static_cast<std::size_t>(net.layers());
    for (auto* v : {&fwd_, &bwd_, &fa_, &fg_, &pre_, &copy_, &pfa_, &pfg_, &pfwd_, &pbwd_}) v->resize(L);
    for (const auto& layer : net.kfac_layers()) {
      dims_.push_back(layer.a_dim());
      dims_.push_back(layer.g_dim());
    }
    std::sort(dims_.begin(), dims_.end());
    dims_.erase(std::unique(dims_.begin(), dims_.end()), dims_.end());
    for (auto* v : {&inverse_, &pack_, &unpack_}) v->resize(dims_.size());
  }

  void sample(bool keep) {
    layers_pass(kfac_, fwd_, fa_, bwd_, fg_, keep);
    layers_pass(pipelined_, pfwd_, pfa_, pbwd_, pfg_, keep);
    precondition_pass(keep);
    inverse_pass(keep);
  }

  void write(const Settings& s, int ranks) const {
    const auto layers = net_.kfac_layers();
    nlohmann::json rows = nlohmann::json::array(), inverses = nlohmann::json::array();
    for (std::size_t l = 0; l < layers.size(); ++l) rows.push_back(row(l, layers[l]));
    for (std::size_t i = 0; i < dims_.size(); ++i)
      inverses.push_back({{"dim", dims_[i]},
                          {"seconds", kdist_bench::median(inverse_[i])},
                          {"pack_s", kdist_bench::median(pack_[i])},
                          {"unpack_s", kdist_bench::median(unpack_[i])}});
    const nlohmann::json doc{{"source", "bench_kfac --profile"},
                             {"network", "resnet50"},
                             {"width", s.width},
                             {"side", 224 / s.downscale},
                             {"batch", s.batch},
                             {"ranks", ranks},
                             {"iters", s.iters},
                             {"layers", rows},
                             {"inverses", inverses}};
    write_file_atomically(s.profile, doc.dump(1) + "\n", "bench_kfac --profile");
  }

 private:
  using Matrix = Kokkos::View<T**, Kokkos::LayoutLeft, Mem>;

  static kfac::Options options(kfac::Strategy strategy, const Settings& s) {
    kfac::Options o;
    o.strategy = strategy;
    o.damping = 1e-2;
    o.profile_steps = 1;
    o.cost_models = s.cost_models;
    o.cholesky_solves = kdist::kfac::CholeskySolves::never;  // the paper's algorithm, as configs() below
    return o;
  }

  using Samples = std::vector<std::vector<double>>;
  template <class Run>
  static void timed(KFAC& kfac, Run&& run, std::vector<double>& compute, std::vector<double>& hook, bool keep) {
    const double f0 = kfac.stats().factor_compute;
    const double t = run();
    const double h = kfac.stats().factor_compute - f0;
    if (!keep) return;
    compute.push_back(t - h);
    hook.push_back(h);
  }

  // One iteration with `kfac` attached, each layer's forward and backward timed apart from its hook.
  void layers_pass(KFAC& kfac, Samples& fwd, Samples& fa, Samples& bwd, Samples& fg, bool keep) {
    const auto L = fwd.size();
    net_.attach(&kfac);
    MPI_Barrier(MPI_COMM_WORLD);
    for (std::size_t l = 0; l < L; ++l)
      timed(
          kfac, [&] { return net_.forward_layer(exec_, static_cast<int>(l)); }, fwd[l], fa[l], keep);
    for (std::size_t l = L; l-- > 0;)
      timed(
          kfac, [&] { return net_.backward_layer(exec_, static_cast<int>(l)); }, bwd[l], fg[l], keep);
    kfac.step(exec_, net_.gradients());
    net_.attach(nullptr);
  }

  void precondition_pass(bool keep) {
    const auto layers = net_.kfac_layers();
    const auto grads = net_.gradients();
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const int g = layers[l].g_dim(), a = layers[l].a_dim();
      Matrix Gi("Ginv", g, g), W("Wt", a, g), Ai("Ainv", a, a), R("R", a, g), V("Vt", a, g);  // transposed, as kfac
      fill_random(Gi, std::uint64_t{7}, 1.0);
      fill_random(W, std::uint64_t{8}, 1.0);
      fill_random(Ai, std::uint64_t{9}, 1.0);
      exec_.fence();
      const double t0 = Clock::local_now();
      gemm(exec_, "N", "N", T(1), W, Gi, T(0), R);
      gemm(exec_, "N", "N", T(1), Ai, R, T(0), V);
      exec_.fence();
      const double t1 = Clock::local_now();
      kfac::impl::gather_gradient(exec_, W, grads[l].weight, grads[l].bias, layers[l].bias());
      (void)kfac::impl::inner(exec_, V, W);
      kfac::impl::scatter_gradient(exec_, grads[l].weight, grads[l].bias, V, T(1), layers[l].bias());
      exec_.fence();
      if (!keep) continue;
      pre_[l].push_back(t1 - t0);
      copy_[l].push_back(Clock::local_now() - t1);
    }
  }

  void inverse_pass(bool keep) {
    for (std::size_t i = 0; i < dims_.size(); ++i) {
      const int d = dims_[i];
      Matrix F("F", d, d), G("G", d, d), Fi("Finv", d, d);
      fill_random(F, static_cast<std::uint64_t>(d), 1.0);
      gemm(exec_, "T", "N", T(1) / static_cast<T>(d), F, F, T(0), G);
      add_identity(exec_, G);
      Kokkos::View<T*, Mem> packed("packed", packed_size(static_cast<std::size_t>(d)));
      exec_.fence();
      const double t0 = Clock::local_now();
      spd_inverse(exec_, G, 1e-2, Fi, ws_);
      exec_.fence();
      const double t1 = Clock::local_now();
      pack_upper(exec_, G, packed);
      exec_.fence();
      const double t2 = Clock::local_now();
      unpack_upper(exec_, packed, Fi);
      exec_.fence();
      if (!keep) continue;
      inverse_[i].push_back(t1 - t0);
      pack_[i].push_back(t2 - t1);
      unpack_[i].push_back(Clock::local_now() - t2);
    }
  }

  nlohmann::json row(std::size_t l, const kfac::Layer& layer) const {
    const bool dense = l + 1 == fwd_.size();
    Shape c;
    if (dense) {
      c.c_in = layer.inputs();
      c.c_out = layer.outputs();
    } else {
      c = net_.specs()[l];
    }
    return {{"label", dense ? std::string("fc") : "conv" + std::to_string(l)},
            {"dense", dense},
            {"bias", layer.bias()},
            {"c_in", c.c_in},
            {"c_out", c.c_out},
            {"k", c.k_h},
            {"stride", c.stride},
            {"padding", c.pad_h},
            {"side", c.in_h},
            {"a_dim", layer.a_dim()},
            {"g_dim", layer.g_dim()},
            {"gradient_elements", net_.gradient_elements(static_cast<int>(l))},
            {"forward_s", kdist_bench::median(fwd_[l])},
            {"backward_s", kdist_bench::median(bwd_[l])},
            {"factor_a_s", kdist_bench::median(fa_[l])},
            {"factor_g_s", kdist_bench::median(fg_[l])},
            {"factor_a_pipelined_s", kdist_bench::median(pfa_[l])},
            {"factor_g_pipelined_s", kdist_bench::median(pfg_[l])},
            {"forward_pipelined_s", kdist_bench::median(pfwd_[l])},
            {"backward_pipelined_s", kdist_bench::median(pbwd_[l])},
            {"precondition_s", kdist_bench::median(pre_[l])},
            {"precondition_copy_s", kdist_bench::median(copy_[l])}};
  }

  Exec exec_;
  Network& net_;
  comm::Engine kfac_engine_, pipelined_engine_;  // before the Preconditioners that borrow them
  KFAC kfac_, pipelined_;
  InverseWorkspace<T, Mem> ws_;
  std::vector<int> dims_;
  Samples fwd_, bwd_, fa_, fg_, pre_, copy_, inverse_, pack_, unpack_;
  Samples pfa_, pfg_, pfwd_, pbwd_;  // with the pipelined Preconditioner: hooks (packing, progress), layers
};

std::vector<Config> configs(const Settings& s) {
  kfac::Options base;
  base.damping = 1e-2;
  base.factor_every = 1;
  base.inverse_every = 1;
  base.profile_steps = 1;
  base.split_preconditioning = !s.replicated_precondition;
  base.cost_models = s.cost_models;
  // The study measures the paper's algorithm, every factor inverted: what perf/model/ replays.
  base.cholesky_solves = kdist::kfac::CholeskySolves::never;
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
  app.add_option("--warmup", s.warmup, "iterations not counted")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--iters", s.iters, "iterations measured")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--replicated-precondition", s.replicated_precondition, "every rank preconditions every layer");
  app.add_option("--cost-models", s.cost_models,
                 "kdist_calibrate output for the planners and LBP (default: the stated defaults)");
  app.add_option("--json", s.json, "write the rows to this JSON file");
  app.add_option("--profile", s.profile,
                 "first write per-layer compute times to this JSON file (input of kdist_model)");
  return kdist_perf::mpi_main(argc, argv, app, "bench_kfac", [&](int rank) {
    comm::Communicator world(MPI_COMM_WORLD);
    Network net(s, world);
    std::unique_ptr<Profile> profile;
    if (!s.profile.empty()) {
      check_file_writable(s.profile, "bench_kfac --profile");
      profile = std::make_unique<Profile>(s, world, net);
    }
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
    const std::vector<Breakdown> results = measure(s, world, net, runs, profile.get());
    if (profile && rank == 0) profile->write(s, world.size());
    for (std::size_t c = 0; c < runs.size(); ++c) {
      const Breakdown& b = results[c];
      table.row({runs[c].name, b.fwd_bwd, b.grad_comm, b.factors, b.factor_comm, b.inverses, b.inverse_comm,
                 b.precondition, b.total, b.total / results[0].total});
    }
    if (rank == 0) table.write_json(s.json);
  });
}
