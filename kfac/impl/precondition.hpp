// Preconditioner, continued: construction, step() and its stages (factor all-reduce, inverses
// driven by the placement, preconditioning with the KL clip), re-planning. Included by
// kfac/preconditioner.hpp only; compiled into kdist_kfac by kfac/preconditioner.cpp.
#pragma once

#include <algorithm>
#include <cmath>

namespace kdist {
namespace kfac {

// ---- construction -------------------------------------------------------------------------

template <class T, class M>
Preconditioner<T, M>::Preconditioner(comm::Engine& engine, std::vector<Layer> layers, Options options)
    : engine_(engine), options_(std::move(options)), order_(static_cast<int>(layers.size()), engine_.rank()) {
  options_.validate();
  if (layers.empty()) kdist::impl::throw_invalid("kdist::kfac::Preconditioner", "no layers");
  switches_ = resolve(options_);
  if (!options_.cost_models.empty()) models_ = CostModelStore::load(options_.cost_models);
  const int P = engine_.size(), L = static_cast<int>(layers.size());
  for (Layer& given : layers)
    layer_slots_.push_back(LayerSlot{std::move(given), {}, {}, {}, {}, {}, 0, 0, {}, {}, {}, 0, false, 0});
  std::vector<PlacementItem> items;
  std::vector<typename Fused::Tensor> tensors;
  const std::vector<bool> forms = cholesky_forms();
  for (int f = 0; f < 2 * L; ++f) {
    const bool is_a = f < L;
    const Layer& owner = layer(is_a ? f : 2 * L - 1 - f);
    const int d = is_a ? owner.a_dim() : owner.g_dim();
    FactorSlot slot;
    slot.label = std::string(is_a ? "A" : "G") + std::to_string(is_a ? f : 2 * L - 1 - f);
    slot.running = Matrix("kdist::kfac::" + slot.label, d, d);
    slot.pending = Matrix("kdist::kfac::pending_" + slot.label, d, d);
    slot.inverse = Matrix("kdist::kfac::inverse_" + slot.label, d, d);
    slot.cholesky = forms[static_cast<std::size_t>(f)];
    impl::fill_identity(execution_space(), slot.running);
    items.push_back({slot.label, d, slot.cholesky ? kCholeskyFactorWork : 1.0});
    tensors.push_back({slot.label, static_cast<std::size_t>(d), true, true});  // kdist reads the upper triangle
    factor_slots_.push_back(std::move(slot));
  }
  placement_ = place(items, PlacementModels::from_store(models_, dtype_of<T>(), P), P, switches_.placement);
  for (int f = 0; f < factors(); ++f) {
    FactorSlot& slot = factor_slot(f);
    if (placement_.owner[static_cast<std::size_t>(f)] >= 0)
      slot.packed = Vector("kdist::kfac::packed_" + slot.label, packed_size(slot.running.extent(0)));
  }
  fused_ = std::make_unique<Fused>(engine_, tensors, Fused::average());
  for (int l = 0; l < L; ++l) {
    LayerSlot& slot = layer_slot(l);
    const int a = slot.layer.a_dim(), g = slot.layer.g_dim();
    slot.gradient = Matrix("kdist::kfac::gradient", a, g);
    slot.split = precondition_split(a, g, P);
    const int w = slot.split.block;
    if (!split()) {
      slot.result = Matrix("kdist::kfac::preconditioned", a, g);
    } else if (slot.split.axis == SplitAxis::outputs) {  // gathered straight into the padded result
      slot.result = Matrix("kdist::kfac::preconditioned", a, P * w);
      slot.block = Matrix("kdist::kfac::preconditioned_block", a, w);
    } else {  // gathered apart, then un-blocked into the result
      slot.result = Matrix("kdist::kfac::preconditioned", a, g);
      slot.block = Matrix("kdist::kfac::preconditioned_block", w, g);
      slot.gathered = Vector("kdist::kfac::preconditioned_blocks", static_cast<std::size_t>(P) * w * g);
    }
  }
  replan_after_ = options_.profile_steps;
  Kokkos::fence();
}

// A factor can be kept as its Cholesky factor R where the preconditioning applies its inverse to
// whole columns (precondition, precondition_block): A unless the layer is split over inputs (then
// each rank multiplies by a column block of A^-1), G unless it is split over outputs. Applied to
// k columns: A to the gradient's g (unsplit) or this rank's block of outputs, from the left; G to
// its a rows or this rank's block of inputs, from the right. Every rank lists the same cases (the
// block width, not this rank's share of it), as choose_cholesky's all-reduce needs.
template <class T, class M>
std::vector<bool> Preconditioner<T, M>::cholesky_forms() {
  const int L = layers(), P = engine_.size();
  std::vector<bool> forms(static_cast<std::size_t>(2 * L), false);
  if (options_.cholesky_solves == CholeskySolves::never || options_.inverse_method != InverseMethod::cholesky)
    return forms;
  std::vector<int> candidates;
  std::vector<impl::SolveCase> cases;
  for (int f = 0; f < 2 * L; ++f) {
    const bool is_a = f < L;
    const Layer& owner = layer(is_a ? f : 2 * L - 1 - f);
    const int a = owner.a_dim(), g = owner.g_dim();
    const PreconditionSplit s = precondition_split(a, g, P);
    if (split() && (s.axis == SplitAxis::outputs) != is_a) continue;
    candidates.push_back(f);
    cases.push_back(is_a ? impl::SolveCase{a, split() ? s.block : g, true}
                         : impl::SolveCase{g, split() ? s.block : a, false});
  }
  std::vector<bool> keep(cases.size(), true);
  if (options_.cholesky_solves == CholeskySolves::measured && !cases.empty())
    keep = impl::choose_cholesky<T, M>(engine_, execution_space(), cases, options_.inverse_every);
  for (std::size_t i = 0; i < cases.size(); ++i) forms[static_cast<std::size_t>(candidates[i])] = keep[i];
  return forms;
}

// The running factors are kept as upper triangles (everything that reads them, the next blend,
// the fusion's packing and the inverses, reads no more), so a caller gets a mirrored copy.
template <class T, class M>
typename Preconditioner<T, M>::Matrix Preconditioner<T, M>::factor(int f) const {
  const FactorSlot& slot = checked_slot("kdist::kfac::Preconditioner::factor", f);
  const Matrix& running = slot.running;
  Matrix full(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdist::kfac::factor_" + slot.label), running.extent(0),
              running.extent(1));
  const execution_space exec;
  Kokkos::deep_copy(exec, full, running);
  mirror_upper_to_lower(exec, full);
  compat::fence(exec, "kdist::kfac::Preconditioner::factor");
  return full;
}

template <class T, class M>
void Preconditioner<T, M>::set_learning_rate(double lr) {
  Options o = options_;
  o.lr = lr;
  o.validate();
  options_.lr = lr;
}

template <class T, class M>
typename Preconditioner<T, M>::Matrix Preconditioner<T, M>::scratch_matrix(int rows, int cols) {
  const std::size_t need = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  if (scratch_.extent(0) < need)
    scratch_ = Vector(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdist::kfac::scratch"), need);
  return Matrix(scratch_.data(), rows, cols);
}

// On a host space this is nothing; on a GPU it is one more synchronisation per hook (a few µs),
// which moves the wait for the layer's queued kernels out of factor_compute (and the trace's
// "kfac factors" track) into the caller's own phase: without it a hook's time held the whole
// forward or backward work queued before it, since the hook is the first thing to synchronise.
template <class T, class M>
void Preconditioner<T, M>::wait_for_queued_work(const execution_space& exec) {
  compat::fence(exec, "kdist::kfac: the layer's queued work, before its factor");
}

template <class T, class M>
double Preconditioner<T, M>::phase_end(const execution_space& exec, double t0) const {
  compat::fence(exec, "kdist::kfac: phase end");
  return Clock::local_now() - t0;
}

// A factor step blends the batch's factor F into `pending` (never into `running`) inside the
// one syrk: pending's upper triangle starts as running's, then becomes xi running + (1 - xi) F.
// The lower triangle is left stale, and stays so: the fusion packs the upper one and scatters the
// reduced factor back into it alone (upper_only), and every reader of the factors reads no more.
template <class T, class M>
const typename Preconditioner<T, M>::Matrix& Preconditioner<T, M>::start_factor(const execution_space& exec, int f) {
  const FactorSlot& slot = factor_slot(f);
  impl::copy_upper(exec, slot.pending, slot.running);
  return slot.pending;
}

// F's diagonal holds sums of squares of every input value, so a NaN or Inf anywhere in the batch
// (or an overflow) shows on the blend's diagonal (running is finite): a d-element check, not a
// pass over the batch.
template <class T, class M>
void Preconditioner<T, M>::accept_factor(const execution_space& exec, int f, int l) {
  const FactorSlot& slot = factor_slot(f);
  const int d = static_cast<int>(slot.pending.extent(0));
  const int bad = impl::count_nonfinite_diagonal(exec, slot.pending);
  if (bad > 0) {
    const bool is_a = f < layers();
    raise(NonFiniteError(
        is_a ? "kdist::kfac::on_forward" : "kdist::kfac::on_backward",
        std::string(is_a ? "activations" : "output gradients") + " of layer " + std::to_string(l) + " " +
            layer(l).describe(),
        static_cast<long long>(d), engine_.rank(),
        std::to_string(bad) + " of the factor's " + std::to_string(d) + " diagonal entries are not finite"));
  }
  if (switches_.pipelined && syncs_factors()) fused_->ready(exec, f, slot.pending);
}

// ---- step ---------------------------------------------------------------------------------

template <class T, class M>
void Preconditioner<T, M>::step(const execution_space& exec, const std::vector<Gradient>& gradients) {
  if (gradients.size() != layer_slots_.size())
    raise(InvalidArgument("kdist::kfac::step: " + std::to_string(gradients.size()) + " gradients for " +
                          std::to_string(layers()) + " layers (rank " + std::to_string(engine_.rank()) + ")"));
  require(order_.check_step());
  for (int l = 0; l < layers(); ++l) require(check_gradient(l, gradients[static_cast<std::size_t>(l)]));
  const bool factor_step = this->factor_step(), inverse_step = this->inverse_step();
  const bool sync = factor_step && syncs_factors();
  if (sync) reduce_factors(exec);
  if (factor_step) swap_running_and_pending();
  const bool were_local = factors_local_;
  if (factor_step) factors_local_ = !sync;  // a sync averages pending, local terms and all
  try {
    // An inverse step that makes no factor (inverse_every not a multiple of factor_every) syncs
    // the running factors themselves; if the step then fails, they stay averaged, which is the
    // factor this step would have inverted.
    if (inverse_step && factors_local_) reduce_factors(exec, true);
    if (inverse_step) update_inverses(exec);
    precondition(exec, gradients);
  } catch (...) {  // the last completed step's factors; inverses half made are made again next time
    if (factor_step) {
      swap_running_and_pending();
      factors_local_ = were_local;
    }
    if (inverse_step) have_inverses_ = false;
    fail_and_rethrow();  // e.g. std::bad_alloc: the peers would wait for this rank's broadcasts
  }
  if (inverse_step) {
    have_inverses_ = true;
    ++stats_.inverse_steps;
  }
  if (factor_step) {
    ++factor_steps_;
    ++stats_.factor_steps;
  }
  ++step_;
  ++stats_.steps;
  order_.start_step();
  // Collective, after the step is whole: a failure here (a peer's) leaves a completed step. The
  // plan is made from the ready times of synced steps.
  if (sync) maybe_replan();
}

template <class T, class M>
void Preconditioner<T, M>::swap_running_and_pending() {
  for (FactorSlot& slot : factor_slots_) std::swap(slot.running, slot.pending);
}

template <class T, class M>
std::string Preconditioner<T, M>::check_gradient(int l, const Gradient& g) const {
  const Layer& layer = this->layer(l);
  const bool weight_ok =
      static_cast<int>(g.weight.extent(0)) == layer.outputs() && static_cast<int>(g.weight.extent(1)) == layer.inputs();
  const bool bias_ok = layer.bias() ? static_cast<int>(g.bias.extent(0)) == layer.outputs() : g.bias.extent(0) == 0;
  if (weight_ok && bias_ok) return {};
  return "kdist::kfac::step: layer " + std::to_string(l) + " " + layer.describe() + " takes a weight gradient " +
         std::to_string(layer.outputs()) + " x " + std::to_string(layer.inputs()) +
         (layer.bias() ? " and a bias gradient of " + std::to_string(layer.outputs()) : std::string(" and no bias")) +
         ", got " + kdist::impl::describe(g.weight) +
         (g.bias.extent(0) ? " and " + kdist::impl::describe(g.bias) : std::string()) + " (rank " +
         std::to_string(engine_.rank()) + ")";
}

template <class T, class M>
void Preconditioner<T, M>::reduce_factors(const execution_space& exec, bool of_running) {
  Phase phase("kdist::kfac::factor all-reduce (exposed)", options_.timeline, "kfac communication");
  const double t0 = Clock::local_now();
  if (of_running || !switches_.pipelined) {
    fused_->begin();
    for (int f = 0; f < factors(); ++f)
      fused_->ready(exec, f, of_running ? factor_slot(f).running : factor_slot(f).pending);
  }
  fused_->wait(exec);
  if (of_running) factors_local_ = false;
  ++stats_.factor_syncs;
  stats_.factor_comm_exposed += phase_end(exec, t0);
}

template <class T, class M>
void Preconditioner<T, M>::sync_factors(const execution_space& exec) {
  require_between_steps("sync_factors");
  if (factors_local_) reduce_factors(exec, true);
}

template <class T, class M>
void Preconditioner<T, M>::invert(const execution_space& exec, int f) {
  Phase phase("kdist::kfac::inverse", options_.timeline, "kfac inverses");
  const double t0 = Clock::local_now();
  FactorSlot& slot = factor_slot(f);
  try {
    if (slot.cholesky)
      cholesky_factor(exec, slot.running, options_.damping, slot.inverse, inverse_ws_);
    else
      spd_inverse(exec, slot.running, options_.damping, slot.inverse, inverse_ws_, options_.inverse_method);
  } catch (const NumericalError& e) {
    raise(NumericalError(
        e.operation() + " on K-FAC factor " + slot.label + " (rank " + std::to_string(engine_.rank()) + ")", e.dim(),
        e.damping(), e.info(), e.reason()));
  } catch (const InvalidArgument& e) {  // e.g. a workspace past LAPACK's int: on a CT owner alone
    raise(InvalidArgument(std::string(e.what()) + " (K-FAC factor " + slot.label + ", rank " +
                          std::to_string(engine_.rank()) + ")"));
  }
  stats_.inverse_compute += phase_end(exec, t0);
}

// The stage is this rank's kfac::inverse_tasks: CT factors in broadcast order (every rank submits
// the broadcasts in that one order, which the Engine keeps; an owner inverts each while its
// previous broadcast is in flight), then NCT factors locally; then the broadcasts land.
template <class T, class M>
void Preconditioner<T, M>::update_inverses(const execution_space& exec) {
  using Kind = InverseTask::Kind;
  const std::vector<InverseTask> tasks = inverse_tasks(placement_, engine_.rank());
  std::vector<std::pair<int, comm::Request>> broadcasts;  // factor, request
  for (const InverseTask& task : tasks) {
    FactorSlot& slot = factor_slot(task.factor);
    if (task.kind == Kind::invert_local || task.kind == Kind::invert_and_broadcast) invert(exec, task.factor);
    if (task.kind == Kind::invert_and_broadcast) pack_upper(exec, slot.inverse, slot.packed);
    if (task.kind != Kind::invert_local)
      broadcasts.emplace_back(task.factor,
                              engine_.broadcast(exec, slot.packed, task.root, "kfac inverse " + slot.label));
    engine_.progress();
  }
  Phase phase("kdist::kfac::inverse broadcast (exposed)", options_.timeline, "kfac communication");
  const double t0 = Clock::local_now();
  for (auto& [f, request] : broadcasts) {
    request.wait();
    if (placement_.owner[static_cast<std::size_t>(f)] != engine_.rank())
      unpack_upper(exec, factor_slot(f).packed, factor_slot(f).inverse);
  }
  stats_.inverse_comm_exposed += phase_end(exec, t0);
}

// ---- preconditioning ----------------------------------------------------------------------

// V_l = G_l^-1 [dW_l | db_l] A_l^-1 for every layer, computed as its transpose
// V_lᵀ = A_l^-1 [dW_l | db_l]ᵀ G_l^-1 (the factors are symmetric): the row-major weight gradient
// read along memory is the column-major transpose, so the copies in and out move rows, where the
// untransposed form had them transpose (split: this rank's block of the layer's outputs or inputs,
// kfac/precondition_split.hpp; the all-gathers of every layer in flight together), then
// nu = min(1, sqrt(kl_clip / |s|)) with
// s = lr^2 sum_l sum_ij V_l . [dW_l | db_l] (kfac-pytorch's and SPD-KFAC's clip), and the
// caller's gradients become nu V. Nothing is written back until every layer's V is finite. With
// averaged gradients every rank holds the same V after the gathers and reaches the same verdict;
// with per-rank gradients a rank whose V is not finite fails the Engine, and the others learn it at
// their next wait.
template <class T, class M>
void Preconditioner<T, M>::precondition(const execution_space& exec, const std::vector<Gradient>& gradients) {
  Phase phase("kdist::kfac::precondition", options_.timeline, "kfac precondition");
  const double t0 = Clock::local_now();
  std::vector<comm::Request> gathers;
  for (int l = 0; l < layers(); ++l) {
    const Gradient& g = gradients[static_cast<std::size_t>(l)];
    impl::gather_gradient(exec, layer_slot(l).gradient, g.weight, g.bias, layer(l).bias());
  }
  choose_low_rank(exec);
  for (int l = 0; l < layers(); ++l) {
    const LayerSlot& slot = layer_slot(l);
    if (slot.from_batch) {
      gathers.push_back(precondition_from_batch(exec, l));
      continue;
    }
    if (split()) {
      gathers.push_back(precondition_block(exec, l));
      continue;
    }
    // R := Wᵀ G^-1, then Vᵀ := A^-1 R; R is Vᵀ itself where A is kept as R_A (solved in place),
    // else the scratch. With cholesky_solves both factors are kept so here (nothing is split).
    const FactorSlot &A = factor_slot(a_index(l)), &G = factor_slot(g_index(l));
    const Matrix out = preconditioned(l);
    const Matrix R = A.cholesky ? out : scratch_matrix(slot.layer.a_dim(), slot.layer.outputs());
    if (G.cholesky) {
      Kokkos::deep_copy(exec, R, slot.gradient);
      cholesky_solve_right(exec, R, G.inverse);
    } else {
      gemm(exec, "N", "N", T(1), slot.gradient, G.inverse, T(0), R);
    }
    if (A.cholesky)
      cholesky_solve_left(exec, A.inverse, R);
    else
      gemm(exec, "N", "N", T(1), A.inverse, R, T(0), out);
  }
  for (comm::Request& r : gathers) r.wait();
  for (int l = 0; l < layers() && split(); ++l) {
    const LayerSlot& slot = layer_slot(l);
    if (slot.split.axis == SplitAxis::inputs && !slot.from_batch)
      impl::unblock_rows(exec, slot.gathered, slot.split.block, slot.result);
  }
  double total = 0;
  for (int l = 0; l < layers(); ++l) {
    const Matrix& W = layer_slot(l).gradient;
    const double dot = impl::inner(exec, preconditioned(l), W);
    if (!std::isfinite(dot))
      raise(NonFiniteError("kdist::kfac::step", "gradient of layer " + std::to_string(l) + " " + layer(l).describe(),
                           static_cast<long long>(W.size()), engine_.rank(),
                           "the preconditioned gradient's inner product with the gradient is " + std::to_string(dot)));
    total += dot;
  }
  const double s = std::abs(total) * options_.lr * options_.lr;
  const T nu = static_cast<T>(options_.kl_clip > 0 && s > 0 ? std::min(1.0, std::sqrt(options_.kl_clip / s)) : 1.0);
  for (int l = 0; l < layers(); ++l) {
    const Gradient& g = gradients[static_cast<std::size_t>(l)];
    impl::scatter_gradient(exec, g.weight, g.bias, preconditioned(l), nu, layer(l).bias());
  }
  last_clip_ = static_cast<double>(nu);
  stats_.precondition += phase_end(exec, t0);
}

// This rank's block of layer l's Vᵀ (kfac/precondition_split.hpp), then the all-gather of every
// rank's block. Over outputs, columns [b0, b1): A^-1 (Wᵀ G^-1[:, b0:b1]), gathered straight into
// the result (columns padded to size x block). Over inputs, rows [b0, b1): ((A^-1[:, b0:b1])ᵀ Wᵀ)
// G^-1 (A^-1 is symmetric), stored (b1 - b0) x g from the block's start and gathered into
// `gathered`; unblock_rows makes Vᵀ of them. A rank past the last column or row sends its block
// unused.
template <class T, class M>
comm::Request Preconditioner<T, M>::precondition_block(const execution_space& exec, int l) {
  const LayerSlot& slot = layer_slot(l);
  const bool by_inputs = slot.split.axis == SplitAxis::inputs;
  const int a = slot.layer.a_dim(), g = slot.layer.g_dim(), width = slot.split.block;
  const int extent = by_inputs ? a : g, b0 = std::min(extent, engine_.rank() * width),
            b1 = std::min(extent, b0 + width);
  const FactorSlot &A = factor_slot(a_index(l)), &G = factor_slot(g_index(l));
  const auto block = std::make_pair(b0, b1);
  if (b1 > b0 && by_inputs) {  // A^-1's columns are needed here: A is an inverse, G may be R
    const Matrix out(slot.block.data(), b1 - b0, g);
    const Matrix S = G.cholesky ? out : scratch_matrix(b1 - b0, g);
    gemm(exec, "T", "N", T(1), Kokkos::subview(A.inverse, Kokkos::ALL, block), slot.gradient, T(0), S);
    if (G.cholesky)
      cholesky_solve_right(exec, out, G.inverse);
    else
      gemm(exec, "N", "N", T(1), S, G.inverse, T(0), out);
  } else if (b1 > b0) {  // G^-1's columns are needed here: G is an inverse, A may be R
    const auto out = Kokkos::subview(slot.block, Kokkos::ALL, std::make_pair(0, b1 - b0));
    const Matrix R = A.cholesky ? Matrix(slot.block.data(), a, b1 - b0) : scratch_matrix(a, b1 - b0);
    gemm(exec, "N", "N", T(1), slot.gradient, Kokkos::subview(G.inverse, Kokkos::ALL, block), T(0), R);
    if (A.cholesky)
      cholesky_solve_left(exec, A.inverse, R);
    else
      gemm(exec, "N", "N", T(1), A.inverse, R, T(0), out);
  }
  return engine_.allgather(exec, Vector(slot.block.data(), slot.block.size()),
                           by_inputs ? slot.gathered : Vector(slot.result.data(), slot.result.size()),
                           "kfac preconditioned layer " + std::to_string(l));
}

template <class T, class M>
typename Preconditioner<T, M>::Matrix Preconditioner<T, M>::preconditioned(int l) const {
  return Kokkos::subview(layer_slot(l).result, Kokkos::ALL, std::make_pair(0, layer(l).g_dim()));
}

template <class T, class M>
void Preconditioner<T, M>::maybe_replan() {
  if (replan_after_ < 0 || factor_steps_ < replan_after_) return;
  const CostModel model = models_.get(CostKey{CostOp::allreduce, dtype_of<T>(), engine_.size(), "world"});
  comm::PlannerOptions planner;
  planner.planner = switches_.planner;
  planner.threshold_bytes = options_.threshold_bytes;
  fused_->replan([model](double bytes) { return model.time(bytes); }, planner);
  replan_after_ = -1;
}

}  // namespace kfac
}  // namespace kdist
