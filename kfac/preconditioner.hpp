// The K-FAC preconditioner (SPD-KFAC, MPD-KFAC, D-KFAC): hooks in the caller's training loop, a
// borrowed comm::Engine (best one of its own, beside the caller's gradient Engine), and factors,
// fusion buffers and inverses in the caller's memory space.
//
//   comm::Engine kfac_engine(world);
//   Preconditioner<float> kfac(kfac_engine, {Dense(784, 256), Dense(256, 10)}, options);
//   kfac.on_forward(exec, l, activations);   // layer l's input, before its forward; l = 0..L-1
//   kfac.on_backward(exec, l, out_grads);    // layer l's output gradient (mean loss); l = L-1..0
//   kfac.step(exec, grads);                  // grads[l] := preconditioned, KL-clipped, in place
//
// Factors (kfac/factors.hpp, KFC normalisation) are updated on steps divisible by factor_every:
// each rank forms xi F + (1 - xi) F_new from its batch and the fused all-reduce averages it, so
// the running factors stay identical on every rank (identity at start; with Options::factor_sync
// before_inverses only the inverse steps' all-reduce, the factors rank-local in between, kfac-jax's
// lazy sync). Pipelined (spd), the
// hooks hand each factor to the reduction at once and call engine().progress(); otherwise step()
// hands them all over. Inverses (F + damping I)^-1 are recomputed on steps divisible by
// inverse_every, placed by kfac/placement.hpp: CT inverses are broadcast as packed upper
// triangles from their owner, each broadcast overlapping the owner's next inverse. Then, per
// layer, V = G^-1 [dW | db] A^-1, computed as Vᵀ = A^-1 [dW | db]ᵀ G^-1 (split_preconditioning,
// for averaged gradients: rank r computes its block of the layer's outputs, or of its inputs where
// that leaves the busiest rank less work, kfac/precondition_split.hpp, and the blocks are
// all-gathered; Gradients::per_rank: each rank all of its own) and the
// KL clip nu = min(1, sqrt(kl_clip / |sum V . grad| lr^2)). With Options::low_rank_dense a Dense
// layer whose batch is smaller than it is preconditioned from the hooks' x and dy instead, the
// ranks' terms all-reduced, after a check that the gradient is that batch's (kfac/impl/low_rank.hpp).
// Damping is never written into the running factors.
//
// Errors: wrong extents, an unknown layer, hooks out of order or twice, step() before every hook,
// NaN/Inf in activations or output gradients, a factor not SPD after damping: the rank that finds
// it throws (InvalidArgument, NonFiniteError, NumericalError naming the layer and the rank) and
// fails the Engine, so every other rank raises comm::RemoteError at its next wait instead of
// hanging; an exception of any other type (std::bad_alloc, say) where a hook computes its factor
// or step() makes the inverses and preconditions fails the Engine as well before it leaves. On steps that make no
// factor the hooks read nothing, so they check only their order. The running factors and counters change only when a
// step completes; a step that throws leaves the inverses it was making unspecified. The Engine has failed by then, so
// the run ends: restart from the last state saved (save() needs a healthy Engine). save()/load() are collective; a
// state from another layer list or dtype, or a damaged one, is refused on every rank naming the file, field and byte
// offset; a failed save leaves the previous file intact. A state saved at another rank count is resumed with plans
// re-made for this one.
#pragma once

