#include <kdist/core/error.hpp>
#include <kdist/core/packed.hpp>
#include <kdist/kfac/placement.hpp>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <numeric>
#include <utility>

// Notation: P ranks, item i with inv_i = inverse(d_i), bc_i = broadcast(d_i), c_i = inv_i + bc_i.
// An assignment puts each item either NCT (inv_i on every rank) or CT on one rank (c_i there).
//
// Lower bound. Take any assignment with makespan M.
//  (a) Item i as CT puts c_i on its owner. As NCT it puts inv_i on every rank, and the other items
//      put at least W - w_i in total on the ranks (w_j and W as in (b)), so some rank carries
//      inv_i + (W - w_i)/P. Hence M >= min(c_i, inv_i + (W - w_i)/P) >= inv_i for every i. (The
//      first version used inv_i alone; at 64 ranks on the SPD-KFAC testbed's models the largest
//      factor is CT at inv + bcast, and LBP's makespan looked 1.25x the bound while it is optimal.)
//  (b) The total load over ranks is sum_i w_i with w_i = P inv_i (NCT) or c_i (CT), so
//      w_i >= min(P inv_i, c_i); the largest of P loads is at least their mean:
//      M >= (1/P) sum_i min(P inv_i, c_i).
//  Hence LB = max((a), (b)) <= M for every assignment, in particular for the optimum OPT.
//
// LBP bound (P >= 2). LBP splits the items into I (NCT: inv_i < bc_i) and C (CT: inv_i >= bc_i).
// Every rank carries all of N_I = sum_{i in I} inv_i, so LBP = N_I + M_C with M_C the largest CT
// load. Adding N_I to every rank does not change which rank has the least load, so the CT part is
// greedy list scheduling of the c_i in some order (Graham; no monotonicity of the models in d is
// assumed, so the order does not matter here): when the item j that ends last on the fullest rank
// was placed, that rank had the least CT load, at most (W_C - c_j)/P with W_C = sum_{i in C} c_i, so
//      M_C <= W_C/P + (1 - 1/P) c_j <= W_C/P + (1 - 1/P) c_max,   c_max = max_{i in C} c_i <= W_C.
// Against LB:
//  - i in C: bc_i <= inv_i gives c_i <= 2 inv_i <= P inv_i, so min(P inv_i, c_i) = c_i;
//  - i in I: bc_i > inv_i gives c_i > 2 inv_i, so min(P inv_i, c_i) >= 2 inv_i (P >= 2);
//    so P OPT >= 2 N_I + W_C;
//  - i in C: c_i <= 2 inv_i <= 2 OPT by (a), so c_max <= 2 OPT.
// Then, writing N_I + W_C/P = (2 N_I + W_C)/2 - (1/2 - 1/P) W_C and using W_C >= c_max:
//      LBP <= P OPT/2 - (1/2 - 1/P) c_max + (1 - 1/P) c_max = P OPT/2 + c_max/2 <= (P/2 + 1) OPT.
// With C empty the same holds with c_max = 0. For P == 1 every factor is local and LBP = OPT.
// The P/2 term is tight: P items with bc_i slightly above inv_i are NCT under LBP (P inv), while
// one per rank as CT costs about 2 inv. For P = 2, one item with inv = bc shows 2 is tight too.

