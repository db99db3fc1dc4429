// Preconditioner, continued: preconditioning with the KL clip, re-planning, state and describe().
// Included by kfac/preconditioner.hpp only.
#pragma once

#include <kdist/core/atomic_file.hpp>

#include <algorithm>
#include <sstream>

namespace kdist {
namespace kfac {

// V_l = G_l^-1 [dW_l | db_l] A_l^-1 for every layer (split: this rank's column blocks, the
// all-gathers of every layer in flight together), then nu = min(1, sqrt(kl_clip / |s|)) with
// s = lr^2 sum_l sum_ij V_l . [dW_l | db_l] (kfac-pytorch's and SPD-KFAC's clip), and the
// caller's gradients become nu V. Nothing is written back until every layer's V is finite. After
// the gathers every rank holds the same V, so every rank reaches the same verdict.
template <class T, class M>
void Preconditioner<T, M>::precondition(const execution_space& exec, const std::vector<Gradient>& gradients) {
  Phase phase("kdist::kfac::precondition", options_.timeline, "kfac precondition");
  const double t0 = Clock::local_now();
  std::vector<comm::Request> gathers;
  for (int l = 0; l < layers(); ++l) {
    const Layer& layer = layers_[static_cast<std::size_t>(l)];
    const Gradient& g = gradients[static_cast<std::size_t>(l)];
    const Matrix W = work_[static_cast<std::size_t>(l)];
    impl::gather_gradient(exec, W, g.weight, g.bias, layer.bias());
    if (split()) {
      gathers.push_back(precondition_block(exec, l));
      continue;
    }
    // R := G^-1 W in the scratch, then V := R A^-1.
    const Matrix R = scratch_matrix(layer.outputs(), layer.a_dim());
    gemm(exec, "N", "N", T(1), inverse_[static_cast<std::size_t>(g_index(l))], W, T(0), R);
    gemm(exec, "N", "N", T(1), R, inverse_[static_cast<std::size_t>(a_index(l))], T(0), preconditioned(l));
  }
  for (comm::Request& r : gathers) r.wait();
  double total = 0;
  for (int l = 0; l < layers(); ++l) {
    const double dot = impl::inner(exec, preconditioned(l), work_[static_cast<std::size_t>(l)]);
    if (!std::isfinite(dot))
      raise(NonFiniteError(
          "kdist::kfac::step",
          "gradient of layer " + std::to_string(l) + " " + layers_[static_cast<std::size_t>(l)].describe(),
          static_cast<long long>(work_[static_cast<std::size_t>(l)].size()), engine_.rank(),
          "the preconditioned gradient's inner product with the gradient is " + std::to_string(dot)));
    total += dot;
  }
  const double s = std::abs(total) * options_.lr * options_.lr;
  const T nu = static_cast<T>(options_.kl_clip > 0 && s > 0 ? std::min(1.0, std::sqrt(options_.kl_clip / s)) : 1.0);
  for (int l = 0; l < layers(); ++l) {
    const Layer& layer = layers_[static_cast<std::size_t>(l)];
    const Gradient& g = gradients[static_cast<std::size_t>(l)];
    impl::scatter_gradient(exec, g.weight, g.bias, preconditioned(l), nu, layer.bias());
  }
  last_clip_ = static_cast<double>(nu);
  stats_.precondition += phase_end(exec, t0);
}

// This rank's block of columns [c0, c1) of V_l = G^-1 (W A^-1[:, c0:c1]) into block_[l], then the
// all-gather of every rank's block into result_[l] (columns padded to size x block columns; a
// rank past the last column sends its block unused).
template <class T, class M>
comm::Request Preconditioner<T, M>::precondition_block(const execution_space& exec, int l) {
  const Layer& layer = layers_[static_cast<std::size_t>(l)];
  const int a = layer.a_dim(), width = block_columns(l);
  const int c0 = std::min(a, engine_.rank() * width), c1 = std::min(a, c0 + width);
  const Matrix B = block_[static_cast<std::size_t>(l)];
  if (c1 > c0) {
    const Matrix R = scratch_matrix(layer.outputs(), c1 - c0);
    const auto columns = std::make_pair(c0, c1);
    gemm(exec, "N", "N", T(1), work_[static_cast<std::size_t>(l)],
         Kokkos::subview(inverse_[static_cast<std::size_t>(a_index(l))], Kokkos::ALL, columns), T(0), R);
    gemm(exec, "N", "N", T(1), inverse_[static_cast<std::size_t>(g_index(l))], R, T(0),
         Kokkos::subview(B, Kokkos::ALL, std::make_pair(0, c1 - c0)));
  }
  const Matrix& V = result_[static_cast<std::size_t>(l)];
  return engine_.allgather(exec, Vector(B.data(), B.size()), Vector(V.data(), V.size()),
                           "kfac preconditioned layer " + std::to_string(l));
}

template <class T, class M>
typename Preconditioner<T, M>::Matrix Preconditioner<T, M>::preconditioned(int l) const {
  return Kokkos::subview(result_[static_cast<std::size_t>(l)], Kokkos::ALL,
                         std::make_pair(0, layers_[static_cast<std::size_t>(l)].a_dim()));
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

// ---- state --------------------------------------------------------------------------------

template <class T, class M>
StateHeader Preconditioner<T, M>::header() const {
  StateHeader h;
  h.dtype = to_string(dtype_of<T>());
  h.ranks = engine_.size();
  for (const Layer& l : layers_) h.layers.push_back(l.describe());
  for (const Matrix& F : running_) h.dims.push_back(static_cast<int>(F.extent(0)));
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
  if (next_forward_ != 0)
    raise(
        InvalidArgument("kdist::kfac::Preconditioner::save: called inside a step (after on_forward); save between "
                        "step() and the next on_forward (rank " +
                        std::to_string(engine_.rank()) + ")"));
  std::exception_ptr error;
  if (engine_.rank() == 0) {
    try {
      std::string payload;
      for (const auto* list : {&running_, &inverse_})
        for (const Matrix& F : *list) {
          const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), F);
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
  if (next_forward_ != 0)
    raise(InvalidArgument("kdist::kfac::Preconditioner::load: called inside a step (rank " +
                          std::to_string(engine_.rank()) + ")"));
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
  for (auto* list : {&running_, &inverse_})
    for (Matrix& F : *list) {
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
      const std::size_t d = running_[static_cast<std::size_t>(f)].extent(0);
      packed_[static_cast<std::size_t>(f)] =
          saved.owners[static_cast<std::size_t>(f)] < 0 ? Vector() : Vector("kdist::kfac::packed", packed_size(d));
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
    os << "  layer " << l << ": " << layers_[static_cast<std::size_t>(l)].describe() << ", A "
       << layers_[static_cast<std::size_t>(l)].a_dim() << "^2, G " << layers_[static_cast<std::size_t>(l)].g_dim()
       << "^2\n";
  std::vector<PlacementItem> items;
  for (const auto& t : fused_->tensors()) items.push_back({t.label, static_cast<int>(t.dim)});
  os << placement_.describe(items);
  os << "  fusion groups (factor reduction order A0.., G..0): " << fused_->plan().groups();
  return os.str();
}

}  // namespace kfac
}  // namespace kdist
