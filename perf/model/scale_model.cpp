#include "scale_model.hpp"

#include <kdist/core/packed.hpp>
#include <kdist/kfac/precondition_split.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>

// The replay, phase by phase (t = 0 when forward starts; all ranks compute alike).
//
// Forward and backward. nn/ layers call on_forward before their forward and on_backward before
// their backward, so A_l is ready at sum_{k<l}(fa_k + f_k) + fa_l and G_l after the forward, the
// backward of the layers above l, and fg_l. T_b is the end of backward (hooks included). The hook
// times fa, fg are LayerTimes::hook_a/hook_g: pipelined hooks also pack (and, measured, progress).
//
// Factor all-reduce. The planner sees the tensors in reduction order with those ready times
// (pipelined) or all ready at once (not pipelined: step() hands them over together, so the
// measured ready times differ by pack times only). plan_finish_time gives the finish F of the last
// group when groups run back to back on one channel, each starting when its last tensor is ready.
//   pipelined:     factor_comm = max(0, F - T_b) + unpacking; the gradient all-reduce follows on the channel,
//                  so the time after T_b is max(F, T_b) - T_b + grad. (Submitted concurrently, as in
//                  bench_kfac, the two share the link and end at about the same time.)
//   not pipelined: grad after T_b, then factor_comm = packing + F (every ready time 0) + unpacking.
//
// Inverses, as kfac::Preconditioner::update_inverses runs them: every rank walks the CT factors in
// kfac::broadcast_order; the owner inverts and packs each, and every rank then posts its broadcast.
// So rank r posts factor f once it has done its own CT work before f (the owner: including f), and
// a broadcast, a collective, moves only when every rank has posted it (nothing runs MPI in the
// background, and a large broadcast needs the receiver's handshake): it starts at
// max(channel free, every rank's CT work up to f). NCT factors follow on every rank. Then each rank
// waits the broadcasts in the same order and unpacks every factor it did not own after its wait:
// t = max(t, end of broadcast k) + unpack. Inverse and broadcast costs are the placement's own
// inverse_s and broadcast_s (so the model and kfac::place agree), packing and unpacking the profile's.
// The packing after each CT inverse is in no phase the bench reports (it is in total).
//
// Preconditioning. Split as kfac::precondition_split decides per layer: rank 0 computes the
// first w of the layer's outputs (w = ceil(g/P)) or inputs (w = ceil(a/P)); both products scale
// with that count, so it spends min(n, w)/n of the layer's time (n = g or a). Split over inputs,
// the gathered row blocks are copied into Vᵀ once more, costed as one of the layer's three passes
// over the gradient (precondition_copy / 3: gather, clip, scatter). The all-gathers (every
// layer's in flight together) are modelled as all-reduces of half the gathered bytes, one per
// layer: a ring all-gather moves (P-1)/P n per rank, a ring all-reduce 2(P-1)/P n, and each call
// still pays the start-up alpha. No all-gather is calibrated, hence the approximation;
// bench_kfac's precond column is what validates it.