namespace kdist {
namespace kfac {
namespace {

constexpr const char* kPlace = "kdist::kfac::place";

void check_ranks(const char* func, int ranks) {
  if (ranks < 1) impl::throw_invalid(func, "ranks must be >= 1, got " + std::to_string(ranks));
}

void check_dim(const char* func, int d, const std::string& what) {
  if (d < 1) impl::throw_invalid(func, what + " dimension must be >= 1, got " + std::to_string(d));
}

/// Modelled inverse and broadcast seconds per item, in the caller's order.
struct Costs {
  std::vector<double> inv, bc;
  std::size_t size() const { return inv.size(); }
  double ct(std::size_t i) const { return inv[i] + bc[i]; }
};

Costs costs_of(const char* func, const std::vector<PlacementItem>& items, const PlacementModels& models) {
  if (models.element_bytes < 1) impl::throw_invalid(func, "element_bytes must be >= 1, got 0");
  Costs c;
  for (std::size_t i = 0; i < items.size(); ++i) {
    check_dim(func, items[i].dim, "item " + std::to_string(i) + " '" + items[i].label + "'");
    if (!(items[i].work > 0 && items[i].work <= 1))
      impl::throw_invalid(func, "item " + std::to_string(i) + " '" + items[i].label + "': work " +
                                    std::to_string(items[i].work) + " is outside (0, 1]");
    c.inv.push_back(models.inverse_time(items[i].dim, items[i].work));
    c.bc.push_back(models.broadcast_time(items[i].dim));
  }
  return c;
}

double makespan(const Costs& c, int ranks, const std::vector<int>& owner, std::vector<double>* load) {
  std::vector<double> l(ranks, 0.0);
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (owner[i] >= 0) {
      l[owner[i]] += c.ct(i);
    } else {
      for (double& x : l) x += c.inv[i];
    }
  }
  const double m = *std::max_element(l.begin(), l.end());
  if (load) *load = std::move(l);
  return m;
}

double lower_bound(const Costs& c, int ranks) {
  std::vector<double> w(c.size());
  double work = 0.0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    w[i] = std::min(ranks * c.inv[i], c.ct(i));
    work += w[i];
  }
  double single = 0.0;
  for (std::size_t i = 0; i < c.size(); ++i)
    single = std::max(single, std::min(c.ct(i), c.inv[i] + (work - w[i]) / ranks));
  return std::max(single, work / ranks);
}

/// Item indices, largest dimension first, ties in input order.
std::vector<int> largest_first(const std::vector<PlacementItem>& items) {
  std::vector<int> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return items[a].dim > items[b].dim; });
  return order;
}

/// Algorithm 1. NCT loads are common to all ranks, so the least-loaded rank is chosen on the CT
/// loads alone (the same choice as on the full loads, without rounding differences between ranks).
std::vector<int> lbp_owner(const Costs& c, const std::vector<int>& order, int ranks) {
  std::vector<int> owner(c.size(), -1);
  std::vector<double> ct(ranks, 0.0);
  for (int i : order) {
    if (c.inv[i] < c.bc[i]) continue;
    const int r = static_cast<int>(std::min_element(ct.begin(), ct.end()) - ct.begin());
    owner[i] = r;
    ct[r] += c.ct(i);
  }
  return owner;
}

std::vector<int> sequential_owner(std::size_t n, int ranks) {
  std::vector<int> owner(n);
  for (std::size_t i = 0; i < n; ++i) owner[i] = static_cast<int>(i % ranks);
  return owner;
}

/// Exact minimum makespan over {NCT, rank 0..P-1}^N. Items largest first. Symmetries removed: an
/// item goes to a rank already used or to the first unused one (unused ranks are alike), and within
/// a run of equal dimensions (equal costs) the choices do not decrease (NCT < rank 0 < rank 1 ...).
/// Both can hold at once: relabel ranks by first use, then sort each run's choices; the new ranks of
/// a run then appear in increasing order, each right after the ones before it.
/// Node bound: max(current makespan, (current total + remaining min work)/P, NCT load + least CT
/// load + largest remaining inverse), the lower bound's two arguments applied to the remainder.
class BranchAndBound {
 public:
  BranchAndBound(const Costs& c, const std::vector<PlacementItem>& items, const std::vector<int>& order, int ranks)
      : order_(order), p_(ranks), ct_(ranks, 0.0), choice_(order.size(), -1) {
    const std::size_t n = order.size();
    inv_.resize(n);
    cost_.resize(n);
    same_.resize(n);
    rest_work_.assign(n + 1, 0.0);
    rest_inv_.assign(n + 1, 0.0);
    for (std::size_t k = n; k-- > 0;) {
      const int i = order[k];
      inv_[k] = c.inv[i];
      cost_[k] = c.ct(i);
      same_[k] = k > 0 && items[order[k - 1]].dim == items[i].dim;
      rest_work_[k] = rest_work_[k + 1] + std::min(p_ * inv_[k], cost_[k]);
      rest_inv_[k] = std::max(rest_inv_[k + 1], inv_[k]);
    }
  }

