// Fusion planners: tensors arrive in ready order with sizes m_j (bytes) and ready times R_j; a
// plan splits them into consecutive groups, each sent as one call. Planners: none (one call per
// tensor), byte threshold (Horovod-style), the MG-WFBP / SPD-KFAC merge rule, and the optimal
// plan: the O(N^2) dynamic program
//   F(j) = min_i [ max(F(i-1), R_j) + C(m_i + ... + m_j) ]
// which minimises the finish time for any non-decreasing cost C (docs/architecture.md §3).
#pragma once

#include <kdist/comm/engine.hpp>

#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace kdist {
namespace comm {

struct FusionTensor {
  std::size_t bytes = 0;
  double ready = 0.0;  ///< seconds on the shared time base (any common origin)
};

/// Cost of one call moving `bytes`; must be non-decreasing.
using CostFunction = std::function<double(double bytes)>;

enum class Planner { none, threshold, mgwfbp, optimal };
const char* to_string(Planner p);

struct FusionPlan {
  std::vector<int> group_end;  ///< exclusive end index of each group, increasing, last == N
  int groups() const noexcept { return static_cast<int>(group_end.size()); }
  /// Index of the group holding tensor i.
  int group_of(int i) const;
};

FusionPlan plan_none(std::size_t n);
/// Greedy fill up to `threshold` bytes; a tensor larger than the threshold goes alone.
FusionPlan plan_threshold(const std::vector<FusionTensor>& t, std::size_t threshold);
/// MG-WFBP rule: with s_l = max(F_{l-1}, R_l) the time tensor l could start, merge it into the
/// next group iff R_{l+1} - s_l < alpha (F from `cost`).
FusionPlan plan_mgwfbp(const std::vector<FusionTensor>& t, const CostFunction& cost, double alpha);
/// Optimal plan (dynamic program); groups never exceed max_group_bytes unless a tensor does.
FusionPlan plan_optimal(const std::vector<FusionTensor>& t, const CostFunction& cost,
                        std::size_t max_group_bytes = std::numeric_limits<std::size_t>::max());
/// Finish time of the last group when groups run back to back on one channel.
double plan_finish_time(const std::vector<FusionTensor>& t, const FusionPlan& plan, const CostFunction& cost);
/// max(R_N + C(m_N), R_1 + C(sum m)): no plan finishes earlier.
double finish_time_lower_bound(const std::vector<FusionTensor>& t, const CostFunction& cost);

/// Horovod's default fusion threshold (HOROVOD_FUSION_THRESHOLD): the largest group of the
/// threshold planner unless told otherwise.
constexpr std::size_t kDefaultFusionBytes = std::size_t(64) << 20;

struct PlannerOptions {
  Planner planner = Planner::optimal;
  std::size_t threshold_bytes = kDefaultFusionBytes;
  double mgwfbp_alpha = 0.0;  ///< 0: take alpha from the cost function, C(0)
};
/// Collective, through `engine` (ordered and checked like any operation): ready times are max-reduced over the ranks,
/// rank 0 plans and broadcasts the plan, so every rank issues the same fused calls. Ranks with different tensor counts
/// get a MismatchError naming each rank's count.
FusionPlan decide_plan_on_root(Engine& engine, const std::vector<FusionTensor>& local, const CostFunction& cost,
                               const PlannerOptions& options);
FusionPlan make_plan(const std::vector<FusionTensor>& t, const CostFunction& cost, const PlannerOptions& options);

}  // namespace comm
}  // namespace kdist