namespace kdist_perf {
namespace {

using kdist::comm::FusionTensor;

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("kdist_perf::predict: " + what);
}

void check_layers(const std::vector<LayerTimes>& layers) {
  require(!layers.empty(), "the layer list is empty");
  for (const LayerTimes& l : layers) {
    for (double t : {l.pack_a, l.pack_g, l.unpack_a, l.unpack_g, l.factor_a_pipelined, l.factor_g_pipelined,
                     l.forward_pipelined, l.backward_pipelined})
      require(std::isfinite(t) && t >= 0, "layer " + l.label + " has a packing time " + std::to_string(t));
    require(l.a_dim >= 1 && l.g_dim >= 1,
            "layer " + l.label + " has dimensions " + std::to_string(l.a_dim) + " x " + std::to_string(l.g_dim));
    for (double t : {l.forward, l.backward, l.factor_a, l.factor_g, l.precondition, l.precondition_copy})
      require(std::isfinite(t) && t >= 0, "layer " + l.label + " has a time " + std::to_string(t));
  }
}

double end_of_backward(const std::vector<LayerTimes>& layers, bool pipelined) {
  double t = 0;
  for (const LayerTimes& l : layers)
    t += l.hook_a(pipelined) + l.fwd(pipelined) + l.hook_g(pipelined) + l.bwd(pipelined);
  return t;
}

// Factor f in reduction and placement order, A_0 .. A_{L-1} then G_{L-1} .. G_0 (the Preconditioner's).
struct Factor {
  std::size_t layer;
  bool is_a;
  int dim(const std::vector<LayerTimes>& layers) const { return is_a ? layers[layer].a_dim : layers[layer].g_dim; }
};
Factor factor(std::size_t layers, std::size_t f) {
  return f < layers ? Factor{f, true} : Factor{2 * layers - 1 - f, false};
}

// CT broadcasts in kfac::broadcast_order (the Preconditioner's), then each rank's finish.
struct InversePhase {
  double rank0_compute = 0, rank0_end = 0, end = 0;
};

// pack[f], unpack[f]: copying factor f's inverse into its broadcast buffer and out of it.
InversePhase inverse_phase(const kdist::kfac::Placement& p, const std::vector<double>& pack,
                           const std::vector<double>& unpack) {
  const auto P = static_cast<std::size_t>(p.ranks);
  double nct = 0;
  for (std::size_t f = 0; f < p.owner.size(); ++f)
    if (p.owner[f] < 0) nct += p.inverse_s[f];
  std::vector<double> work(P, 0.0), inverted(P, 0.0);  // CT work so far (inverse + pack), inverses alone
  const std::vector<int> order = kdist::kfac::broadcast_order(p);
  std::vector<double> sent;  // when each broadcast of `order` ends
  double channel = 0;
  for (int f : order) {
    const auto i = static_cast<std::size_t>(f), o = static_cast<std::size_t>(p.owner[i]);
    work[o] += p.inverse_s[i] + pack[i];
    inverted[o] += p.inverse_s[i];
    channel = std::max(channel, *std::max_element(work.begin(), work.end())) + p.broadcast_s[i];
    sent.push_back(channel);
  }
  InversePhase phase;
  for (std::size_t r = 0; r < P; ++r) {
    double t = work[r] + nct;
    for (std::size_t k = 0; k < order.size(); ++k) {
      const auto f = static_cast<std::size_t>(order[k]);
      t = std::max(t, sent[k]) + (static_cast<std::size_t>(p.owner[f]) == r ? 0.0 : unpack[f]);
    }
    phase.end = std::max(phase.end, t);
    if (r == 0) {
      phase.rank0_compute = inverted[r] + nct;
      phase.rank0_end = phase.rank0_compute + (t - work[r] - nct);
    }
  }
  return phase;
}

double precondition_time(const std::vector<LayerTimes>& layers, const Scenario& s,
                         const kdist::comm::CostFunction& allreduce, std::size_t element_bytes) {
  double t = 0;
  for (const LayerTimes& l : layers) {
    t += l.precondition_copy;
    if (!s.split_preconditioning || s.ranks == 1) {
      t += l.precondition;
      continue;
    }
    const kdist::kfac::PreconditionSplit split = kdist::kfac::precondition_split(l.a_dim, l.g_dim, s.ranks);
    const bool by_inputs = split.axis == kdist::kfac::SplitAxis::inputs;
    const int n = by_inputs ? l.a_dim : l.g_dim, other = by_inputs ? l.g_dim : l.a_dim, w = split.block;
    t += l.precondition * std::min(n, w) / n;
    if (by_inputs) t += l.precondition_copy / 3;
    const double gathered = static_cast<double>(other) * w * s.ranks * static_cast<double>(element_bytes);
    t += allreduce(gathered / 2);
  }
  return t;
}

}  // namespace

std::vector<FusionTensor> factor_tensors(const std::vector<LayerTimes>& layers, std::size_t element_bytes,
                                         bool pipelined) {
  const std::size_t L = layers.size();
  std::vector<double> ready(2 * L, 0.0);
  double t = 0;
  for (std::size_t l = 0; l < L; ++l) {
    t += layers[l].hook_a(true);
    ready[l] = t;
    t += layers[l].fwd(true);
  }
  for (std::size_t l = L; l-- > 0;) {
    t += layers[l].hook_g(true);
    ready[2 * L - 1 - l] = t;
    t += layers[l].bwd(true);
  }
  std::vector<FusionTensor> tensors;
  for (std::size_t f = 0; f < 2 * L; ++f) {
    const auto d = static_cast<std::size_t>(factor(L, f).dim(layers));
    tensors.push_back({kdist::packed_size(d) * element_bytes, pipelined ? ready[f] : 0.0});
  }
  return tensors;
}