  /// Searches for a plan strictly better than `seed` (caller's order); returns false if it stopped
  /// at kOptimalMaxNodes. best() is the best plan found (the seed if none beat it).
  bool run(const std::vector<int>& seed) {
    best_owner_ = seed;
    best_ = evaluate(seed);
    search(0, 0);
    return nodes_ <= kOptimalMaxNodes;
  }
  const std::vector<int>& best() const { return best_owner_; }

 private:
  double evaluate(const std::vector<int>& owner) const {  // in search order, as the search sums
    std::vector<double> ct(p_, 0.0);
    double nct = 0.0;
    for (std::size_t k = 0; k < order_.size(); ++k) {
      const int r = owner[order_[k]];
      (r < 0 ? nct : ct[r]) += r < 0 ? inv_[k] : cost_[k];
    }
    return nct + *std::max_element(ct.begin(), ct.end());
  }

  double bound(std::size_t k) const {
    const auto mm = std::minmax_element(ct_.begin(), ct_.end());
    const double now = nct_ + *mm.second;
    const double work = (p_ * nct_ + ct_sum_ + rest_work_[k]) / p_;
    return std::max({now, work, nct_ + *mm.first + rest_inv_[k]});
  }

  void search(std::size_t k, int used) {
    if (++nodes_ > kOptimalMaxNodes) return;
    if (k == order_.size()) return leaf();
    if (bound(k) >= best_) return;
    const int lowest = same_[k] ? choice_[k - 1] : -1;
    for (int r : children(k, used, lowest)) {
      if (nodes_ > kOptimalMaxNodes) return;
      choice_[k] = r;
      // Restore saved values rather than subtract: the sums stay exactly those of evaluate().
      double& slot = r < 0 ? nct_ : ct_[r];
      const double saved_slot = slot, saved_sum = ct_sum_;
      slot += r < 0 ? inv_[k] : cost_[k];
      if (r >= 0) ct_sum_ += cost_[k];
      search(k + 1, std::max(used, r + 1));
      slot = saved_slot;
      ct_sum_ = saved_sum;
    }
  }

  /// Allowed choices for item k, most promising (smallest makespan after placing it) first.
  std::vector<int> children(std::size_t k, int used, int lowest) const {
    std::vector<int> out;
    const int last = std::min(used, p_ - 1);
    for (int r = lowest; r <= last; ++r) out.push_back(r);
    const double top = *std::max_element(ct_.begin(), ct_.end());
    auto after = [&](int r) { return r < 0 ? inv_[k] + top : std::max(top, ct_[r] + cost_[k]); };
    std::stable_sort(out.begin(), out.end(), [&](int a, int b) { return after(a) < after(b); });
    return out;
  }

  void leaf() {
    const double m = nct_ + *std::max_element(ct_.begin(), ct_.end());
    if (m >= best_) return;
    best_ = m;
    for (std::size_t k = 0; k < order_.size(); ++k) best_owner_[order_[k]] = choice_[k];
  }

  const std::vector<int>& order_;
  int p_;
  std::vector<double> inv_, cost_, rest_work_, rest_inv_;  // per search position
  std::vector<bool> same_;                                 // dim equal to the previous position's
  std::vector<double> ct_;
  std::vector<int> choice_, best_owner_;
  double nct_ = 0.0, ct_sum_ = 0.0, best_ = 0.0;
  long long nodes_ = 0;
};

/// The optimal plan's owners; *exact tells whether the search finished.
std::vector<int> optimal_owner(const Costs& c, const std::vector<PlacementItem>& items, int ranks, bool* exact) {
  const std::vector<int> order = largest_first(items);
  const std::vector<int> seed = lbp_owner(c, order, ranks);
  *exact = false;
  if (static_cast<long long>(items.size()) * ranks > kOptimalMaxItemsTimesRanks) return seed;
  BranchAndBound bb(c, items, order, ranks);
  *exact = bb.run(seed);
  // The search sums in its own order; keep the seed unless the found plan is better as evaluated.
  const std::vector<int>& found = bb.best();
  return makespan(c, ranks, found, nullptr) <= makespan(c, ranks, seed, nullptr) ? found : seed;
}

