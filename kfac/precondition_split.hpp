// How split preconditioning (Options::split_preconditioning) shares one layer's
// Vᵀ = A^-1 [dW | db]ᵀ G^-1 (a_dim x g_dim) among P ranks: each rank computes one block, every
// block is all-gathered, and every rank then holds all of V.
//
// - outputs: rank r computes columns [r w, (r + 1) w) of Vᵀ, w = ceil(g_dim / P):
//   A^-1 ([dW | db]ᵀ G^-1[:, block]), a_dim (a_dim + g_dim) w flops.
// - inputs:  rank r computes rows [r w, (r + 1) w) of Vᵀ, w = ceil(a_dim / P):
//   ((A^-1[:, block])ᵀ [dW | db]ᵀ) G^-1, g_dim (a_dim + g_dim) w flops; the gathered blocks are
//   copied into Vᵀ once more (they are row blocks of a column-major matrix).
//
// The busiest rank's work is the one that counts, so a layer is split over inputs only when that
// is strictly less: ceil(a/P) g < ceil(g/P) a. That can only happen when P does not divide g,
// typically when a layer has fewer outputs than ranks (a 10-class output layer at 16 ranks: one
// output each, ranks 10..15 idle). Every rank decides from the same sizes, so every rank decides
// the same.
// perf/model/scale_model.cpp models the same rule.
#pragma once

namespace kdist {
namespace kfac {

enum class SplitAxis { outputs, inputs };

struct PreconditionSplit {
  SplitAxis axis = SplitAxis::outputs;
  int block = 0;  ///< columns (outputs) or rows (inputs) of Vᵀ per rank: ceil(extent / P)
};

/// The split of a layer with factor dimensions a_dim and g_dim over `ranks` (all >= 1).
inline PreconditionSplit precondition_split(int a_dim, int g_dim, int ranks) {
  const long long by_outputs = (g_dim + ranks - 1) / ranks, by_inputs = (a_dim + ranks - 1) / ranks;
  if (by_inputs * g_dim < by_outputs * a_dim) return {SplitAxis::inputs, static_cast<int>(by_inputs)};
  return {SplitAxis::outputs, static_cast<int>(by_outputs)};
}

}  // namespace kfac
}  // namespace kdist
