#include <kdist/comm/fusion_plan.hpp>
#include <kdist/core/error.hpp>

#include <algorithm>
#include <cmath>

namespace kdist {
namespace comm {

const char* to_string(Planner p) {
  switch (p) {
    case Planner::none:
      return "none";
    case Planner::threshold:
      return "threshold";
    case Planner::mgwfbp:
      return "mgwfbp";
    case Planner::optimal:
      return "optimal";
  }
  return "unknown";
}

int FusionPlan::group_of(int i) const {
  const auto it = std::upper_bound(group_end.begin(), group_end.end(), i);
  return static_cast<int>(it - group_end.begin());
}

FusionPlan plan_none(std::size_t n) {
  FusionPlan p;
  for (std::size_t i = 1; i <= n; ++i) p.group_end.push_back(static_cast<int>(i));
  return p;
}

FusionPlan plan_threshold(const std::vector<FusionTensor>& t, std::size_t threshold) {
  FusionPlan p;
  std::size_t fill = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (i > 0 && fill > 0 && fill + t[i].bytes > threshold) {
      p.group_end.push_back(static_cast<int>(i));
      fill = 0;
    }
    fill += t[i].bytes;
  }
  if (!t.empty()) p.group_end.push_back(static_cast<int>(t.size()));
  return p;
}

FusionPlan plan_mgwfbp(const std::vector<FusionTensor>& t, const CostFunction& cost, double alpha) {
  FusionPlan p;
  double finish = -std::numeric_limits<double>::infinity();
  std::size_t group_bytes = 0;
  for (std::size_t l = 0; l < t.size(); ++l) {
    group_bytes += t[l].bytes;
    const double start = std::max(finish, t[l].ready);
    const bool last = l + 1 == t.size();
    if (!last && t[l + 1].ready - start < alpha) continue;  // merge l into the next group
    finish = start + cost(static_cast<double>(group_bytes));
    p.group_end.push_back(static_cast<int>(l + 1));
    group_bytes = 0;
  }
  return p;
}

FusionPlan plan_optimal(const std::vector<FusionTensor>& t, const CostFunction& cost, std::size_t max_group_bytes) {
  const std::size_t n = t.size();
  FusionPlan p;
  if (n == 0) return p;
  std::vector<double> F(n + 1, std::numeric_limits<double>::infinity());
  std::vector<std::size_t> from(n + 1, 0);
  std::vector<double> prefix(n + 1, 0.0);
  for (std::size_t j = 0; j < n; ++j) prefix[j + 1] = prefix[j] + static_cast<double>(t[j].bytes);
  F[0] = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 1; j <= n; ++j) {
    // group = tensors i..j (1-based), ready when tensor j is
    for (std::size_t i = j; i >= 1; --i) {
      const double bytes = prefix[j] - prefix[i - 1];
      if (i < j && bytes > static_cast<double>(max_group_bytes)) break;
      const double f = std::max(F[i - 1], t[j - 1].ready) + cost(bytes);
      if (f < F[j]) {
        F[j] = f;
        from[j] = i;
      }
    }
  }
  std::vector<int> ends;
  for (std::size_t j = n; j >= 1; j = from[j] - 1) {
    ends.push_back(static_cast<int>(j));
    if (from[j] == 1) break;
  }
  p.group_end.assign(ends.rbegin(), ends.rend());
  return p;
}

double plan_finish_time(const std::vector<FusionTensor>& t, const FusionPlan& plan, const CostFunction& cost) {
  double finish = -std::numeric_limits<double>::infinity();
  int begin = 0;
  for (int end : plan.group_end) {
    double bytes = 0;
    for (int i = begin; i < end; ++i) bytes += static_cast<double>(t[static_cast<std::size_t>(i)].bytes);
    finish = std::max(finish, t[static_cast<std::size_t>(end - 1)].ready) + cost(bytes);
    begin = end;
  }
  return finish;
}

double finish_time_lower_bound(const std::vector<FusionTensor>& t, const CostFunction& cost) {
  if (t.empty()) return 0.0;
  double total = 0;
  for (const auto& x : t) total += static_cast<double>(x.bytes);
  return std::max(t.back().ready + cost(static_cast<double>(t.back().bytes)), t.front().ready + cost(total));
}

FusionPlan make_plan(const std::vector<FusionTensor>& t, const CostFunction& cost, const PlannerOptions& o) {
  switch (o.planner) {
    case Planner::none:
      return plan_none(t.size());
    case Planner::threshold:
      return plan_threshold(t, o.threshold_bytes);
    case Planner::mgwfbp:
      return plan_mgwfbp(t, cost, o.mgwfbp_alpha > 0 ? o.mgwfbp_alpha : cost(0.0));
    case Planner::optimal:
      return plan_optimal(t, cost);
  }
  return plan_none(t.size());
}

FusionPlan decide_plan_on_root(Engine& engine, const std::vector<FusionTensor>& local, const CostFunction& cost,
                               const PlannerOptions& options) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  const std::size_t n = local.size();
  std::vector<double> ready(n);
  for (std::size_t i = 0; i < n; ++i) ready[i] = local[i].ready;
  ready = engine.allreduce_values(std::move(ready), ReduceOp::max, "kdist::comm::decide_plan_on_root: ready times");
  // Group ends, padded with 0: at most one group per tensor.
  Kokkos::View<int*, Kokkos::HostSpace> ends("kdist::comm::plan::group_ends", n);
  if (engine.rank() == 0) {
    std::vector<FusionTensor> t = local;
    for (std::size_t i = 0; i < n; ++i) t[i].ready = ready[i];
    const FusionPlan p = make_plan(t, cost, options);
    for (std::size_t g = 0; g < p.group_end.size(); ++g) ends(g) = p.group_end[g];
  }
  engine.broadcast(Host(), ends, 0, "kdist::comm::decide_plan_on_root: plan").wait();
  FusionPlan p;
  for (std::size_t g = 0; g < n && ends(g) > 0; ++g) p.group_end.push_back(ends(g));
  return p;
}

}  // namespace comm
}  // namespace kdist