// Channel model. compute_r = sum of rank r's CT inverses + every NCT inverse; the channel sends the
// CT broadcasts one after another, the first once the first CT inverse is done (the cheapest, at best).
double channel_makespan(const Costs& c, int ranks, const std::vector<int>& owner, std::vector<double>* load) {
  std::vector<double> compute(static_cast<std::size_t>(ranks), 0.0);
  double nct = 0.0, channel = 0.0, first = -1.0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (owner[i] < 0) {
      nct += c.inv[i];
      continue;
    }
    compute[static_cast<std::size_t>(owner[i])] += c.inv[i];
    channel += c.bc[i];
    first = first < 0 ? c.inv[i] : std::min(first, c.inv[i]);
  }
  for (double& x : compute) x += nct;
  const double m = std::max(*std::max_element(compute.begin(), compute.end()), first < 0 ? 0.0 : first + channel);
  if (load) *load = std::move(compute);
  return m;
}

// Lower bound in the channel model, for any assignment with CT set C (x_i = 1 for i in C):
//  - every item is inverted by someone before anything that needs it ends: T >= max_i inv_i;
//  - the channel carries sum_{i in C} bc_i;
//  - the fullest rank computes at least the mean, every NCT inverse plus 1/P of the CT ones:
//    sum_i inv_i - (1 - 1/P) sum_{i in C} inv_i.
// So T >= max(max_i inv_i, min over x in [0, 1]^N of max(sum x_i bc_i, sum inv_i - (1 - 1/P) sum x_i inv_i)),
// the integral x relaxed to fractions. For a given t the second is feasible iff the most inverse
// time that fits in a channel budget t, a fractional knapsack (items by inv_i / bc_i, decreasing),
// reaches (sum inv - t) / (1 - 1/P); bisection on t finds the least feasible t.
double channel_bound(const Costs& c, int ranks) {
  double total = 0.0, largest = 0.0;
  for (double x : c.inv) {
    total += x;
    largest = std::max(largest, x);
  }
  if (ranks == 1) return total;
  std::vector<std::size_t> by_ratio(c.size());
  std::iota(by_ratio.begin(), by_ratio.end(), std::size_t{0});
  std::sort(by_ratio.begin(), by_ratio.end(),
            [&](std::size_t a, std::size_t b) { return c.inv[a] * c.bc[b] > c.inv[b] * c.bc[a]; });
  const double spread = 1.0 - 1.0 / ranks;
  auto feasible = [&](double t) {
    double budget = t, moved = 0.0;
    for (std::size_t i : by_ratio) {
      const double share = c.bc[i] <= budget ? 1.0 : budget / c.bc[i];
      moved += share * c.inv[i];
      budget -= share * c.bc[i];
      if (share < 1.0) break;
    }
    return total - spread * moved <= t;
  };
  double lo = 0.0, hi = total;
  for (int k = 0; k < 100 && hi - lo > 1e-12 * total; ++k) (feasible((lo + hi) / 2) ? hi : lo) = (lo + hi) / 2;
  return std::max(largest, hi);
}

// Every CT factor (ct[i]) placed by largest inverse first on the rank that computes least so far.
std::vector<int> ct_by_inverse(const Costs& c, const std::vector<bool>& ct, int ranks) {
  std::vector<std::size_t> order(c.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return c.inv[a] > c.inv[b]; });
  std::vector<int> owner(c.size(), -1);
  std::vector<double> compute(static_cast<std::size_t>(ranks), 0.0);
  for (std::size_t i : order) {
    if (!ct[i]) continue;
    const auto r = static_cast<std::size_t>(std::min_element(compute.begin(), compute.end()) - compute.begin());
    owner[i] = static_cast<int>(r);
    compute[r] += c.inv[i];
  }
  return owner;
}