#include <kdist/comm/engine.hpp>
#include <kdist/comm/fused_allreducer.hpp>
#include <kdist/comm/outcome.hpp>
#include <kdist/core/cholesky.hpp>
#include <kdist/core/cost_model.hpp>
#include <kdist/core/dtype.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/inverse.hpp>
#include <kdist/core/inverse_workspace.hpp>
#include <kdist/core/packed.hpp>
#include <kdist/core/phase.hpp>
#include <kdist/core/products.hpp>
#include <kdist/core/state_file.hpp>
#include <kdist/kfac/factors.hpp>
#include <kdist/kfac/impl/hook_order.hpp>
#include <kdist/kfac/impl/kernels.hpp>
#include <kdist/kfac/impl/low_rank.hpp>
#include <kdist/kfac/impl/slots.hpp>
#include <kdist/kfac/impl/solve_costs.hpp>
#include <kdist/kfac/impl/state.hpp>
#include <kdist/kfac/layers.hpp>
#include <kdist/kfac/options.hpp>
#include <kdist/kfac/placement.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace kdist {
namespace kfac {

/// Seconds spent per phase, summed over the steps since the last reset_stats().
struct Stats {
  long long steps = 0, factor_steps = 0, inverse_steps = 0;
  double factor_compute = 0;        ///< in the hooks: factor products, EMA, packing (not the
                                    ///< layer's own queued work, which a hook waits for first)
  double factor_comm_exposed = 0;   ///< in step(): waiting for the factor all-reduce
  long long factor_syncs = 0;       ///< factor all-reduces (Options::factor_sync)
  double inverse_compute = 0;       ///< inverting own CT and all NCT factors
  double inverse_comm_exposed = 0;  ///< waiting for CT broadcasts and unpacking them
  double precondition = 0;          ///< V = G^-1 grad A^-1 and the KL clip
  long long low_rank_products = 0;  ///< layers preconditioned from their batch, summed over steps
                                    ///< (Options::low_rank_dense)
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

  /// `engine` is borrowed, as everywhere in kdist, and must outlive the Preconditioner; give it an
  /// Engine of its own (its factor and inverse traffic is then a stream beside your gradients').
  Preconditioner(comm::Engine& engine, std::vector<Layer> layers, Options options = {});

  template <class XView>
  void on_forward(const execution_space& exec, int layer, const XView& activations);
  /// A Conv2d layer's forward hook from the im2col patches it formed for geometry g (as
  /// kdist::im2col writes them, g.rows() x g.patch(); for a layer with a bias also g.patch() + 1
  /// columns, the last all ones, as nn::Conv2d passes them) instead of its NCHW input: factor A
  /// reuses them. g must be the layer's (channels, kernel, stride, padding).
  template <class PView>
  void on_forward(const execution_space& exec, int layer, const Conv2dGeometry& g, const PView& patches);
  template <class YView>
  void on_backward(const execution_space& exec, int layer, const YView& output_gradients);
  void step(const execution_space& exec, const std::vector<Gradient>& gradients);

  /// Plan the fusion again from the next factor step's measured ready times (collective).
  void replan() { replan_after_ = factor_steps_ + 1; }
  void set_learning_rate(double lr);
  /// The state: running factors, inverses, counters, and the placement and fusion plan.
  /// save: collective; rank 0 writes `path` atomically (core/state_file.hpp), every rank learns
  /// whether it worked. load: collective; every rank reads `path` and checks all of it before
  /// anything changes, and a failure anywhere raises on every rank, as do copies that differ
  /// between ranks (a stale file on one node: InvalidArgument naming two ranks). A state saved at another
  /// rank count is taken as it is, with this run's placement and split and a fresh fusion plan
  /// (describe() says so); at the same count its plans are kept and the run continues bit for
  /// bit. Both only between steps.
  void save(const std::string& path);
  void load(const std::string& path);
  /// The same state as fields and sections whose names start with `prefix`, inside a caller's file (a training
  /// checkpoint): not collective, every rank holds all of it. load_from checks everything first.
  void save_to(StateWriter& out, const std::string& prefix = "kfac.") const;
  void load_from(const StateReader& in, const std::string& prefix = "kfac.");
  /// With FactorSync::before_inverses: all-reduces the running factors if they are rank-local
  /// (a factor step since the last sync), as an inverse step would; else nothing. Collective, only
  /// between steps: every rank calls it, e.g. before one of them calls save_to().
  void sync_factors(const execution_space& exec);
  /// Whether the running factors are this rank's own (FactorSync::before_inverses, between syncs).
  bool factors_local() const noexcept { return factors_local_; }
  /// The `kind` of the file save() writes.
  static constexpr const char* kStateKind = "kdist.kfac";

