// Preconditioner, continued: the state (save/load, save_to/load_from) and describe(). Included
// by kfac/preconditioner.hpp only; compiled into kdist_kfac by kfac/preconditioner.cpp.
#pragma once

#include <kdist/core/atomic_file.hpp>

#include <algorithm>
#include <sstream>

namespace kdist {
namespace kfac {

// ---- state --------------------------------------------------------------------------------
// Every rank holds the whole state (the running factors are all-reduced, every inverse is
// computed or received everywhere), so rank 0 alone writes it. A state saved at this rank count
// brings its placement and fusion plan back, and the run continues bit for bit; one saved at
// another count keeps this run's placement, split and fusion plan (made for its own count at
// construction) and re-plans the fusion at its next factor step, as a fresh run would have.

template <class T, class M>
impl::StateShape Preconditioner<T, M>::state_shape() const {
  impl::StateShape shape;
  shape.dtype = dtype_of<T>();
  shape.ranks = engine_.size();
  for (const LayerSlot& slot : layer_slots_) shape.layers.push_back(slot.layer.describe());
  for (const FactorSlot& slot : factor_slots_) shape.dims.push_back(static_cast<int>(slot.running.extent(0)));
  return shape;
}

template <class T, class M>
std::vector<int> Preconditioner<T, M>::inverse_forms() const {
  std::vector<int> forms;
  for (const FactorSlot& slot : factor_slots_) forms.push_back(slot.cholesky ? 1 : 0);
  return forms;
}

// A state saved at another rank count (other splits) or with cholesky_solves switched may hold a
// factor's inverse where this run keeps its Cholesky factor R, or the reverse. Converted while the
// state is staged (a failure is then every rank's, before anything changed), on the host, to
// rounding, rather than made again: the next steps then use the saved inverses, as they would
// have, at any rank count. R to the inverse: the identity solved against R. The inverse to R:
// inverted back to F + damping I, then factored.
template <class T, class M>
int Preconditioner<T, M>::convert_inverse_forms(const std::vector<int>& saved,
                                                std::vector<typename Matrix::HostMirror>& inverses,
                                                const std::string& origin) const {
  using HostMatrix = typename Matrix::HostMirror;
  const Kokkos::DefaultHostExecutionSpace host;
  InverseWorkspace<T, Kokkos::HostSpace> workspace;
  int converted = 0;
  for (int f = 0; f < factors(); ++f) {
    const FactorSlot& slot = factor_slot(f);
    const bool was_cholesky = !saved.empty() && saved[static_cast<std::size_t>(f)] == 1;
    if (was_cholesky == slot.cholesky) continue;
    HostMatrix& kept = inverses[static_cast<std::size_t>(f)];
    const int d = static_cast<int>(kept.extent(0));
    HostMatrix other("kdist::kfac::converted_" + slot.label, d, d);  // zeros: fill_identity sets the diagonal
    try {
      if (was_cholesky) {
        impl::fill_identity(host, other);
        cholesky_solve_left(host, kept, other);
        mirror_upper_to_lower(host, other);
        kept = other;
      } else {
        spd_inverse(host, kept, 0.0, other, workspace);
        cholesky_factor(host, other, 0.0, kept, workspace);
      }
    } catch (const NumericalError& e) {
      throw NumericalError(e.operation() + " converting the saved " + (was_cholesky ? "Cholesky factor" : "inverse") +
                               " of K-FAC factor " + slot.label + " in " + origin + " (rank " +
                               std::to_string(engine_.rank()) + ")",
                           e.dim(), e.damping(), e.info(), e.reason());
    }
    ++converted;
  }
  host.fence();
  return converted;
}

template <class T, class M>
void Preconditioner<T, M>::save_to(StateWriter& out, const std::string& prefix) const {
  require_between_steps("save");
  // Every rank is in this state alike (it follows from the step count), so each refuses alone.
  if (factors_local_)
    kdist::impl::throw_invalid("kdist::kfac::Preconditioner::save_to",
                               "the running factors are rank-local at step " + std::to_string(step_) +
                                   " (factor_sync before-inverses): call sync_factors() on every rank first (rank " +
                                   std::to_string(engine_.rank()) + ")");
  impl::StateCounters counters;
  counters.step = step_;
  counters.factor_steps = factor_steps_;
  counters.replan_after = replan_after_;
  counters.have_inverses = have_inverses_;
  counters.owners = placement_.owner;
  counters.fusion_groups = fused_->plan().group_end;
  counters.options = impl::saved_options(options_);
  counters.switches = impl::switches_text(switches_);
  counters.inverse_method = to_string(options_.inverse_method);
  counters.inverse_forms = inverse_forms();
  impl::write_state_fields(out, prefix, state_shape(), counters);
  for (int f = 0; f < factors(); ++f)
    for (const bool inverse : {false, true}) {
      const auto host =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), inverse ? factor_slot(f).inverse : factor(f));
      out.add(prefix + (inverse ? "inverse." : "factor.") + factor_slot(f).label, host.data(), host.span());
    }
}