std::vector<int> channel_owner(const Costs& c, const std::vector<PlacementItem>& items, int ranks) {
  std::vector<int> best = lbp_owner(c, largest_first(items), ranks);
  double best_time = channel_makespan(c, ranks, best, nullptr);
  std::vector<std::size_t> by_saving(c.size());
  std::iota(by_saving.begin(), by_saving.end(), std::size_t{0});
  std::stable_sort(by_saving.begin(), by_saving.end(),
                   [&](std::size_t a, std::size_t b) { return c.bc[a] * c.inv[b] > c.bc[b] * c.inv[a]; });
  std::vector<bool> ct(c.size(), true);
  for (std::size_t k = 0; k <= c.size(); ++k) {
    if (k > 0) ct[by_saving[k - 1]] = false;
    std::vector<int> owner = ct_by_inverse(c, ct, ranks);
    const double t = channel_makespan(c, ranks, owner, nullptr);
    if (t < best_time) {
      best_time = t;
      best = std::move(owner);
    }
  }
  return best;
}

std::vector<int> owners(PlacementKind kind, const Costs& c, const std::vector<PlacementItem>& items, int ranks,
                        bool* exact) {
  *exact = false;
  if (ranks == 1) {
    *exact = kind == PlacementKind::optimal;
    return std::vector<int>(c.size(), -1);
  }
  switch (kind) {
    case PlacementKind::lbp:
      return lbp_owner(c, largest_first(items), ranks);
    case PlacementKind::sequential:
      return sequential_owner(c.size(), ranks);
    case PlacementKind::replicated:
      return std::vector<int>(c.size(), -1);
    case PlacementKind::optimal:
      return optimal_owner(c, items, ranks, exact);
    case PlacementKind::channel:
      return channel_owner(c, items, ranks);
  }
  impl::throw_invalid(kPlace, "unknown placement kind " + std::to_string(static_cast<int>(kind)));
}

void check_owner(const char* func, std::size_t items, int ranks, const std::vector<int>& owner) {
  if (owner.size() != items)
    impl::throw_invalid(
        func, "owner list has " + std::to_string(owner.size()) + " entries for " + std::to_string(items) + " items");
  for (std::size_t i = 0; i < owner.size(); ++i)
    if (owner[i] < -1 || owner[i] >= ranks)
      impl::throw_invalid(func, "owner[" + std::to_string(i) + "] = " + std::to_string(owner[i]) + " is outside [-1, " +
                                    std::to_string(ranks) + ")");
}

/// The makespan of `owner` in kind's model (the channel model for channel, else the load model).
double modelled_makespan(PlacementKind kind, const Costs& c, int ranks, const std::vector<int>& owner,
                         std::vector<double>* load) {
  return kind == PlacementKind::channel ? channel_makespan(c, ranks, owner, load) : makespan(c, ranks, owner, load);
}

/// A plan handed in from outside (a public struct): its owners and cost lists must agree with it.
void check_plan(const char* func, const Placement& p) {
  check_ranks(func, p.ranks);
  if (p.inverse_s.size() != p.owner.size() || p.broadcast_s.size() != p.owner.size())
    impl::throw_invalid(func, "the plan has " + std::to_string(p.owner.size()) + " owners, " +
                                  std::to_string(p.inverse_s.size()) + " inverse and " +
                                  std::to_string(p.broadcast_s.size()) + " broadcast costs");
  check_owner(func, p.owner.size(), p.ranks, p.owner);
}

}  // namespace

namespace {
struct KindName {
  PlacementKind kind;
  const char* name;
};
constexpr KindName kKindNames[] = {{PlacementKind::lbp, "lbp"},
                                   {PlacementKind::sequential, "sequential"},
                                   {PlacementKind::replicated, "replicated"},
                                   {PlacementKind::optimal, "optimal"},
                                   {PlacementKind::channel, "channel"}};
}  // namespace

const char* to_string(PlacementKind kind) {
  for (const KindName& k : kKindNames)
    if (k.kind == kind) return k.name;
  return "unknown";
}

bool parse_placement(const std::string& text, PlacementKind* out) {
  for (const KindName& k : kKindNames)
    if (text == k.name) {
      *out = k.kind;
      return true;
    }
  return false;
}

double PlacementModels::inverse_time(int d, double work) const {
  check_dim("kdist::kfac::PlacementModels::inverse_time", d, "factor");
  const double x = static_cast<double>(d);
  return inverse.time(work * x * x * x);
}

double PlacementModels::broadcast_time(int d) const {
  check_dim("kdist::kfac::PlacementModels::broadcast_time", d, "factor");
  return broadcast.time(static_cast<double>(packed_size(static_cast<std::size_t>(d))) *
                        static_cast<double>(element_bytes));
}

