// The K-FAC preconditioner (SPD-KFAC, MPD-KFAC, D-KFAC): hooks in the caller's training loop,
// its own comm::Engine beside the caller's, and factors, fusion buffers and inverses in the
// caller's memory space.
//
//   Preconditioner<float> kfac(world, {Dense(784, 256), Dense(256, 10)}, options);
//   kfac.on_forward(exec, l, activations);   // layer l's input, before its forward; l = 0..L-1
//   kfac.on_backward(exec, l, out_grads);    // layer l's output gradient (mean loss); l = L-1..0
//   kfac.step(exec, grads);                  // grads[l] := preconditioned, KL-clipped, in place
//
// Factors (kfac/factors.hpp, KFC normalisation) are updated on steps divisible by factor_every:
// each rank forms xi F + (1 - xi) F_new from its batch and the fused all-reduce averages it, so
// the running factors stay identical on every rank (identity at start). Pipelined (spd), the
// hooks hand each factor to the reduction at once and call engine().progress(); otherwise step()
// hands them all over. Inverses (F + damping I)^-1 are recomputed on steps divisible by
// inverse_every, placed by kfac/placement.hpp: CT inverses are broadcast as packed upper
// triangles from their owner, each broadcast overlapping the owner's next inverse. Then, per
// layer, V = G^-1 [dW | db] A^-1 (split_preconditioning: rank r computes the column block
// G^-1 ([dW | db] A^-1[:, block r]) and the blocks are all-gathered) and the KL clip
// nu = min(1, sqrt(kl_clip / |sum V . grad| lr^2)).
// Damping is never written into the running factors.
//
// Errors: wrong extents, an unknown layer, hooks out of order or twice, step() before every hook,
// NaN/Inf in activations or output gradients, a factor not SPD after damping: the rank that finds
// it throws (InvalidArgument, NonFiniteError, NumericalError naming the layer and the rank) and
// fails the Engine, so every other rank raises comm::RemoteError at its next wait instead of
// hanging. The running factors, inverses and counters change only when a step completes.
// save()/load() are collective; a state from another layer list, dtype or rank count is an
// InvalidArgument on every rank; a failed save leaves the previous file intact.
#pragma once

#include <kdist/comm/engine.hpp>
#include <kdist/comm/fused_allreducer.hpp>
#include <kdist/core/cost_model.hpp>
#include <kdist/core/dtype.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/inverse.hpp>
#include <kdist/core/inverse_workspace.hpp>
#include <kdist/core/packed.hpp>
#include <kdist/core/phase.hpp>
#include <kdist/core/products.hpp>
#include <kdist/kfac/factors.hpp>
#include <kdist/kfac/impl/kernels.hpp>
#include <kdist/kfac/layers.hpp>
#include <kdist/kfac/options.hpp>
#include <kdist/kfac/placement.hpp>
#include <kdist/kfac/state.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace kdist {
namespace kfac {

/// Seconds spent per phase, summed over the steps since the last reset_stats().
struct Stats {
  long long steps = 0, factor_steps = 0, inverse_steps = 0;
  double factor_compute = 0;        ///< in the hooks: factor products, EMA, packing
  double factor_comm_exposed = 0;   ///< in step(): waiting for the factor all-reduce
  double inverse_compute = 0;       ///< inverting own CT and all NCT factors
  double inverse_comm_exposed = 0;  ///< waiting for CT broadcasts and unpacking them
  double precondition = 0;          ///< V = G^-1 grad A^-1 and the KL clip
};

template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class Preconditioner {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value, "kdist::kfac: float or double");

 public:
  using memory_space = MemorySpace;
  using execution_space = typename MemorySpace::execution_space;
  using Matrix = Kokkos::View<T**, Kokkos::LayoutLeft, MemorySpace>;
  using Vector = Kokkos::View<T*, MemorySpace>;
  /// A layer's gradient: weight outputs x inputs (row-major, PyTorch's weight.grad.view(out, -1))
  /// and, when the layer has one, the bias (outputs).
  struct Gradient {
    Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace> weight;
    Vector bias;
  };

