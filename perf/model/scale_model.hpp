// Scale model of one K-FAC iteration (SPD-KFAC paper, Fig. 9 breakdown) for P ranks, driven by the
// library's own planners and placement: comm::make_plan / plan_finish_time for the fusion of the
// factor all-reduce, kfac::place for the inverses. Nothing here runs a collective.
//
// Inputs: per-layer compute times on one rank (measured by `bench_kfac --profile`, or from FLOP
// counts and rates: network_times), the cost models at P (CommModels), and the switches a
// strategy resolves to (kfac::resolve). The timeline it replays is the Preconditioner's:
//   forward   layer by layer, factor A of each layer first (ready time of A_l; pipelined, its
//             packing into the fusion buffer is part of the hook)
//   backward  layer by layer in reverse, factor G first (ready time of G_l)
//   one communication channel, calls back to back in submission order:
//     pipelined:     factor groups from their ready times, then the gradient all-reduce (FIFO)
//     not pipelined: the gradient all-reduce after backward, then every factor at once (packed then)
//   the unpacking of every factor when step() has waited for the reduction
//   inverses  CT in kfac::broadcast_order: the owner inverts and packs each, every rank posts its
//             broadcast after its own CT work before it, the channel sends it once all have; NCT
//             factors after, on every rank; then each rank waits the broadcasts in order and
//             unpacks those it did not own
//   precondition  split (kfac::precondition_split): about 1/P of the outputs or inputs per rank
//             and an all-gather of V (over inputs also the un-blocking copy); else all of V; the
//             passes over the whole gradient (gather, clip, scatter) on every rank either way
// Every phase is rank 0's, total is the last rank to finish (as bench_kfac reports them). P == 1
// communicates nothing. Derivations and the all-gather approximation are in scale_model.cpp.
#pragma once

#include <kdist/comm/fusion_plan.hpp>
#include <kdist/core/cost_model.hpp>
#include <kdist/kfac/options.hpp>
#include <kdist/kfac/placement.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace kdist_perf {

/// One K-FAC layer with its compute times on one rank, in seconds.
struct LayerTimes {
  std::string label;
  int a_dim = 0, g_dim = 0;
  std::size_t gradient_elements = 0;  ///< weights and bias
  double forward = 0, backward = 0, factor_a = 0, factor_g = 0;
  double precondition = 0;       ///< both products of V = G^-1 [dW|db] A^-1 for the whole layer
  double precondition_copy = 0;  ///< gathering [dW|db], the clip's inner product, scattering nu V
  /// Copying each factor's upper triangle into the fusion buffer and back (FusedAllreducer).
  double pack_a = 0, pack_g = 0, unpack_a = 0, unpack_g = 0;
  /// The hooks when pipelined, where measured (packing and progressing the all-reduce included);
  /// 0: factor + pack.
  double factor_a_pipelined = 0, factor_g_pipelined = 0;
  /// Forward and backward with the pipelined all-reduce in flight, where measured (on a host the
  /// transfer's progress takes CPU from the layers); 0: forward, backward.
  double forward_pipelined = 0, backward_pipelined = 0;
  double fwd(bool pipelined) const { return pipelined && forward_pipelined > 0 ? forward_pipelined : forward; }
  double bwd(bool pipelined) const { return pipelined && backward_pipelined > 0 ? backward_pipelined : backward; }
  double hook_a(bool pipelined) const {
    return !pipelined ? factor_a : factor_a_pipelined > 0 ? factor_a_pipelined : factor_a + pack_a;
  }
  double hook_g(bool pipelined) const {
    return !pipelined ? factor_g : factor_g_pipelined > 0 ? factor_g_pipelined : factor_g + pack_g;
  }
};

/// The collectives at P ranks; `placement` also holds the inverse model and element size.
struct CommModels {
  kdist::CostModel allreduce;  ///< seconds for x = bytes
  kdist::kfac::PlacementModels placement;
};

struct Scenario {
  int ranks = 2;
  kdist::kfac::Resolved switches;
  std::size_t threshold_bytes = kdist::comm::kDefaultFusionBytes;      ///< the threshold planner's group size
  kdist::comm::Planner gradient_planner = kdist::comm::Planner::none;  ///< fusion of the gradient all-reduce
  bool split_preconditioning = true;
};

/// Seconds per phase, named as bench_kfac's columns.
struct Breakdown {
  double fwd_bwd = 0, grad_comm = 0, factors = 0, factor_comm = 0, inverses = 0, inverse_comm = 0, precondition = 0,
         total = 0;
};

struct Prediction {
  Breakdown phases;
  kdist::comm::FusionPlan factor_plan;
  kdist::kfac::Placement placement;
  double inverse_phase = 0;            ///< inverses and broadcasts until the last rank is done
  double factor_comm_unpipelined = 0;  ///< the same factors reduced after backward (hidden share reference)
  double factor_comm_bound = 0;        ///< finish_time_lower_bound past the end of backward
};

/// `models` are what the library plans with (fusion plan, placement); `actual`, when given, what the
/// collectives and inverses then cost (a validation plans with the calibration the run was given and
/// times with what the profile measured). Throws std::invalid_argument naming the value on ranks < 1,
/// an empty layer list or a layer with a dimension < 1 or a negative or non-finite time.
Prediction predict(const std::vector<LayerTimes>& layers, const CommModels& models, const Scenario& scenario,
                   const CommModels* actual = nullptr);

/// The factor all-reduce tensors in reduction order (A_0 .. A_{L-1}, G_{L-1} .. G_0), packed bytes,
/// with the ready times of the replayed timeline: the planner's input.
std::vector<kdist::comm::FusionTensor> factor_tensors(const std::vector<LayerTimes>& layers, std::size_t element_bytes,
                                                      bool pipelined);
/// The placement items in the same order, labelled as the Preconditioner labels them.
std::vector<kdist::kfac::PlacementItem> placement_items(const std::vector<LayerTimes>& layers);

}  // namespace kdist_perf
