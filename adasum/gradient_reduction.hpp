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
                    const comm::Layout& layout,
                    const std::string&) { return allreduce(exec, e, b, layout.bounds, layout.labels, topology); };
}

}  // namespace adasum
}  // namespace kdist