  /// Strategy, switches, layers and the placement table: what to print at start-up.
  std::string describe() const;
  /// After a load: the file, the step and rank count it was saved at, and which plans this run
  /// keeps ("" before any load); describe() includes it.
  const std::string& restored() const noexcept { return restored_; }
  const Placement& placement() const noexcept { return placement_; }
  const comm::FusionPlan& fusion_plan() const noexcept { return fused_->plan(); }
  const Resolved& switches() const noexcept { return switches_; }
  Stats stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = Stats{}; }
  long long steps() const noexcept { return step_; }
  /// The KL clip's factor nu in the last step (1: not clipped).
  double last_clip() const noexcept { return last_clip_; }
  int layers() const noexcept { return static_cast<int>(layer_slots_.size()); }
  /// Factors in reduction order: A_0 .. A_{L-1}, then G_{L-1} .. G_0.
  int factors() const noexcept { return 2 * layers(); }
  int a_index(int l) const noexcept { return l; }
  int g_index(int l) const noexcept { return factors() - 1 - l; }
  /// Factor f's running average, full symmetric: a copy (kdist keeps the upper triangle only).
  /// f outside [0, factors()) is an InvalidArgument here (a local query: the Engine is not told).
  Matrix factor(int f) const;
  /// Factor f's (F + damping I)^-1 from the last inverse step, or, where holds_cholesky(f), its
  /// upper Cholesky factor R (R^T R = F + damping I; the lower triangle unspecified).
  const Matrix& inverse(int f) const { return checked_slot("kdist::kfac::Preconditioner::inverse", f).inverse; }
  bool holds_cholesky(int f) const { return checked_slot("kdist::kfac::Preconditioner::holds_cholesky", f).cholesky; }
  comm::Engine& engine() noexcept { return engine_; }

