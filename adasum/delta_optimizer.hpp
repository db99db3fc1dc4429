// Adasum applied after the optimizer (the paper's and Horovod's DistributedOptimizer(op=Adasum)
// workflow) for a C++ training loop:
//   1. clip this rank's gradients (optional, global L2 norm over its parameters),
//   2. snapshot the parameters, let the user's optimizer take its local step,
//   3. Adasum-reduce the deltas p - start (fused, one tensor per parameter),
//   4. p := start + reduced delta.
// At one rank this is exactly the local step. Learning rate: start from the single-worker rate;
// Adasum does not grow the effective batch the way a gradient sum does.
#pragma once

#include <kdist/adasum/allreduce.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace kdist {
namespace adasum {

template <class T>
class DeltaOptimizer {
 public:
  using Param = Kokkos::View<T*, Kokkos::HostSpace>;

  DeltaOptimizer(comm::Engine& engine, std::vector<Param> params, const Topology* topology = nullptr)
      : engine_(engine), params_(std::move(params)), topology_(topology) {
    bounds_.push_back(0);
    for (const Param& p : params_) {
      bounds_.push_back(bounds_.back() + p.extent(0));
      labels_.push_back(p.label());
    }
    start_.assign(bounds_.back(), T(0));
    delta_.assign(bounds_.back(), T(0));
  }

  /// Scales `grads` in place so their joint L2 norm is at most max_norm; returns the norm
  /// before clipping. Non-finite norms are left for the all-reduce to report.
  static double clip_grad_norm(const std::vector<Param>& grads, double max_norm) {
    double sq = 0;
    for (const Param& g : grads)
      for (std::size_t i = 0; i < g.extent(0); ++i) sq += static_cast<double>(g(i)) * static_cast<double>(g(i));
    const double norm = std::sqrt(sq);
    if (max_norm > 0 && norm > max_norm && std::isfinite(norm)) {
      const T f = static_cast<T>(max_norm / norm);
      for (const Param& g : grads)
        for (std::size_t i = 0; i < g.extent(0); ++i) g(i) *= f;
    }
    return norm;
  }

  /// One distributed step (collective). `local_step` is the user's optimizer update of the
  /// parameters from `grads`; `max_grad_norm` > 0 clips the gradients before it.
  void step(const std::vector<Param>& grads, const std::function<void()>& local_step, double max_grad_norm = 0) {
    if (max_grad_norm > 0) clip_grad_norm(grads, max_grad_norm);
    for (std::size_t k = 0; k < params_.size(); ++k)
      for (std::size_t i = 0; i < params_[k].extent(0); ++i) start_[bounds_[k] + i] = params_[k](i);
    local_step();
    for (std::size_t k = 0; k < params_.size(); ++k)
      for (std::size_t i = 0; i < params_[k].extent(0); ++i)
        delta_[bounds_[k] + i] = params_[k](i) - start_[bounds_[k] + i];
    allreduce<T>(engine_, delta_.data(), delta_.size(), bounds_, labels_, topology_).wait();
    for (std::size_t k = 0; k < params_.size(); ++k)
      for (std::size_t i = 0; i < params_[k].extent(0); ++i)
        params_[k](i) = start_[bounds_[k] + i] + delta_[bounds_[k] + i];
  }

 private:
  comm::Engine& engine_;
  std::vector<Param> params_;
  const Topology* topology_;
  std::vector<std::size_t> bounds_;
  std::vector<std::string> labels_;
  std::vector<T> start_, delta_;
};

}  // namespace adasum
}  // namespace kdist
