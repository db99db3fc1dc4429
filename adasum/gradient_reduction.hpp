// One option for how training combines gradients across ranks: sum, average or Adasum. It plugs
// into comm::FusedAllreducer, so whichever is chosen stays fused and overlapped with backward.
#pragma once

#include <kdist/adasum/allreduce.hpp>
#include <kdist/comm/fused_allreducer.hpp>

namespace kdist {
namespace adasum {

enum class GradientReduction { sum, average, adasum };

/// The FusedAllreducer reduction for `mode`. Adasum combines per tensor (the fused buffer's
/// tensor boundaries) and, with `topology`, runs hierarchically; the topology must outlive the
/// reducer.
template <class T>
typename comm::FusedAllreducer<T>::Reduction make_reduction(GradientReduction mode,
                                                            const Topology* topology = nullptr) {
  using FA = comm::FusedAllreducer<T>;
  switch (mode) {
    case GradientReduction::sum:
      return FA::sum();
    case GradientReduction::average:
      return FA::average();
    case GradientReduction::adasum:
      break;
  }
  return [topology](comm::Engine& e, const typename FA::Buffer& b, const std::vector<std::size_t>& bounds,
                    const std::vector<std::string>& labels,
                    const std::string&) { return allreduce<T>(e, b.data(), b.extent(0), bounds, labels, topology); };
}

}  // namespace adasum
}  // namespace kdist