 private:
  using Fused = comm::FusedAllreducer<T, MemorySpace>;
  using FactorSlot = impl::FactorSlot<T, MemorySpace>;
  using LayerSlot = impl::LayerSlot<T, MemorySpace>;
  FactorSlot& factor_slot(int f) { return factor_slots_[static_cast<std::size_t>(f)]; }
  const FactorSlot& factor_slot(int f) const { return factor_slots_[static_cast<std::size_t>(f)]; }
  LayerSlot& layer_slot(int l) { return layer_slots_[static_cast<std::size_t>(l)]; }
  const LayerSlot& layer_slot(int l) const { return layer_slots_[static_cast<std::size_t>(l)]; }
  const Layer& layer(int l) const { return layer_slot(l).layer; }
  const FactorSlot& checked_slot(const char* func, int f) const {
    if (f < 0 || f >= factors())
      kdist::impl::throw_invalid(func, "factor " + std::to_string(f) + " of " + std::to_string(factors()) + " (rank " +
                                           std::to_string(engine_.rank()) + ")");
    return factor_slot(f);
  }
  /// Raises InvalidArgument(message) here and on every rank, unless the message is empty.
  void require(const std::string& message) const {
    if (!message.empty()) raise(InvalidArgument(message));
  }
  void require_between_steps(const char* operation) const { require(order_.check_between_steps(operation)); }
  /// Order checks, keep() on every step where keeps_batch(l), then the factor period, timing and
  /// error wrapping around compute(pending A, update).
  template <class ComputeA, class Keep>
  void forward_hook(const execution_space& exec, int l, const ComputeA& compute, const Keep& keep);
  /// Options::low_rank_dense: Dense layer l keeps each step's batch (kfac/impl/low_rank.hpp).
  bool keeps_batch(int l) const { return options_.low_rank_dense && layer(l).kind() == LayerKind::dense; }
  template <class XView>
  void keep_batch_inputs(const execution_space& exec, int l, const XView& x);
  template <class YView>
  void keep_batch_gradients(const execution_space& exec, int l, const YView& dy);
  /// into := vᵀ, dim x v's rows (a last row of ones where dim > features: the bias); v must be rows x
  /// features (rows < 0: any). `what` names the hook and the view.
  template <class View>
  void keep_batch(const execution_space& exec, int l, const View& v, const char* what, int features, int rows, int dim,
                  Matrix& into);
  /// Sets each layer's from_batch and batch_weight for this step; collective with
  /// averaged gradients on several ranks. Refuses, on every rank, a gradient that is not the batch's.
  void choose_low_rank(const execution_space& exec);
  /// Layer l's Vᵀ from its batch, this rank's weighted term, and the all-reduce summing the terms
  /// (none with per-rank gradients or one rank).
  comm::Request precondition_from_batch(const execution_space& exec, int l);
  template <class E>
  [[noreturn]] void raise(const E& e) const {
    engine_.fail(e);
    throw e;
  }
  /// In a catch block: the exception being handled fails the Engine (the peers learn why), then
  /// leaves as it is. Nothing happens to an Engine that has failed already.
  [[noreturn]] void fail_and_rethrow() const {
    engine_.fail(std::current_exception());
    throw;
  }
  template <class XView>
  void compute_a(const execution_space& exec, int l, const XView& x, const Matrix& out, const FactorUpdate& update);
  template <class YView>
  void compute_g(const execution_space& exec, int l, const YView& dy, const Matrix& out, const FactorUpdate& update);
  /// Factor f's pending upper triangle := its running one; returns pending, for the blend.
  const Matrix& start_factor(const execution_space& exec, int f);
  void accept_factor(const execution_space& exec, int f, int l);
  bool factor_step() const noexcept { return step_ % options_.factor_every == 0; }
  bool inverse_step() const noexcept { return step_ % options_.inverse_every == 0 || !have_inverses_; }
  /// Whether this step's factors are all-reduced, if it is a factor step (Options::factor_sync):
  /// the hooks and step() ask alike, between which nothing it reads changes.
  bool syncs_factors() const noexcept { return options_.factor_sync == FactorSync::every_step || inverse_step(); }
  /// Waits for the factor all-reduce of pending (handed over first unless the hooks did) or, with
  /// of_running, of the running factors in place (the rank-local ones, before inverting them).
  void reduce_factors(const execution_space& exec, bool of_running = false);
  /// The blended factors become the running ones (and back, when a step fails after the swap).
  void swap_running_and_pending();
  void update_inverses(const execution_space& exec);
  void invert(const execution_space& exec, int f);
  void precondition(const execution_space& exec, const std::vector<Gradient>& gradients);
  comm::Request precondition_block(const execution_space& exec, int l);
  /// Layer l's Vᵀ (a_dim x outputs): the first g_dim columns of its result (split over outputs:
  /// padded to size x block columns).
  Matrix preconditioned(int l) const;
  bool split() const noexcept {
    return options_.split_preconditioning && options_.gradients == Gradients::averaged && engine_.size() > 1;
  }
  /// Per factor (A0.., G..0): kept as its Cholesky factor? (Options::cholesky_solves; collective
  /// when measured.)
  std::vector<bool> cholesky_forms();
  /// Empty when gradient g fits layer l, else the message.
  std::string check_gradient(int l, const Gradient& g) const;
  void maybe_replan();
  /// rows x cols over the reused scratch (the preconditioning's middle product).
  Matrix scratch_matrix(int rows, int cols);
  double phase_end(const execution_space& exec, double t0) const;
  /// A hook first waits for the work the caller queued on exec (its layer's forward or backward
  /// on a GPU), so that the hook's time is its own factor's.
  static void wait_for_queued_work(const execution_space& exec);
  /// A state read and checked, not yet applied (load: applied once every rank has one).
  struct Restore {
    impl::StateCounters counters;
    std::vector<typename Matrix::HostMirror> factors, inverses;
    std::string origin;
    bool keep_inverses = false;  ///< the saved inverses serve this run (same damping and method)
    int converted = 0;           ///< of them, converted to this run's form (convert_inverse_forms)
  };
  impl::StateShape state_shape() const;
  /// Per factor: 1 where `inverse` holds the Cholesky factor, 0 where the inverse (the state's).
  std::vector<int> inverse_forms() const;
  /// Converts each of `inverses` (host copies, the state read from `origin`) whose form (`saved`,
  /// per factor; empty: all inverses) is not this run's, on the host; returns how many. A failure
  /// is a NumericalError naming the factor, the file and the rank.
  int convert_inverse_forms(const std::vector<int>& saved, std::vector<typename Matrix::HostMirror>& inverses,
                            const std::string& origin) const;
  Restore stage(const StateReader& in, const std::string& prefix) const;
  void commit(Restore&& restore);

  comm::Engine& engine_;
  Options options_;
  Resolved switches_;
  CostModelStore models_;
  Placement placement_;
  std::vector<FactorSlot> factor_slots_;  ///< in reduction order: A_0 .. A_{L-1}, G_{L-1} .. G_0
  std::vector<LayerSlot> layer_slots_;
  std::unique_ptr<Fused> fused_;
  Vector scratch_;
  Kokkos::View<double*, MemorySpace> sketch_sums_, sketch_rows_;  ///< choose_low_rank's (impl/low_rank.hpp)
  Vector sketch_u_, sketch_given_;
  FactorWorkspace<T, MemorySpace> factor_ws_;
  InverseWorkspace<T, MemorySpace> inverse_ws_;
  impl::HookOrder order_;
  long long step_ = 0, factor_steps_ = 0, replan_after_ = 0;
  bool have_inverses_ = false;
  bool factors_local_ = false;  ///< a factor step since the last sync (FactorSync::before_inverses)
  double last_clip_ = 1.0;
  std::string restored_;  ///< what load() did, for describe()
  Stats stats_;
};