template <class T, class M>
typename Preconditioner<T, M>::Restore Preconditioner<T, M>::stage(const StateReader& in,
                                                                   const std::string& prefix) const {
  require_between_steps("load");
  Restore r;
  r.counters = impl::read_state_fields(in, prefix, state_shape());
  for (const FactorSlot& slot : factor_slots_)
    for (const bool inverse : {false, true}) {
      auto host = Kokkos::create_mirror(Kokkos::HostSpace(), slot.running);  // a copy, even on the host
      in.read(prefix + (inverse ? "inverse." : "factor.") + slot.label, host.data(), host.span());
      (inverse ? r.inverses : r.factors).push_back(host);
    }
  r.origin = in.path();
  // This run's options apply: inverses made with another damping or method are made again at the
  // next step, as they would have been on a step divisible by inverse_every.
  r.keep_inverses = r.counters.have_inverses && !impl::inverses_differ(r.counters, options_);
  if (r.keep_inverses) r.converted = convert_inverse_forms(r.counters.inverse_forms, r.inverses, r.origin);
  return r;
}

template <class T, class M>
void Preconditioner<T, M>::commit(Restore&& r) {
  for (int f = 0; f < factors(); ++f) {
    Kokkos::deep_copy(factor_slot(f).running, r.factors[static_cast<std::size_t>(f)]);
    Kokkos::deep_copy(factor_slot(f).inverse, r.inverses[static_cast<std::size_t>(f)]);
  }
  const impl::StateCounters& c = r.counters;
  step_ = c.step;
  factor_steps_ = c.factor_steps;
  have_inverses_ = r.keep_inverses;
  factors_local_ = false;  // saved in sync (save() syncs first; save_to() refuses local ones)
  const int converted = r.converted;
  const std::string changed = impl::option_differences(c, options_);
  const std::string at = r.origin + " (step " + std::to_string(c.step) + ", saved at " + std::to_string(c.ranks) +
                         " rank(s)" + (changed.empty() ? "" : "; saved with " + changed) + ")" +
                         (c.have_inverses && !have_inverses_ ? ", its inverses made again at the next step" : "") +
                         (converted > 0 ? ", " + std::to_string(converted) +
                                              " inverse(s) converted to or from a Cholesky factor for this run"
                                        : "");
  if (c.ranks != engine_.size()) {
    replan_after_ = c.replan_after < 0 ? factor_steps_ : c.replan_after;
    restored_ = "restored from " + at + ": placement, preconditioning split and fusion plan made for " +
                std::to_string(engine_.size()) + " rank(s), the fusion re-planned at the next factor step";
    return;
  }
  const std::string switches = impl::switches_text(switches_);
  if (!c.switches.empty() && c.switches != switches) {  // another strategy: its plans are this run's
    replan_after_ = c.replan_after < 0 ? factor_steps_ : c.replan_after;
    restored_ = "restored from " + at + ", saved with " + c.switches + " (this run: " + switches +
                "): this run's placement and fusion plan, the fusion re-planned at the next factor step";
    return;
  }
  replan_after_ = c.replan_after;
  fused_->set_plan(comm::FusionPlan{c.fusion_groups});
  if (c.owners != placement_.owner) {
    placement_ = with_owners(placement_, c.owners);
    for (int f = 0; f < factors(); ++f) {  // a CT factor needs its packed broadcast buffer
      FactorSlot& slot = factor_slot(f);
      slot.packed = c.owners[static_cast<std::size_t>(f)] < 0
                        ? Vector()
                        : Vector("kdist::kfac::packed_" + slot.label, packed_size(slot.running.extent(0)));
    }
  }
  restored_ = "restored from " + at + ": its placement and fusion plan kept";
}

