// Preconditioner, continued: the state file (save/load) and describe(). Included by
// kfac/preconditioner.hpp only; compiled into kdist_kfac by kfac/preconditioner.cpp.
#pragma once

#include <kdist/core/atomic_file.hpp>

#include <algorithm>
#include <sstream>

namespace kdist {
namespace kfac {

// ---- state --------------------------------------------------------------------------------

template <class T, class M>
StateHeader Preconditioner<T, M>::header() const {
  StateHeader h;
  h.dtype = to_string(dtype_of<T>());
  h.ranks = engine_.size();
  for (const LayerSlot& slot : layer_slots_) h.layers.push_back(slot.layer.describe());
  for (const FactorSlot& slot : factor_slots_) h.dims.push_back(static_cast<int>(slot.running.extent(0)));
  h.step = step_;
  h.factor_steps = factor_steps_;
  h.replan_after = replan_after_;
  h.have_inverses = have_inverses_;
  h.fusion_groups = fused_->plan().group_end;
  h.owners = placement_.owner;
  return h;
}

namespace impl {
/// Every rank learns whether any rank failed (collective, through `engine`).
inline bool any_rank_failed(comm::Engine& engine, bool failed_here) {
  Kokkos::View<int*, Kokkos::HostSpace> flag("kdist::kfac::status", 1);
  flag(0) = failed_here ? 1 : 0;
  engine.allreduce(Kokkos::DefaultHostExecutionSpace(), flag, comm::ReduceOp::max, "kfac state status").wait();
  return flag(0) != 0;
}
}  // namespace impl

template <class T, class M>
void Preconditioner<T, M>::save(const std::string& path) {
  require(order_.check_between_steps("save"));
  std::exception_ptr error;
  if (engine_.rank() == 0) {
    try {
      std::string payload;
      for (const bool inverses : {false, true})  // the running factors, then the inverses
        for (const FactorSlot& slot : factor_slots_) {
          const auto host =
              Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), inverses ? slot.inverse : slot.running);
          payload.append(reinterpret_cast<const char*>(host.data()), host.span() * sizeof(T));
        }
      write_file_atomically(path, encode_state(header(), payload), "kdist::kfac::Preconditioner::save");
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (impl::any_rank_failed(engine_, static_cast<bool>(error))) {
    if (error) std::rethrow_exception(error);
    throw Error("kdist::kfac::Preconditioner::save: rank 0 could not write " + path + " (its error is on rank 0)");
  }
}

template <class T, class M>
void Preconditioner<T, M>::load(const std::string& path) {
  require(order_.check_between_steps("load"));
  std::exception_ptr error;
  StateHeader saved;
  std::string payload;
  try {
    saved = decode_state(path, &payload);
    check_compatible(path, saved, header(), payload.size(), sizeof(T));
    if (static_cast<int>(saved.owners.size()) != factors() ||
        std::any_of(saved.owners.begin(), saved.owners.end(), [&](int o) { return o < -1 || o >= engine_.size(); }))
      kdist::impl::throw_invalid("kdist::kfac::Preconditioner::load", path + ": owners out of range");
    if (saved.fusion_groups.empty() || saved.fusion_groups.back() != factors())
      kdist::impl::throw_invalid("kdist::kfac::Preconditioner::load",
                                 path + ": fusion plan does not cover the factors");
  } catch (...) {
    error = std::current_exception();
  }
  if (impl::any_rank_failed(engine_, static_cast<bool>(error))) {
    if (error) std::rethrow_exception(error);
    throw Error("kdist::kfac::Preconditioner::load: " + path + " could not be loaded on another rank (rank " +
                std::to_string(engine_.rank()) + " read it)");
  }
  std::size_t offset = 0;
  for (const bool inverses : {false, true})  // the running factors, then the inverses
    for (FactorSlot& slot : factor_slots_) {
      const Matrix& F = inverses ? slot.inverse : slot.running;
      auto host = Kokkos::create_mirror_view(Kokkos::HostSpace(), F);
      std::copy_n(payload.data() + offset, host.span() * sizeof(T), reinterpret_cast<char*>(host.data()));
      offset += host.span() * sizeof(T);
      Kokkos::deep_copy(F, host);
    }
  step_ = saved.step;
  factor_steps_ = saved.factor_steps;
  replan_after_ = saved.replan_after;
  have_inverses_ = saved.have_inverses;
  fused_->set_plan(comm::FusionPlan{saved.fusion_groups});
  if (saved.owners != placement_.owner) {
    placement_.owner = saved.owners;
    for (int f = 0; f < factors(); ++f) {
      FactorSlot& slot = factor_slot(f);
      slot.packed = saved.owners[static_cast<std::size_t>(f)] < 0
                        ? Vector()
                        : Vector("kdist::kfac::packed_" + slot.label, packed_size(slot.running.extent(0)));
    }
  }
}

// ---- describe -----------------------------------------------------------------------------

template <class T, class M>
std::string Preconditioner<T, M>::describe() const {
  std::ostringstream os;
  os << "kdist K-FAC: strategy " << to_string(options_.strategy) << " (pipelined "
     << (switches_.pipelined ? "yes" : "no") << ", fusion planner " << comm::to_string(switches_.planner)
     << ", placement " << to_string(switches_.placement) << ", preconditioning "
     << (split() ? "split over the ranks" : "on every rank") << "), " << engine_.size() << " rank(s), "
     << to_string(dtype_of<T>()) << "\n  damping " << options_.damping << ", factor decay " << options_.factor_decay
     << ", factors every " << options_.factor_every << ", inverses every " << options_.inverse_every
     << " step(s), KL clip " << options_.kl_clip << " at lr " << options_.lr << ", inverse by "
     << (options_.inverse_method == InverseMethod::cholesky ? "Cholesky" : "eigendecomposition")
     << "\n  cost models: " << (options_.cost_models.empty() ? std::string("stated defaults") : options_.cost_models)
     << "\n";
  for (int l = 0; l < layers(); ++l)
    os << "  layer " << l << ": " << layer(l).describe() << ", A " << layer(l).a_dim() << "^2, G " << layer(l).g_dim()
       << "^2\n";
  std::vector<PlacementItem> items;
  for (const auto& t : fused_->tensors()) items.push_back({t.label, static_cast<int>(t.dim)});
  os << placement_.describe(items);
  os << "  fusion groups (factor reduction order A0.., G..0): " << fused_->plan().groups();
  return os.str();
}

}  // namespace kfac
}  // namespace kdist
