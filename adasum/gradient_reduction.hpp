// One option for how training combines gradients across ranks: sum, average or Adasum. It plugs
// into comm::FusedAllreducer, so whichever is chosen stays fused and overlapped with backward.
#pragma once

#include <kdist/adasum/allreduce.hpp>
#include <kdist/comm/fused_allreducer.hpp>

namespace kdist {
namespace adasum {

enum class GradientReduction { sum, average, adasum };

/// The FusedAllreducer reduction for `mode`. Adasum combines per tensor (the fused buffer's
/// layout) and, with `topology`, runs hierarchically; the topology must outlive the reducer.
/// Adasum rejects symmetric tensors (sent as their packed upper triangle, its dot products would
/// count each off-diagonal entry once instead of twice): InvalidArgument, on every rank alike,
/// from the ready() that completes the group. Register them flat (dim * dim) or use sum/average.
template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
typename comm::FusedAllreducer<T, MemorySpace>::Reduction make_reduction(GradientReduction mode,
                                                                         const Topology* topology = nullptr) {
  using FA = comm::FusedAllreducer<T, MemorySpace>;
  switch (mode) {
    case GradientReduction::sum:
      return FA::sum();
    case GradientReduction::average:
      return FA::average();
    case GradientReduction::adasum:
      break;
  }
  return [topology](comm::Engine& e, const typename FA::execution_space& exec, const typename FA::Buffer& b,
                    const comm::Layout& layout, const std::string& group) {
    if (!layout.symmetric.empty()) {
      const std::size_t t = layout.symmetric.front();
      kdist::impl::throw_invalid("kdist::adasum::make_reduction (Adasum)",
                                 "group '" + group + "' holds symmetric tensor '" + layout.labels[t] + "' (" +
                                     std::to_string(layout.bounds[t + 1] - layout.bounds[t]) +
                                     " packed elements, rank " + std::to_string(e.rank()) +
                                     "): Adasum over a packed upper triangle counts each off-diagonal entry once "
                                     "instead of twice; register it flat (dim * dim) or reduce it with sum/average");
    }
    return allreduce(exec, e, b, layout.bounds, layout.labels, topology);
  };
}

}  // namespace adasum
}  // namespace kdist