PlacementModels PlacementModels::from_store(const CostModelStore& store, DType dtype, int ranks) {
  check_ranks("kdist::kfac::PlacementModels::from_store", ranks);
  PlacementModels m;
  m.inverse = store.get(CostKey{CostOp::spd_inverse, DType::float64, 1, "local"});
  m.broadcast = store.get(CostKey{CostOp::broadcast, dtype, ranks, "world"});
  m.element_bytes = size_of(dtype);
  return m;
}

Placement place(const std::vector<PlacementItem>& items, const PlacementModels& models, int ranks, PlacementKind kind) {
  check_ranks(kPlace, ranks);
  const Costs c = costs_of(kPlace, items, models);
  Placement p;
  p.kind = kind;
  p.ranks = ranks;
  p.owner = owners(kind, c, items, ranks, &p.exact);
  p.inverse_s = c.inv;
  p.broadcast_s = c.bc;
  const bool channel = kind == PlacementKind::channel;
  p.modelled_time = modelled_makespan(kind, c, ranks, p.owner, &p.load);
  p.lower_bound = channel ? channel_bound(c, ranks) : lower_bound(c, ranks);
  return p;
}

double placement_time(const std::vector<PlacementItem>& items, const PlacementModels& models, int ranks,
                      const std::vector<int>& owner, std::vector<double>* load) {
  constexpr const char* func = "kdist::kfac::placement_time";
  check_ranks(func, ranks);
  check_owner(func, items.size(), ranks, owner);
  return makespan(costs_of(func, items, models), ranks, owner, load);
}

double placement_lower_bound(const std::vector<PlacementItem>& items, const PlacementModels& models, int ranks) {
  constexpr const char* func = "kdist::kfac::placement_lower_bound";
  check_ranks(func, ranks);
  return lower_bound(costs_of(func, items, models), ranks);
}

double channel_time(const std::vector<PlacementItem>& items, const PlacementModels& models, int ranks,
                    const std::vector<int>& owner, std::vector<double>* load) {
  constexpr const char* func = "kdist::kfac::channel_time";
  check_ranks(func, ranks);
  check_owner(func, items.size(), ranks, owner);
  return channel_makespan(costs_of(func, items, models), ranks, owner, load);
}

double channel_lower_bound(const std::vector<PlacementItem>& items, const PlacementModels& models, int ranks) {
  constexpr const char* func = "kdist::kfac::channel_lower_bound";
  check_ranks(func, ranks);
  return channel_bound(costs_of(func, items, models), ranks);
}

Placement with_owners(const Placement& p, const std::vector<int>& owner) {
  constexpr const char* func = "kdist::kfac::with_owners";
  check_plan(func, p);
  check_owner(func, p.owner.size(), p.ranks, owner);
  Placement q = p;
  q.owner = owner;
  q.exact = false;
  const Costs c{p.inverse_s, p.broadcast_s};
  q.modelled_time = modelled_makespan(p.kind, c, p.ranks, owner, &q.load);
  return q;
}

double lbp_bound_factor(int ranks) {
  check_ranks("kdist::kfac::lbp_bound_factor", ranks);
  return ranks == 1 ? 1.0 : ranks / 2.0 + 1.0;
}