std::vector<kdist::kfac::PlacementItem> placement_items(const std::vector<LayerTimes>& layers) {
  const std::size_t L = layers.size();
  std::vector<kdist::kfac::PlacementItem> items;
  for (std::size_t f = 0; f < 2 * L; ++f) {
    const Factor x = factor(L, f);
    items.push_back({std::string(x.is_a ? "A" : "G") + std::to_string(x.layer), x.dim(layers)});
  }
  return items;
}

Prediction predict(const std::vector<LayerTimes>& layers, const CommModels& models, const Scenario& s,
                   const CommModels* actual) {
  require(s.ranks >= 1, "ranks = " + std::to_string(s.ranks) + " (must be >= 1)");
  check_layers(layers);
  const bool alone = s.ranks == 1;
  auto cost_of = [alone](const kdist::CostModel& m) {
    return kdist::comm::CostFunction([m, alone](double bytes) { return alone ? 0.0 : m.time(bytes); });
  };
  const kdist::comm::CostFunction planning = cost_of(models.allreduce);
  const kdist::comm::CostFunction allreduce = cost_of(actual ? actual->allreduce : models.allreduce);
  const std::size_t eb = models.placement.element_bytes;

  Prediction p;
  Breakdown& b = p.phases;
  const bool pipelined = s.switches.pipelined;
  double pack = 0, unpack = 0;
  for (const LayerTimes& l : layers) {
    b.fwd_bwd += l.fwd(pipelined) + l.bwd(pipelined);
    b.factors += l.hook_a(pipelined) + l.hook_g(pipelined);
    pack += l.pack_a + l.pack_g;
    unpack += l.unpack_a + l.unpack_g;
  }
  const double T_b = end_of_backward(layers, pipelined);

  kdist::comm::PlannerOptions planner;
  planner.planner = s.switches.planner;
  planner.threshold_bytes = s.threshold_bytes;
  const auto timed = factor_tensors(layers, eb, true), at_once = factor_tensors(layers, eb, false);
  const auto& input = pipelined ? timed : at_once;
  p.factor_plan = kdist::comm::make_plan(input, planning, planner);
  const double finish = kdist::comm::plan_finish_time(input, p.factor_plan, allreduce);
  p.factor_comm_unpipelined =
      pack + kdist::comm::plan_finish_time(at_once, kdist::comm::make_plan(at_once, planning, planner), allreduce) +
      unpack;
  p.factor_comm_bound = std::max(0.0, kdist::comm::finish_time_lower_bound(timed, allreduce) - T_b);
  b.factor_comm = (pipelined ? std::max(0.0, finish - T_b) : pack + finish) + unpack;

  std::vector<FusionTensor> grads;
  for (const LayerTimes& l : layers) grads.push_back({l.gradient_elements * eb, 0.0});
  kdist::comm::PlannerOptions grad_planner;
  grad_planner.planner = s.gradient_planner;
  grad_planner.threshold_bytes = s.threshold_bytes;
  b.grad_comm = kdist::comm::plan_finish_time(grads, kdist::comm::make_plan(grads, planning, grad_planner), allreduce);

  p.placement = kdist::kfac::place(placement_items(layers), models.placement, s.ranks, s.switches.placement);
  std::vector<double> pack_inverse, unpack_inverse;  // per factor, in placement order
  for (std::size_t f = 0; f < p.placement.owner.size(); ++f) {
    const Factor x = factor(layers.size(), f);
    const LayerTimes& l = layers[x.layer];
    pack_inverse.push_back(x.is_a ? l.pack_a : l.pack_g);
    unpack_inverse.push_back(x.is_a ? l.unpack_a : l.unpack_g);
    if (!actual) continue;
    p.placement.inverse_s[f] = actual->placement.inverse_time(x.dim(layers));
    p.placement.broadcast_s[f] = actual->placement.broadcast_time(x.dim(layers));
  }
  if (alone) std::fill(p.placement.broadcast_s.begin(), p.placement.broadcast_s.end(), 0.0);
  const InversePhase inv = inverse_phase(p.placement, pack_inverse, unpack_inverse);
  b.inverses = inv.rank0_compute;
  b.inverse_comm = inv.rank0_end - inv.rank0_compute;
  p.inverse_phase = inv.end;

  b.precondition = precondition_time(layers, s, allreduce, eb);
  b.total = T_b + b.grad_comm + b.factor_comm + inv.end + b.precondition;
  return p;
}

}  // namespace kdist_perf