  Preconditioner(const comm::Communicator& comm, std::vector<Layer> layers, Options options = {});

  template <class XView>
  void on_forward(const execution_space& exec, int layer, const XView& activations);
  /// A Conv2d layer's forward hook from the im2col patches it formed for geometry g (as
  /// kdist::im2col writes them, g.rows() x g.patch()) instead of its NCHW input: factor A
  /// reuses them. g must be the layer's (channels, kernel, stride, padding).
  template <class PView>
  void on_forward(const execution_space& exec, int layer, const Conv2dGeometry& g, const PView& patches);
  template <class YView>
  void on_backward(const execution_space& exec, int layer, const YView& output_gradients);
  void step(const execution_space& exec, const std::vector<Gradient>& gradients);

  /// Plan the fusion again from the next factor step's measured ready times (collective).
  void replan() { replan_after_ = factor_steps_ + 1; }
  void set_learning_rate(double lr);
  /// Collective. The running factors, inverses, counters and plans.
  void save(const std::string& path);
  void load(const std::string& path);

  /// Strategy, switches, layers and the placement table: what to print at start-up.
  std::string describe() const;
  const Placement& placement() const noexcept { return placement_; }
  const comm::FusionPlan& fusion_plan() const noexcept { return fused_->plan(); }
  const Resolved& switches() const noexcept { return switches_; }
  Stats stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = Stats{}; }
  long long steps() const noexcept { return step_; }
  /// The KL clip's factor nu in the last step (1: not clipped).
  double last_clip() const noexcept { return last_clip_; }
  int layers() const noexcept { return static_cast<int>(layers_.size()); }
  /// Factors in reduction order: A_0 .. A_{L-1}, then G_{L-1} .. G_0.
  int factors() const noexcept { return 2 * layers(); }
  int a_index(int l) const noexcept { return l; }
  int g_index(int l) const noexcept { return factors() - 1 - l; }
  const Matrix& factor(int f) const { return running_[static_cast<std::size_t>(f)]; }
  const Matrix& inverse(int f) const { return inverse_[static_cast<std::size_t>(f)]; }
  comm::Engine& engine() noexcept { return engine_; }

 private:
  using Fused = comm::FusedAllreducer<T, MemorySpace>;
  const Layer& checked_layer(const char* hook, int l);
  /// Order checks, factor period, timing and error wrapping around compute(layer, fresh A).
  template <class ComputeA>
  void forward_hook(const execution_space& exec, int l, const ComputeA& compute);
  template <class E>
  [[noreturn]] void raise(const E& e) {
    engine_.fail(e);
    throw e;
  }
  void check_order(const char* hook, int l, int expected);
  template <class XView>
  void compute_a(const execution_space& exec, const Layer& layer, const XView& x, const Matrix& out);
  template <class YView>
  void compute_g(const execution_space& exec, int l, const Layer& layer, const YView& dy, const Matrix& out);
  void accept_factor(const execution_space& exec, int f, const Matrix& fresh, int l);
  void reduce_factors(const execution_space& exec);
  void update_inverses(const execution_space& exec);
  void precondition(const execution_space& exec, const std::vector<Gradient>& gradients);
  comm::Request precondition_block(const execution_space& exec, int l);
  /// Layer l's V: the first a_dim columns of result_[l] (padded to size x block columns).
  Matrix preconditioned(int l) const;
  bool split() const noexcept { return options_.split_preconditioning && engine_.size() > 1; }
  int block_columns(int l) const {
    return (layers_[static_cast<std::size_t>(l)].a_dim() + engine_.size() - 1) / engine_.size();
  }
  void check_gradient(int l, const Gradient& g) const;
  void maybe_replan();
  /// rows x cols over the reused scratch (fresh factors, the preconditioning's middle product).
  Matrix scratch_matrix(int rows, int cols);
  double phase_end(const execution_space& exec, double t0) const;
  StateHeader header() const;

  comm::Engine engine_;
  std::vector<Layer> layers_;
  Options options_;
  Resolved switches_;
  CostModelStore models_;
  Placement placement_;
  std::unique_ptr<Fused> fused_;
  std::vector<Matrix> running_, pending_, inverse_;
  std::vector<Vector> packed_;         // CT broadcast buffers
  std::vector<Matrix> work_, result_;  // per layer: [dW | db] and V (padded when split)
  std::vector<Matrix> block_;          // per layer, when split: this rank's columns of V
  Vector scratch_;
  FactorWorkspace<T, MemorySpace> factor_ws_;
  InverseWorkspace<T, MemorySpace> inverse_ws_;
  std::vector<int> spatial_;  // Conv2d: out_h * out_w and batch seen in on_forward
  std::vector<int> rows_;
  long long step_ = 0, factor_steps_ = 0, replan_after_ = 0;
  int next_forward_ = 0, next_backward_ = -1;
  bool have_inverses_ = false;
  double last_clip_ = 1.0;
  Stats stats_;
};