// ---- hooks (templates on the caller's views; the rest is in kfac/impl/) --------------------

template <class T, class M>
template <class XView>
void Preconditioner<T, M>::on_forward(const execution_space& exec, int l, const XView& x) {
  forward_hook(
      exec, l, [&](const Matrix& out, const FactorUpdate& update) { compute_a(exec, l, x, out, update); },
      [&] { keep_batch_inputs(exec, l, x); });
}

template <class T, class M>
template <class PView>
void Preconditioner<T, M>::on_forward(const execution_space& exec, int l, const Conv2dGeometry& g,
                                      const PView& patches) {
  forward_hook(
      exec, l,
      [&](const Matrix& out, const FactorUpdate& update) {
        conv2d_a_factor_from_patches(exec, layer(l), g, patches, out, update);
        layer_slot(l).rows = g.batch;
        layer_slot(l).spatial = g.out_h() * g.out_w();
      },
      [&] {
        raise(InvalidArgument("kdist::kfac::on_forward: im2col patches for layer " + std::to_string(l) + " " +
                              layer(l).describe() + ", a Dense layer (rank " + std::to_string(engine_.rank()) + ")"));
      });
}

template <class T, class M>
template <class ComputeA, class Keep>
void Preconditioner<T, M>::forward_hook(const execution_space& exec, int l, const ComputeA& compute, const Keep& keep) {
  require(order_.check_layer("on_forward", l));
  require(order_.check_forward(l));
  if (keeps_batch(l)) keep();
  if (!factor_step()) return order_.advance_forward();
  wait_for_queued_work(exec);
  Phase phase("kdist::kfac::factor A", options_.timeline, "kfac factors");
  const double t0 = Clock::local_now();
  if (l == 0 && switches_.pipelined && syncs_factors()) fused_->begin();
  const Matrix& blended = start_factor(exec, a_index(l));
  try {
    compute(blended, FactorUpdate::running_average(options_.factor_decay));
  } catch (const Error& e) {
    raise(InvalidArgument(std::string(e.what()) + " (kdist::kfac::on_forward, layer " + std::to_string(l) + " " +
                          layer(l).describe() + ", rank " + std::to_string(engine_.rank()) + ")"));
  } catch (...) {
    fail_and_rethrow();
  }
  accept_factor(exec, a_index(l), l);
  order_.advance_forward();
  stats_.factor_compute += phase_end(exec, t0);
  engine_.progress();
}

template <class T, class M>
template <class YView>
void Preconditioner<T, M>::on_backward(const execution_space& exec, int l, const YView& dy) {
  require(order_.check_layer("on_backward", l));
  require(order_.check_backward(l));
  if (keeps_batch(l)) keep_batch_gradients(exec, l, dy);
  if (!factor_step()) return order_.advance_backward();
  wait_for_queued_work(exec);
  Phase phase("kdist::kfac::factor G", options_.timeline, "kfac factors");
  const double t0 = Clock::local_now();
  const Matrix& blended = start_factor(exec, g_index(l));
  try {
    compute_g(exec, l, dy, blended, FactorUpdate::running_average(options_.factor_decay));
  } catch (const Error& e) {
    raise(InvalidArgument(std::string(e.what()) + " (kdist::kfac::on_backward, layer " + std::to_string(l) + " " +
                          layer(l).describe() + ", rank " + std::to_string(engine_.rank()) + ")"));
  } catch (...) {
    fail_and_rethrow();
  }
  accept_factor(exec, g_index(l), l);
  order_.advance_backward();
  stats_.factor_compute += phase_end(exec, t0);
  engine_.progress();
}