template <class T, class M>
void Preconditioner<T, M>::load_from(const StateReader& in, const std::string& prefix) {
  commit(stage(in, prefix));
}

template <class T, class M>
void Preconditioner<T, M>::save(const std::string& path) {
  require_between_steps("save");
  sync_factors(execution_space());
  comm::agree_on_outcome_of(engine_, "kdist::kfac::Preconditioner::save", [&] {
    if (engine_.rank() != 0) return;
    StateWriter out(kStateKind);
    save_to(out, "");
    out.write(path, "kdist::kfac::Preconditioner::save");
  });
}

template <class T, class M>
void Preconditioner<T, M>::load(const std::string& path) {
  require_between_steps("load");
  Restore staged;
  std::int64_t checksum = 0;
  comm::agree_on_outcome_of(engine_, "kdist::kfac::Preconditioner::load", [&] {
    const StateReader in(path, kStateKind, "kdist::kfac::Preconditioner::load");
    checksum = static_cast<std::int64_t>(in.checksum());
    staged = stage(in, "");
  });
  // Each rank read its own copy: a stale one on some node would precondition with other factors.
  comm::agree_on_value(engine_, checksum, "kdist::kfac::Preconditioner::load",
                       "K-FAC states (checksums of the files read)");
  commit(std::move(staged));
}

// ---- describe -----------------------------------------------------------------------------

template <class T, class M>
std::string Preconditioner<T, M>::describe() const {
  std::ostringstream os;
  os << "kdist K-FAC: strategy " << to_string(options_.strategy) << " (pipelined "
     << (switches_.pipelined ? "yes" : "no") << ", fusion planner " << comm::to_string(switches_.planner)
     << ", placement " << to_string(switches_.placement) << ", preconditioning "
     << (split()                                     ? "split over the ranks"
         : options_.gradients == Gradients::per_rank ? "on every rank, of its own gradient"
                                                     : "on every rank")
     << "), " << engine_.size() << " rank(s), " << to_string(dtype_of<T>()) << "\n  damping " << options_.damping
     << ", factor decay " << options_.factor_decay << ", factors every " << options_.factor_every << ", inverses every "
     << options_.inverse_every << " step(s), KL clip " << options_.kl_clip << " at lr " << options_.lr
     << ", inverse by " << (options_.inverse_method == InverseMethod::cholesky ? "Cholesky" : "eigendecomposition")
     << ", Cholesky solves " << to_string(options_.cholesky_solves) << ", factors all-reduced "
     << (options_.factor_sync == FactorSync::every_step ? "every factor step" : "before inverse steps only")
     << (options_.low_rank_dense ? ", Dense layers from their batch (low rank) where cheaper" : "")
     << "\n  cost models: " << (options_.cost_models.empty() ? std::string("stated defaults") : options_.cost_models)
     << "\n";
  if (!restored_.empty()) os << "  " << restored_ << "\n";
  for (int l = 0; l < layers(); ++l) {
    const PreconditionSplit& s = layer_slot(l).split;
    os << "  layer " << l << ": " << layer(l).describe() << ", A " << layer(l).a_dim() << "^2, G " << layer(l).g_dim()
       << "^2";
    if (split())
      os << ", preconditioned in blocks of " << s.block << (s.axis == SplitAxis::inputs ? " inputs" : " outputs");
    for (const int f : {a_index(l), g_index(l)})
      if (factor_slot(f).cholesky) os << ", " << factor_slot(f).label << " kept as its Cholesky factor";
    os << "\n";
  }
  std::vector<PlacementItem> items;
  for (const auto& t : fused_->tensors()) items.push_back({t.label, static_cast<int>(t.dim)});
  os << placement_.describe(items);
  os << "  fusion groups (factor reduction order A0.., G..0): " << fused_->plan().groups();
  return os.str();
}

}  // namespace kfac
}  // namespace kdist
