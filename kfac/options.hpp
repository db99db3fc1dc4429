// Options of the K-FAC preconditioner and the three strategies of the SPD-KFAC paper.
//
//   strategy   pipelined factor reduction   fusion planner   inverse placement
//   spd        yes (in the hooks)           optimal          lbp (CT/NCT, Algorithm 1)
//   mpdkfac    no (after backward)          threshold        sequential (round-robin, all CT)
//   dkfac      no (after backward)          threshold        replicated (every rank inverts all)
//
// Each switch can be set on its own (`pipelined`, `planner`, `placement`), which overrides the
// strategy's choice: the paper's Table IV ablation. Every combination computes the same
// preconditioned gradients up to floating-point order. `placement = channel` places for
// broadcasts that share one channel, as they do at scale (placement.hpp).
//
// Ranges (Options::validate throws InvalidArgument naming the field and value): damping > 0,
// factor_decay in [0, 1), factor_every >= 1, inverse_every >= 1, kl_clip >= 0 (0: no clipping),
// lr > 0, profile_steps >= 0, threshold_bytes >= 1.
#pragma once

#include <kdist/comm/fusion_plan.hpp>
#include <kdist/core/inverse.hpp>
#include <kdist/core/timeline.hpp>
#include <kdist/kfac/placement.hpp>

#include <optional>
#include <string>

namespace kdist {
namespace kfac {

enum class Strategy { spd, mpdkfac, dkfac };
/// Whether the gradients given to Preconditioner::step are the same on every rank (Options::gradients).
enum class Gradients { averaged, per_rank };
/// Where a factor may be kept as its Cholesky factor, whether it is (Options::cholesky_solves).
enum class CholeskySolves { always, measured, never };
/// When the ranks' factors are all-reduced (Options::factor_sync).
enum class FactorSync { every_step, before_inverses };
const char* to_string(Strategy s);
/// "always", "measured" or "never".
const char* to_string(CholeskySolves c);
/// "every-step" or "before-inverses".
const char* to_string(FactorSync f);
/// "spd", "mpdkfac" or "dkfac"; false for anything else.
bool parse_strategy(const std::string& text, Strategy* out);

struct Options {
  Strategy strategy = Strategy::spd;
  double damping = 1e-3;       ///< gamma, added to each factor's diagonal before inverting
  double factor_decay = 0.95;  ///< xi: F <- xi F + (1 - xi) F_new
  int factor_every = 1;        ///< k1: factors are updated on steps divisible by k1
  int inverse_every = 1;       ///< k2: inverses are recomputed on steps divisible by k2
  double kl_clip = 1e-3;       ///< kappa of the KL clip; 0 turns clipping off
  double lr = 0.1;             ///< learning rate the KL clip assumes (set_learning_rate tracks it)
  InverseMethod inverse_method = InverseMethod::cholesky;
  /// Where the preconditioning applies a factor's inverse to whole columns (A where a layer is not
  /// split or split over outputs, G where it is not split or split over inputs), the factor may be
  /// kept as its Cholesky factor R (R^T R = F + damping I) and applied by two triangular solves:
  /// an inverse step then costs potrf alone, about a third of potrf + potri's flops, for products
  /// of the same flops. always: wherever that applies; measured: where it is also faster over an
  /// inverse period on this execution space, timed at construction (kfac/impl/solve_costs.hpp: a
  /// BLAS may run the solves at half the product's rate); opt-in, since a choice taken from timings
  /// may differ between two runs of the same job, and their updates then by rounding. never: every
  /// factor inverted, as kfac-pytorch does. Only with inverse_method cholesky.
  CholeskySolves cholesky_solves = CholeskySolves::always;
  /// every_step: every factor step all-reduces the factors, so they are the same on every rank
  /// after each step (SPD-KFAC and kfac-pytorch; pipelined behind forward and backward by spd).
  /// before_inverses: only the factor steps that are also inverse steps do (kfac-jax's lazy sync);
  /// in between each rank's running average takes its own batches only. The average is linear, so
  /// the factors inverted are the same up to rounding, for the factor all-reduce of one step in
  /// inverse_every. Between syncs factor(f) is this rank's; save() syncs first, save_to() asks for
  /// sync_factors() first.
  FactorSync factor_sync = FactorSync::every_step;
  /// Preconditioning split over the ranks: each computes one block of every layer's
  /// V = G^-1 [dW | db] A^-1, of its outputs (rows) or inputs (columns), whichever leaves the
  /// busiest rank less work (kfac/precondition_split.hpp), and the blocks are all-gathered.
  /// false: every rank computes all of V (the paper's and kfac-pytorch's COMM_OPT layout).
  /// Only for averaged gradients: per_rank gradients are never split.
  bool split_preconditioning = true;
  /// What step() is handed. averaged: the same gradient on every rank (the gradient all-reduce's
  /// result). per_rank: each rank's own gradient, e.g. before Adasum combines the optimizer's
  /// deltas; every rank then computes all of its own V and its own KL clip, since a block computed
  /// elsewhere would come from another rank's gradient.
  Gradients gradients = Gradients::averaged;
  /// Dense layers precondition their gradient in the factored form their hooks saw, dyᵀ [x 1]
  /// (rank at most the batch's rows), where that costs this rank fewer multiply-adds than the
  /// full product: Vᵀ = sum over ranks of (A^-1 [x 1]ᵀ)(G^-1 dyᵀ)ᵀ, weighted, all-reduced
  /// (kfac/impl/low_rank.hpp; the MLP's 785 x 256 layer at 64 rows a rank: about half the flops).
  /// The hooks then keep a copy of x and dy on every step, not only factor steps. The gradient
  /// handed to step() must be the batch's: the ranks' mean or the global batch's mean of what the
  /// hooks saw, checked by a projection; anything added to it (weight decay, an L2 term, clipping)
  /// is an InvalidArgument on every rank, since it would be lost. Off: kfac-pytorch's form.
  bool low_rank_dense = false;
  /// Factor steps whose measured ready times feed the first fusion plan (planned once, after
  /// them; Preconditioner::replan() asks for another). 0: plan at the first step.
  int profile_steps = 3;
  std::size_t threshold_bytes = comm::kDefaultFusionBytes;  ///< the threshold planner's group size
  /// Calibration file from kdist_calibrate (allreduce, broadcast and spd_inverse entries); empty:
  /// the stated defaults of CostModelStore.
  std::string cost_models;
  Timeline* timeline = nullptr;  ///< optional: per-phase events ("kfac" tracks)
  // Switches that override the strategy's choice.
  std::optional<bool> pipelined;
  std::optional<comm::Planner> planner;
  std::optional<PlacementKind> placement;

  void validate() const;
};

/// The switches a strategy and its overrides come to.
struct Resolved {
  bool pipelined = true;
  comm::Planner planner = comm::Planner::optimal;
  PlacementKind placement = PlacementKind::lbp;
};
Resolved resolve(const Options& options);

}  // namespace kfac
}  // namespace kdist