template <class T, class M>
template <class XView>
void Preconditioner<T, M>::compute_a(const execution_space& exec, int l, const XView& x, const Matrix& out,
                                     const FactorUpdate& update) {
  LayerSlot& slot = layer_slot(l);
  const Layer& layer = slot.layer;
  if constexpr (compat::view_rank<XView>() == 2) {
    if (layer.kind() != LayerKind::dense)
      kdist::impl::throw_invalid(
          "kdist::kfac::on_forward",
          "activations " + kdist::impl::describe(x) + " are rank 2, " + layer.describe() + " takes NCHW (rank 4)");
    dense_a_factor(exec, layer, x, out, update);
    slot.rows = static_cast<int>(x.extent(0));
  } else if constexpr (compat::view_rank<XView>() == 4) {
    if (layer.kind() != LayerKind::conv2d)
      kdist::impl::throw_invalid("kdist::kfac::on_forward", "activations " + kdist::impl::describe(x) +
                                                                " are rank 4, " + layer.describe() +
                                                                " takes rows x inputs (rank 2)");
    conv2d_a_factor(exec, layer, x, out, factor_ws_, update);
    slot.rows = static_cast<int>(x.extent(0));
    slot.spatial = layer.out_h(static_cast<int>(x.extent(2))) * layer.out_w(static_cast<int>(x.extent(3)));
  } else {
    static_assert(compat::view_rank<XView>() == 2 || compat::view_rank<XView>() == 4,
                  "kdist::kfac::on_forward: activations are rank 2 (Dense) or rank 4 NCHW (Conv2d)");
  }
}

template <class T, class M>
template <class YView>
void Preconditioner<T, M>::compute_g(const execution_space& exec, int l, const YView& dy, const Matrix& out,
                                     const FactorUpdate& update) {
  const LayerSlot& slot = layer_slot(l);
  const Layer& layer = slot.layer;
  if (static_cast<int>(dy.extent(0)) != slot.rows)
    kdist::impl::throw_invalid("kdist::kfac::on_backward", "output gradients " + kdist::impl::describe(dy) + " have " +
                                                               std::to_string(dy.extent(0)) +
                                                               " rows/samples, on_forward had " +
                                                               std::to_string(slot.rows));
  if constexpr (compat::view_rank<YView>() == 2) {
    if (layer.kind() != LayerKind::dense)
      kdist::impl::throw_invalid("kdist::kfac::on_backward", "output gradients " + kdist::impl::describe(dy) +
                                                                 " are rank 2, " + layer.describe() +
                                                                 " takes NCHW (rank 4)");
    dense_g_factor(exec, layer, dy, out, update);
  } else if constexpr (compat::view_rank<YView>() == 4) {
    if (layer.kind() != LayerKind::conv2d)
      kdist::impl::throw_invalid("kdist::kfac::on_backward", "output gradients " + kdist::impl::describe(dy) +
                                                                 " are rank 4, " + layer.describe() +
                                                                 " takes rows x outputs (rank 2)");
    const long long spatial = static_cast<long long>(dy.extent(2)) * static_cast<long long>(dy.extent(3));
    if (spatial != slot.spatial)
      kdist::impl::throw_invalid("kdist::kfac::on_backward",
                                 "output gradients " + kdist::impl::describe(dy) + " have " + std::to_string(spatial) +
                                     " locations, the forward input gives " + std::to_string(slot.spatial));
    conv2d_g_factor(exec, layer, dy, out, factor_ws_, update);
  } else {
    static_assert(compat::view_rank<YView>() == 2 || compat::view_rank<YView>() == 4,
                  "kdist::kfac::on_backward: output gradients are rank 2 (Dense) or rank 4 NCHW (Conv2d)");
  }
}

}  // namespace kfac
}  // namespace kdist

// The non-template members: compiled into kdist_kfac for float and double on the memory spaces
// kfac/preconditioner.cpp lists (extern below), and available to any other instantiation.
#include <kdist/kfac/impl/precondition.hpp>
#include <kdist/kfac/impl/precondition_low_rank.hpp>
#include <kdist/kfac/impl/preconditioner_state.hpp>

namespace kdist {
namespace kfac {
#define KDIST_KFAC_EXTERN_PRECONDITIONER(T, M) extern template class Preconditioner<T, M>;
KDIST_KFAC_FOR_BUILT_SPACES(KDIST_KFAC_EXTERN_PRECONDITIONER)
#undef KDIST_KFAC_EXTERN_PRECONDITIONER
}  // namespace kfac
}  // namespace kdist
