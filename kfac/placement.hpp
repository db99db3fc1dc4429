// Inverse placement (SPD-KFAC §IV-C, Algorithm 1): which rank inverts each Kronecker factor. A pure
// function of (factor dimensions, cost models, P) -> plan; no MPI, no kernels, so every rank that
// calls it with the same inputs gets the same plan.
//
// Load model (the paper's): a CT factor (owner r >= 0) adds inverse(d) + broadcast(d) to rank r's
// load; an NCT factor (owner -1) is inverted on every rank, adds inverse(d) to all, and is not sent.
// inverse(d) = models.inverse(work d^3) (work 1, or 1/3 for a Cholesky factor alone); broadcast(d) =
// models.broadcast(packed_size(d) * element_bytes).
// The plan's modelled time is the makespan, max over ranks of the load.
//   lbp         Algorithm 1: largest dimension first (ties by input index); NCT iff inverse < broadcast,
//               else CT on the least-loaded rank so far (ties: lowest rank).
//   sequential  MPD-KFAC: all CT, item i on rank i mod P.      replicated  D-KFAC: all NCT.
//   optimal     minimum makespan (up to rounding) by branch and bound when N*P <= kOptimalMaxItemsTimesRanks and
//               the search ends within kOptimalMaxNodes nodes (exact = true); otherwise the best plan
//               found, never worse than lbp (exact = false).
//   channel     for the broadcasts as they run: one after another on one channel (the Engine's ordered
//               stream; every rank receives every CT inverse anyway). Channel model: rank r computes its
//               CT and all NCT inverses, the channel sends every CT broadcast after the first CT inverse:
//               T = max(max_r compute_r, min_CT inv + sum_CT bcast). Starting from every factor CT, factors
//               turn NCT in decreasing bcast / inverse (most channel time saved per second every rank
//               spends), CT factors placed largest inverse first on the least-computing rank; the best
//               plan seen, never worse than lbp's in this model. Its modelled_time, load and lower_bound
//               are the channel model's (channel_lower_bound).
// P == 1: every factor is local (owner -1), load = sum of inverses, for every kind (exact for optimal).
// Bounds: lower_bound <= optimum <= lbp <= lbp_bound_factor(P) * optimum, with factor P/2 + 1 (P >= 2).
// Throws InvalidArgument naming the value on P < 1, dim < 1, element_bytes < 1, an owner outside
// [-1, P) or a list whose length does not match the plan.
#pragma once