// ---- construction -------------------------------------------------------------------------

template <class T, class M>
Preconditioner<T, M>::Preconditioner(const comm::Communicator& comm, std::vector<Layer> layers, Options options)
    : engine_(comm), layers_(std::move(layers)), options_(std::move(options)) {
  options_.validate();
  if (layers_.empty()) kdist::impl::throw_invalid("kdist::kfac::Preconditioner", "no layers");
  switches_ = resolve(options_);
  if (!options_.cost_models.empty()) models_ = CostModelStore::load(options_.cost_models);
  const int P = engine_.size();
  std::vector<PlacementItem> items;
  std::vector<typename Fused::Tensor> tensors;
  for (int f = 0; f < factors(); ++f) {
    const bool is_a = f < static_cast<int>(layers_.size());
    const int l = is_a ? f : 2 * static_cast<int>(layers_.size()) - 1 - f;
    const int d = is_a ? layers_[static_cast<std::size_t>(l)].a_dim() : layers_[static_cast<std::size_t>(l)].g_dim();
    const std::string label = std::string(is_a ? "A" : "G") + std::to_string(l);
    items.push_back({label, d});
    tensors.push_back({label, static_cast<std::size_t>(d), true});
    Matrix F("kdist::kfac::" + label, d, d), pending("kdist::kfac::pending_" + label, d, d);
    impl::fill_identity(execution_space(), F);
    running_.push_back(F);
    pending_.push_back(pending);
    inverse_.push_back(Matrix("kdist::kfac::inverse_" + label, d, d));
  }
  placement_ = place(items, PlacementModels::from_store(models_, dtype_of<T>(), P), P, switches_.placement);
  for (int f = 0; f < factors(); ++f)
    packed_.push_back(placement_.owner[static_cast<std::size_t>(f)] < 0
                          ? Vector()
                          : Vector("kdist::kfac::packed_" + items[static_cast<std::size_t>(f)].label,
                                   packed_size(static_cast<std::size_t>(items[static_cast<std::size_t>(f)].dim))));
  fused_ = std::make_unique<Fused>(engine_, tensors, Fused::average());
  for (int l = 0; l < static_cast<int>(layers_.size()); ++l) {
    const Layer& layer = layers_[static_cast<std::size_t>(l)];
    const int columns = split() ? P * block_columns(l) : layer.a_dim();
    work_.push_back(Matrix("kdist::kfac::gradient", layer.g_dim(), layer.a_dim()));
    result_.push_back(Matrix("kdist::kfac::preconditioned", layer.g_dim(), columns));
    block_.push_back(split() ? Matrix("kdist::kfac::preconditioned_block", layer.g_dim(), block_columns(l)) : Matrix());
  }
  spatial_.assign(layers_.size(), 0);
  rows_.assign(layers_.size(), 0);
  replan_after_ = options_.profile_steps;
  Kokkos::fence();
}

template <class T, class M>
void Preconditioner<T, M>::set_learning_rate(double lr) {
  Options o = options_;
  o.lr = lr;
  o.validate();
  options_.lr = lr;
}

