// Adasum applied after the optimizer (the paper's and Horovod's DistributedOptimizer(op=Adasum)
// workflow) for a C++ training loop, on parameters in any memory space:
//   1. clip this rank's gradients (optional, global L2 norm over its parameters),
//   2. snapshot the parameters, let the user's optimizer take its local step,
//   3. Adasum-reduce the deltas p - start (fused, one tensor per parameter),
//   4. p := start + reduced delta.
// Every kernel runs on the caller's execution space instance; step() waits for the reduction
// (the update needs it) but never fences more than that instance. At one rank this is exactly the
// local step. Learning rate: start from the single-worker rate; Adasum does not grow the
// effective batch the way a gradient sum does.
//
// Errors: when the local step or the all-reduce throws, step() puts every parameter back to its
// value before the step, then rethrows: no rank keeps its own local step, so the ranks stay
// identical. The restore is complete when the exception arrives. A NonFiniteError of the
// all-reduce (every rank raises it alike) leaves the Engine usable: the caller may skip the batch
// and go on. An error before the all-reduce is submitted (the local step's) is this rank's alone:
// it fails the Engine (Engine::fail), so the peers, waiting in the all-reduce, raise RemoteError
// naming it, not hang.
#pragma once

#include <kdist/adasum/allreduce.hpp>
#include <kdist/core/error.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace kdist {
namespace adasum {

template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class DeltaOptimizer {
 public:
  using execution_space = typename MemorySpace::execution_space;
  using Param = Kokkos::View<T*, MemorySpace>;

  /// `labels` name the parameters in the all-reduce's checks and errors; empty: the views' labels
  /// (unmanaged views, e.g. over another framework's tensors, have none).
  DeltaOptimizer(comm::Engine& engine, std::vector<Param> params, const Topology* topology = nullptr,
                 std::vector<std::string> labels = {})
      : engine_(engine), params_(std::move(params)), topology_(topology), labels_(std::move(labels)) {
    if (!labels_.empty() && labels_.size() != params_.size())
      kdist::impl::throw_invalid("kdist::adasum::DeltaOptimizer", std::to_string(labels_.size()) + " labels for " +
                                                                      std::to_string(params_.size()) + " parameters");
    const bool labels_from_views = labels_.empty();
    bounds_.push_back(0);
    for (const Param& p : params_) {
      bounds_.push_back(bounds_.back() + p.extent(0));
      if (labels_from_views) labels_.push_back(p.label());
    }
    start_ =
        Param(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdist::adasum::DeltaOptimizer::start"), bounds_.back());
    delta_ =
        Param(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdist::adasum::DeltaOptimizer::delta"), bounds_.back());
  }

  /// Scales `grads` in place so their joint L2 norm is at most max_norm; returns the norm
  /// before clipping. Non-finite norms are left for the all-reduce to report.
  static double clip_grad_norm(const execution_space& exec, const std::vector<Param>& grads, double max_norm) {
    double sq = 0;
    for (const Param& g : grads) {
      double part = 0;
      Kokkos::parallel_reduce(
          "kdist::adasum::clip_grad_norm", Kokkos::RangePolicy<execution_space>(exec, 0, g.extent(0)),
          KOKKOS_LAMBDA(const std::size_t i, double& acc) { acc += static_cast<double>(g(i)) * g(i); }, part);
      sq += part;
    }
    const double norm = std::sqrt(sq);
    if (max_norm > 0 && norm > max_norm && std::isfinite(norm)) {
      const T f = static_cast<T>(max_norm / norm);
      for (const Param& g : grads)
        Kokkos::parallel_for(
            "kdist::adasum::clip", Kokkos::RangePolicy<execution_space>(exec, 0, g.extent(0)),
            KOKKOS_LAMBDA(const std::size_t i) { g(i) *= f; });
    }
    return norm;
  }

  /// The parameters now live in `params` (the same sizes, in the same order): for a framework that
  /// replaced their storage, e.g. LibTorch's torch::load. Not collective.
  void rebind(std::vector<Param> params) {
    bool same = params.size() == params_.size();
    for (std::size_t k = 0; same && k < params.size(); ++k) same = params[k].extent(0) == params_[k].extent(0);
    if (!same)
      kdist::impl::throw_invalid("kdist::adasum::DeltaOptimizer::rebind",
                                 std::to_string(params.size()) + " parameters of other sizes than the " +
                                     std::to_string(params_.size()) + " it was built with");
    params_ = std::move(params);
  }

  /// One distributed step (collective). `local_step` is the user's optimizer update of the
  /// parameters from `grads` (on `exec`); `max_grad_norm` > 0 clips the gradients before it.
  /// Throws what the local step or the all-reduce threw, with every parameter restored to its
  /// value before the call (the user optimizer's own state, e.g. momentum, is not restored); a
  /// local step's error fails the Engine on every rank.
  void step(const execution_space& exec, const std::vector<Param>& grads, const std::function<void()>& local_step,
            double max_grad_norm = 0) {
    if (max_grad_norm > 0) clip_grad_norm(exec, grads, max_grad_norm);
    for (std::size_t k = 0; k < params_.size(); ++k) Kokkos::deep_copy(exec, piece(start_, k), params_[k]);
    bool reducing = false;
    try {
      local_step();
      for (std::size_t k = 0; k < params_.size(); ++k) {
        auto p = params_[k];
        auto s = piece(start_, k), d = piece(delta_, k);
        Kokkos::parallel_for(
            "kdist::adasum::delta", Kokkos::RangePolicy<execution_space>(exec, 0, p.extent(0)),
            KOKKOS_LAMBDA(const std::size_t i) { d(i) = p(i) - s(i); });
      }
      auto reduction = allreduce(exec, engine_, delta_, bounds_, labels_, topology_);
      reducing = true;  // submitted on every rank: its errors reach every rank
      reduction.wait();
    } catch (...) {
      // The peers may be in the all-reduce already: tell them (the all-reduce's errors are agreed).
      if (!reducing) engine_.fail(std::current_exception());
      // Each rank holds its own local step here; left in place, the ranks would diverge (and a
      // non-finite rank would keep its NaNs). Back to the snapshot, which every rank shares.
      for (std::size_t k = 0; k < params_.size(); ++k) Kokkos::deep_copy(exec, params_[k], piece(start_, k));
      compat::fence(exec, "kdist::adasum::DeltaOptimizer: parameters restored before rethrow");
      throw;
    }
    for (std::size_t k = 0; k < params_.size(); ++k) {
      auto p = params_[k];
      auto s = piece(start_, k), d = piece(delta_, k);
      Kokkos::parallel_for(
          "kdist::adasum::apply_delta", Kokkos::RangePolicy<execution_space>(exec, 0, p.extent(0)),
          KOKKOS_LAMBDA(const std::size_t i) { p(i) = s(i) + d(i); });
    }
  }

 private:
  auto piece(const Param& fused, std::size_t k) const {
    return Kokkos::subview(fused, std::make_pair(bounds_[k], bounds_[k + 1]));
  }

  comm::Engine& engine_;
  std::vector<Param> params_;
  const Topology* topology_;
  std::vector<std::string> labels_;
  std::vector<std::size_t> bounds_;
  Param start_, delta_;
};

}  // namespace adasum
}  // namespace kdist