// Broadcast order. The broadcasts share one channel (the Engine keeps collectives in submission
// order) and each can start only once its owner has inverted it, so the inverse phase is a flow
// shop: P owners feed one channel. The first version submitted rounds (every rank's k-th factor,
// ranks in order); under LBP rank 0 owns the largest factor, so the channel idled through that
// inverse while smaller factors waited behind it (the scale model showed LBP losing to round-robin
// at 8-64 ranks on the paper's testbed that way). Now:
//  - one owner and the channel form a two-machine flow shop, for which Johnson's rule (inverse <=
//    broadcast first by increasing inverse, then the others by decreasing broadcast) minimises the
//    time the last broadcast ends (Johnson 1954);
//  - across owners the channel takes factors as they become ready: sorting by each factor's ready
//    time (its owner's cumulative inverse time) is what a channel serving in arrival order does.
// Ties (equal doubles on every rank, since place() is deterministic) go by owner, then index.
std::vector<int> broadcast_order(const Placement& p) {
  check_plan("kdist::kfac::broadcast_order", p);
  struct Entry {
    double ready;
    int owner, index;
  };
  std::vector<std::vector<int>> owned(static_cast<std::size_t>(std::max(p.ranks, 1)));
  for (std::size_t i = 0; i < p.owner.size(); ++i)
    if (p.owner[i] >= 0) owned[static_cast<std::size_t>(p.owner[i])].push_back(static_cast<int>(i));
  std::vector<Entry> entries;
  for (std::size_t r = 0; r < owned.size(); ++r) {
    auto& list = owned[r];
    auto first = [&](int i) {
      return p.inverse_s[static_cast<std::size_t>(i)] <= p.broadcast_s[static_cast<std::size_t>(i)];
    };
    std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
      const auto ua = static_cast<std::size_t>(a), ub = static_cast<std::size_t>(b);
      if (first(a) != first(b)) return first(a);
      if (first(a)) return p.inverse_s[ua] < p.inverse_s[ub];
      return p.broadcast_s[ua] > p.broadcast_s[ub];
    });
    double ready = 0;
    for (int i : list) {
      ready += p.inverse_s[static_cast<std::size_t>(i)];
      entries.push_back({ready, static_cast<int>(r), i});
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    if (a.ready != b.ready) return a.ready < b.ready;
    return a.owner != b.owner ? a.owner < b.owner : a.index < b.index;
  });
  std::vector<int> order;
  for (const Entry& e : entries) order.push_back(e.index);
  return order;
}

std::vector<InverseTask> inverse_tasks(const Placement& p, int rank) {
  if (rank < 0 || rank >= p.ranks)
    impl::throw_invalid("kdist::kfac::inverse_tasks",
                        "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(p.ranks) + ")");
  std::vector<InverseTask> tasks;
  for (int f : broadcast_order(p)) {
    const int root = p.owner[static_cast<std::size_t>(f)];
    tasks.push_back({root == rank ? InverseTask::Kind::invert_and_broadcast : InverseTask::Kind::receive, f, root});
  }
  for (std::size_t f = 0; f < p.owner.size(); ++f)
    if (p.owner[f] < 0) tasks.push_back({InverseTask::Kind::invert_local, static_cast<int>(f), -1});
  return tasks;
}

namespace {
__attribute__((format(printf, 2, 3))) void append(std::string* out, const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  *out += buf;
}
}  // namespace

std::string Placement::describe(const std::vector<PlacementItem>& items) const {
  if (items.size() != owner.size() || inverse_s.size() != owner.size())
    impl::throw_invalid("kdist::kfac::Placement::describe",
                        "got " + std::to_string(items.size()) + " items for a plan of " + std::to_string(owner.size()));
  int w = 6;
  for (const PlacementItem& it : items) w = std::max(w, static_cast<int>(it.label.size()));
  std::string s;
  append(&s, "inverse placement %s: %zu factors on %d ranks\n", to_string(kind), items.size(), ranks);
  append(&s, "  %-*s %7s %4s %5s %12s %12s\n", w, "factor", "dim", "type", "owner", "inverse ms", "bcast ms");
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string who = owner[i] < 0 ? "all" : std::to_string(owner[i]);
    append(&s, "  %-*s %7d %4s %5s %12.4g %12.4g\n", w, items[i].label.c_str(), items[i].dim,
           owner[i] < 0 ? "NCT" : "CT", who.c_str(), inverse_s[i] * 1e3, broadcast_s[i] * 1e3);
  }
  for (std::size_t r = 0; r < load.size(); ++r) append(&s, "  rank %zu load %.4g ms\n", r, load[r] * 1e3);
  append(&s, "  makespan %.4g ms, lower bound %.4g ms, ratio %.4g%s\n", modelled_time * 1e3, lower_bound * 1e3,
         lower_bound > 0 ? modelled_time / lower_bound : 1.0,
         kind == PlacementKind::optimal && !exact ? " (not proven optimal)" : "");
  return s;
}

}  // namespace kfac
}  // namespace kdist