// ---- hooks --------------------------------------------------------------------------------

template <class T, class M>
const Layer& Preconditioner<T, M>::checked_layer(const char* hook, int l) {
  if (l < 0 || l >= layers())
    raise(InvalidArgument(std::string("kdist::kfac::") + hook + ": layer " + std::to_string(l) + " is not one of the " +
                          std::to_string(layers()) + " layers (rank " + std::to_string(engine_.rank()) + ")"));
  return layers_[static_cast<std::size_t>(l)];
}

template <class T, class M>
void Preconditioner<T, M>::check_order(const char* hook, int l, int expected) {
  if (l == expected) return;
  std::string what;
  if (expected < 0 || expected >= layers())
    what = "every layer's " + std::string(hook) + " already ran this step";
  else
    what = "expected layer " + std::to_string(expected) + " next";
  raise(InvalidArgument(std::string("kdist::kfac::") + hook + "(layer " + std::to_string(l) + "): out of order, " +
                        what + " (forward hooks go 0.." + std::to_string(layers() - 1) +
                        ", then backward hooks the other way; rank " + std::to_string(engine_.rank()) + ")"));
}

template <class T, class M>
typename Preconditioner<T, M>::Matrix Preconditioner<T, M>::scratch_matrix(int rows, int cols) {
  const std::size_t need = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (scratch_.extent(0) < need)
    scratch_ = Vector(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdist::kfac::scratch"), need);
  return Matrix(scratch_.data(), rows, cols);
}

template <class T, class M>
double Preconditioner<T, M>::phase_end(const execution_space& exec, double t0) const {
  compat::fence(exec, "kdist::kfac: phase end");
  return Clock::local_now() - t0;
}

template <class T, class M>
template <class XView>
void Preconditioner<T, M>::on_forward(const execution_space& exec, int l, const XView& x) {
  forward_hook(exec, l, [&](const Layer& layer, const Matrix& fresh) { compute_a(exec, layer, x, fresh); });
}

template <class T, class M>
template <class PView>
void Preconditioner<T, M>::on_forward(const execution_space& exec, int l, const Conv2dGeometry& g,
                                      const PView& patches) {
  forward_hook(exec, l, [&](const Layer& layer, const Matrix& fresh) {
    conv2d_a_factor_from_patches(exec, layer, g, patches, fresh);
    rows_[static_cast<std::size_t>(l)] = g.batch;
    spatial_[static_cast<std::size_t>(l)] = g.out_h() * g.out_w();
  });
}

template <class T, class M>
template <class ComputeA>
void Preconditioner<T, M>::forward_hook(const execution_space& exec, int l, const ComputeA& compute) {
  const Layer& layer = checked_layer("on_forward", l);
  check_order("on_forward", l, next_forward_);
  if (step_ % options_.factor_every != 0) {
    if (++next_forward_ == layers()) next_backward_ = layers() - 1;
    return;
  }
  Phase phase("kdist::kfac::factor A", options_.timeline, "kfac factors");
  const double t0 = Clock::local_now();
  if (l == 0 && switches_.pipelined) fused_->begin();
  const Matrix fresh = scratch_matrix(layer.a_dim(), layer.a_dim());
  try {
    compute(layer, fresh);
  } catch (const Error& e) {
    raise(InvalidArgument(std::string(e.what()) + " (kdist::kfac::on_forward, layer " + std::to_string(l) + " " +
                          layer.describe() + ", rank " + std::to_string(engine_.rank()) + ")"));
  }
  accept_factor(exec, a_index(l), fresh, l);
  ++next_forward_;
  if (next_forward_ == layers()) next_backward_ = layers() - 1;
  stats_.factor_compute += phase_end(exec, t0);
  engine_.progress();
}

template <class T, class M>
template <class YView>
void Preconditioner<T, M>::on_backward(const execution_space& exec, int l, const YView& dy) {
  const Layer& layer = checked_layer("on_backward", l);
  if (next_forward_ != layers())
    raise(InvalidArgument("kdist::kfac::on_backward(layer " + std::to_string(l) + "): called before every layer's " +
                          "on_forward (" + std::to_string(next_forward_) + " of " + std::to_string(layers()) +
                          " ran; rank " + std::to_string(engine_.rank()) + ")"));
  check_order("on_backward", l, next_backward_);
  if (step_ % options_.factor_every != 0) {
    --next_backward_;
    return;
  }
  Phase phase("kdist::kfac::factor G", options_.timeline, "kfac factors");
  const double t0 = Clock::local_now();
  const Matrix fresh = scratch_matrix(layer.g_dim(), layer.g_dim());
  try {
    compute_g(exec, l, layer, dy, fresh);
  } catch (const Error& e) {
    raise(InvalidArgument(std::string(e.what()) + " (kdist::kfac::on_backward, layer " + std::to_string(l) + " " +
                          layer.describe() + ", rank " + std::to_string(engine_.rank()) + ")"));
  }
  accept_factor(exec, g_index(l), fresh, l);
  --next_backward_;
  stats_.factor_compute += phase_end(exec, t0);
  engine_.progress();
}

template <class T, class M>
template <class XView>
void Preconditioner<T, M>::compute_a(const execution_space& exec, const Layer& layer, const XView& x,
                                     const Matrix& out) {
  const int l = static_cast<int>(&layer - layers_.data());
  if constexpr (compat::view_rank<XView>() == 2) {
    if (layer.kind() != LayerKind::dense)
      kdist::impl::throw_invalid(
          "kdist::kfac::on_forward",
          "activations " + kdist::impl::describe(x) + " are rank 2, " + layer.describe() + " takes NCHW (rank 4)");
    dense_a_factor(exec, layer, x, out);
    rows_[static_cast<std::size_t>(l)] = static_cast<int>(x.extent(0));
  } else if constexpr (compat::view_rank<XView>() == 4) {
    if (layer.kind() != LayerKind::conv2d)
      kdist::impl::throw_invalid("kdist::kfac::on_forward", "activations " + kdist::impl::describe(x) +
                                                                " are rank 4, " + layer.describe() +
                                                                " takes rows x inputs (rank 2)");
    conv2d_a_factor(exec, layer, x, out, factor_ws_);
    rows_[static_cast<std::size_t>(l)] = static_cast<int>(x.extent(0));
    spatial_[static_cast<std::size_t>(l)] =
        layer.out_h(static_cast<int>(x.extent(2))) * layer.out_w(static_cast<int>(x.extent(3)));
  } else {
    static_assert(compat::view_rank<XView>() == 2 || compat::view_rank<XView>() == 4,
                  "kdist::kfac::on_forward: activations are rank 2 (Dense) or rank 4 NCHW (Conv2d)");
  }
}

template <class T, class M>
template <class YView>
void Preconditioner<T, M>::compute_g(const execution_space& exec, int l, const Layer& layer, const YView& dy,
                                     const Matrix& out) {
  const int rows = rows_[static_cast<std::size_t>(l)];
  if (static_cast<int>(dy.extent(0)) != rows)
    kdist::impl::throw_invalid("kdist::kfac::on_backward", "output gradients " + kdist::impl::describe(dy) + " have " +
                                                               std::to_string(dy.extent(0)) +
                                                               " rows/samples, on_forward had " + std::to_string(rows));
  if constexpr (compat::view_rank<YView>() == 2) {
    if (layer.kind() != LayerKind::dense)
      kdist::impl::throw_invalid("kdist::kfac::on_backward", "output gradients " + kdist::impl::describe(dy) +
                                                                 " are rank 2, " + layer.describe() +
                                                                 " takes NCHW (rank 4)");
    dense_g_factor(exec, layer, dy, out);
  } else if constexpr (compat::view_rank<YView>() == 4) {
    if (layer.kind() != LayerKind::conv2d)
      kdist::impl::throw_invalid("kdist::kfac::on_backward", "output gradients " + kdist::impl::describe(dy) +
                                                                 " are rank 4, " + layer.describe() +
                                                                 " takes rows x outputs (rank 2)");
    const long long spatial = static_cast<long long>(dy.extent(2)) * static_cast<long long>(dy.extent(3));
    if (spatial != spatial_[static_cast<std::size_t>(l)])
      kdist::impl::throw_invalid("kdist::kfac::on_backward", "output gradients " + kdist::impl::describe(dy) +
                                                                 " have " + std::to_string(spatial) +
                                                                 " locations, the forward input gives " +
                                                                 std::to_string(spatial_[static_cast<std::size_t>(l)]));
    conv2d_g_factor(exec, layer, dy, out, factor_ws_);
  } else {
    static_assert(compat::view_rank<YView>() == 2 || compat::view_rank<YView>() == 4,
                  "kdist::kfac::on_backward: output gradients are rank 2 (Dense) or rank 4 NCHW (Conv2d)");
  }
}

// The fresh factor's diagonal holds sums of squares of every input value, so a NaN or Inf
// anywhere in the batch (or an overflow) shows there: a d-element check, not a pass over the
// batch. The running factor is then blended into `pending`, never into itself.
template <class T, class M>
void Preconditioner<T, M>::accept_factor(const execution_space& exec, int f, const Matrix& fresh, int l) {
  const int d = static_cast<int>(fresh.extent(0));
  const int bad = impl::count_nonfinite_diagonal(exec, fresh);
  if (bad > 0) {
    const bool is_a = f < layers();
    raise(NonFiniteError(
        is_a ? "kdist::kfac::on_forward" : "kdist::kfac::on_backward",
        std::string(is_a ? "activations" : "output gradients") + " of layer " + std::to_string(l) + " " +
            layers_[static_cast<std::size_t>(l)].describe(),
        static_cast<long long>(d), engine_.rank(),
        std::to_string(bad) + " of the factor's " + std::to_string(d) + " diagonal entries are not finite"));
  }
  const Matrix F = running_[static_cast<std::size_t>(f)], P = pending_[static_cast<std::size_t>(f)];
  const T xi = static_cast<T>(options_.factor_decay);
  impl::blend(exec, P, F, fresh, xi);
  if (switches_.pipelined) fused_->ready(exec, f, P);
}

// ---- step ---------------------------------------------------------------------------------

template <class T, class M>
void Preconditioner<T, M>::step(const execution_space& exec, const std::vector<Gradient>& gradients) {
  if (gradients.size() != layers_.size())
    raise(InvalidArgument("kdist::kfac::step: " + std::to_string(gradients.size()) + " gradients for " +
                          std::to_string(layers()) + " layers (rank " + std::to_string(engine_.rank()) + ")"));
  if (next_forward_ != layers() || next_backward_ != -1)
    raise(InvalidArgument("kdist::kfac::step: called before every layer's hooks ran (" + std::to_string(next_forward_) +
                          " of " + std::to_string(layers()) + " on_forward, " +
                          std::to_string(layers() - 1 - next_backward_) + " of " + std::to_string(layers()) +
                          " on_backward; rank " + std::to_string(engine_.rank()) + ")"));
  for (int l = 0; l < layers(); ++l) check_gradient(l, gradients[static_cast<std::size_t>(l)]);
  const bool factor_step = step_ % options_.factor_every == 0;
  if (factor_step) {
    reduce_factors(exec);
    std::swap(running_, pending_);
    ++factor_steps_;
    ++stats_.factor_steps;
  }
  if (step_ % options_.inverse_every == 0 || !have_inverses_) {
    update_inverses(exec);
    have_inverses_ = true;
    ++stats_.inverse_steps;
  }
  precondition(exec, gradients);
  if (factor_step) maybe_replan();
  ++step_;
  ++stats_.steps;
  next_forward_ = 0;
  next_backward_ = -1;
}

template <class T, class M>
void Preconditioner<T, M>::check_gradient(int l, const Gradient& g) const {
  const Layer& layer = layers_[static_cast<std::size_t>(l)];
  const bool weight_ok =
      static_cast<int>(g.weight.extent(0)) == layer.outputs() && static_cast<int>(g.weight.extent(1)) == layer.inputs();
  const bool bias_ok = layer.bias() ? static_cast<int>(g.bias.extent(0)) == layer.outputs() : g.bias.extent(0) == 0;
  if (weight_ok && bias_ok) return;
  const_cast<Preconditioner*>(this)->raise(InvalidArgument(
      "kdist::kfac::step: layer " + std::to_string(l) + " " + layer.describe() + " takes a weight gradient " +
      std::to_string(layer.outputs()) + " x " + std::to_string(layer.inputs()) +
      (layer.bias() ? " and a bias gradient of " + std::to_string(layer.outputs()) : std::string(" and no bias")) +
      ", got " + kdist::impl::describe(g.weight) +
      (g.bias.extent(0) ? " and " + kdist::impl::describe(g.bias) : std::string()) + " (rank " +
      std::to_string(engine_.rank()) + ")"));
}

template <class T, class M>
void Preconditioner<T, M>::reduce_factors(const execution_space& exec) {
  Phase phase("kdist::kfac::factor all-reduce (exposed)", options_.timeline, "kfac communication");
  const double t0 = Clock::local_now();
  if (!switches_.pipelined) {
    fused_->begin();
    for (int f = 0; f < factors(); ++f) fused_->ready(exec, f, pending_[static_cast<std::size_t>(f)]);
  }
  fused_->wait(exec);
  stats_.factor_comm_exposed += phase_end(exec, t0);
}

// CT factors go in kfac::broadcast_order: every rank submits the broadcasts in that one order (the
// Engine keeps collectives ordered), an owner inverts its factors in that order, each while its
// previous broadcast is in flight. NCT factors follow, locally.
template <class T, class M>
void Preconditioner<T, M>::update_inverses(const execution_space& exec) {
  const int me = engine_.rank();
  const std::vector<int> order = broadcast_order(placement_);
  auto invert = [&](int f) {
    Phase phase("kdist::kfac::inverse", options_.timeline, "kfac inverses");
    const double t0 = Clock::local_now();
    try {
      spd_inverse(exec, running_[static_cast<std::size_t>(f)], options_.damping, inverse_[static_cast<std::size_t>(f)],
                  inverse_ws_, options_.inverse_method);
    } catch (const NumericalError& e) {
      raise(NumericalError(e.operation() + " on K-FAC factor " + fused_->tensors()[static_cast<std::size_t>(f)].label +
                               " (rank " + std::to_string(me) + ")",
                           e.dim(), e.damping(), e.info(), e.reason()));
    }
    stats_.inverse_compute += phase_end(exec, t0);
  };
  std::vector<comm::Request> broadcasts;
  for (int f : order) {
    const int root = placement_.owner[static_cast<std::size_t>(f)];
    if (root == me) {
      invert(f);
      pack_upper(exec, inverse_[static_cast<std::size_t>(f)], packed_[static_cast<std::size_t>(f)]);
    }
    broadcasts.push_back(engine_.broadcast(exec, packed_[static_cast<std::size_t>(f)], root,
                                           "kfac inverse " + fused_->tensors()[static_cast<std::size_t>(f)].label));
    engine_.progress();
  }
  for (int f = 0; f < factors(); ++f)
    if (placement_.owner[static_cast<std::size_t>(f)] < 0) {
      invert(f);
      engine_.progress();
    }
  Phase phase("kdist::kfac::inverse broadcast (exposed)", options_.timeline, "kfac communication");
  const double t0 = Clock::local_now();
  for (std::size_t k = 0; k < order.size(); ++k) {
    broadcasts[k].wait();
    const int f = order[k];
    if (placement_.owner[static_cast<std::size_t>(f)] != me)
      unpack_upper(exec, packed_[static_cast<std::size_t>(f)], inverse_[static_cast<std::size_t>(f)]);
  }
  stats_.inverse_comm_exposed += phase_end(exec, t0);
}

}  // namespace kfac
}  // namespace kdist

#include <kdist/kfac/impl/precondition.hpp>