#include <kdist/core/cost_model.hpp>
#include <kdist/core/dtype.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace kdist {
namespace kfac {

enum class PlacementKind { lbp, sequential, replicated, optimal, channel };
/// "lbp", "sequential", "replicated", "optimal", "channel".
const char* to_string(PlacementKind kind);
/// Parses to_string()'s spelling; returns false (and leaves *out) for anything else.
bool parse_placement(const std::string& text, PlacementKind* out);

/// PlacementItem::work of a factor kept as its Cholesky factor: potrf's n^3/3 flops of potrf +
/// potri's n^3 (OpenBLAS, one core, d = 1569: 20.9 against 54.2 ms).
constexpr double kCholeskyFactorWork = 1.0 / 3.0;

/// One Kronecker factor (A or G of a layer).
struct PlacementItem {
  std::string label;
  int dim = 0;
  /// The share of potrf + potri's d^3 flops the owner spends: 1, or 1/3 for a factor kept as its
  /// Cholesky factor (potrf alone, Options::cholesky_solves).
  double work = 1.0;
};

struct PlacementModels {
  CostModel inverse;                                    ///< seconds for x = d^3
  CostModel broadcast;                                  ///< seconds for x = bytes on P ranks
  std::size_t element_bytes = 4;                        ///< the inverse travels as a packed upper triangle
  double inverse_time(int d, double work = 1.0) const;  ///< models.inverse(work d^3)
  double broadcast_time(int d) const;
  /// Inverse: CostKey{spd_inverse, float64, 1, "local"}; broadcast: CostKey{broadcast, dtype, ranks,
  /// "world"}; element_bytes = size_of(dtype). Calibrated entries, else CostModelStore's defaults.
  static PlacementModels from_store(const CostModelStore& store, DType dtype, int ranks);
};

struct Placement {
  PlacementKind kind = PlacementKind::lbp;
  int ranks = 1;
  std::vector<int> owner;           ///< per item, caller's order: CT owner rank, or -1 (NCT)
  std::vector<double> inverse_s;    ///< per item: modelled inverse seconds
  std::vector<double> broadcast_s;  ///< per item: modelled broadcast seconds (paid only when CT)
  std::vector<double> load;         ///< modelled seconds per rank
  double modelled_time = 0.0;       ///< max load (makespan)
  double lower_bound = 0.0;         ///< placement_lower_bound for the same inputs
  bool exact = false;               ///< optimal kind: the plan is proven optimal
  /// Start-up table: per factor label, dim, CT/NCT, owner, modelled inverse and broadcast; then
  /// per-rank loads, makespan, lower bound and their ratio. `items` must be the ones placed.
  std::string describe(const std::vector<PlacementItem>& items) const;
};

/// Above this N*P, optimal returns the lbp plan (exact = false).
constexpr int kOptimalMaxItemsTimesRanks = 64;
/// Search nodes after which optimal stops and returns its best plan so far (exact = false): about
/// 1 s on one core. Many distinct, nearly equal CT factors with N*P near the limit (a partition problem)
/// can reach it; random mixed inputs at the limit finished in under 0.25 s in our trials.
constexpr long long kOptimalMaxNodes = 10000000;

Placement place(const std::vector<PlacementItem>& items, const PlacementModels& models, int ranks, PlacementKind kind);
/// Makespan of any assignment under the load model (owner per item: -1 or a rank); `load`, when
/// given, receives the per-rank loads.
double placement_time(const std::vector<PlacementItem>& items, const PlacementModels& models, int ranks,
                      const std::vector<int>& owner, std::vector<double>* load = nullptr);
/// max(max_i min(c_i, inv_i + (W - w_i)/P), W/P) <= the optimal makespan, with c_i = inv_i + bcast_i,
/// w_i = min(P inv_i, c_i) and W = sum_i w_i (proof in placement.cpp).
double placement_lower_bound(const std::vector<PlacementItem>& items, const PlacementModels& models, int ranks);
/// The channel model's makespan of any assignment (see channel above); `load` receives each rank's compute.
double channel_time(const std::vector<PlacementItem>& items, const PlacementModels& models, int ranks,
                    const std::vector<int>& owner, std::vector<double>* load = nullptr);
/// <= the channel model's optimum: max(max_i inv_i, LP relaxation of max(sum_CT bcast, sum_i inv_i - (1 - 1/P) sum_CT
/// inv_i)) (derivation in placement.cpp).
double channel_lower_bound(const std::vector<PlacementItem>& items, const PlacementModels& models, int ranks);
/// p with `owner` in its place (a resumed run's saved plan): per-rank loads and makespan re-computed
/// from p's modelled costs in p's model (the channel model for kind channel), exact = false; the
/// lower bound stays p's, since it does not depend on the owners.
Placement with_owners(const Placement& p, const std::vector<int>& owner);
/// c(P) with lbp makespan <= c(P) * optimum: 1 for P == 1, P/2 + 1 for P >= 2 (proof in placement.cpp).
double lbp_bound_factor(int ranks);

/// The CT factors (indices into p.owner) in the order every rank submits their broadcasts, which is
/// also the order each owner inverts its own. Per owner, Johnson's rule on (inverse_s, broadcast_s):
/// factors whose inverse is no longer than their broadcast first, by increasing inverse, then the
/// rest by decreasing broadcast. Across owners, by modelled ready time (that owner's inverses up to
/// and including this one), ties by owner, then index. A pure function of the plan: every rank gets
/// the same order. Why (one channel fed by P owners) in placement.cpp. Throws InvalidArgument on a
/// plan whose owners lie outside [-1, ranks) or whose cost lists do not match its owner list.
std::vector<int> broadcast_order(const Placement& p);

/// One step of a rank's inverse stage (Preconditioner::step on inverse steps).
struct InverseTask {
  enum class Kind {
    invert_and_broadcast,  ///< CT, this rank owns it: invert, pack, post the broadcast
    receive,               ///< CT, another rank owns it: post the broadcast, unpack once it lands
    invert_local           ///< NCT: invert here, nothing sent
  };
  Kind kind;
  int factor;  ///< index into p.owner
  int root;    ///< the CT owner; -1 for NCT
};

/// Rank `rank`'s inverse stage under plan p, in order: every CT factor in broadcast_order(p) (so
/// every rank posts the broadcasts in one order, and an owner inverts each while its previous
/// broadcast is in flight), then the NCT factors by index. A pure function of the plan; throws as
/// broadcast_order does, and on a rank outside [0, ranks).
std::vector<InverseTask> inverse_tasks(const Placement& p, int rank);

}  // namespace kfac
}  // namespace kdist
