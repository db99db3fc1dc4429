// Inverse placement (kfac/placement.hpp): the CT/NCT rule, LBP, sequential and replicated shapes,
// the branch-and-bound optimum against a brute-force enumeration written here, the lower bound
// and LBP's proven factor, the channel placement by hand and against its own brute force,
// describe() and input checks.
#include <catch2/catch.hpp>
#include <kdist/core/error.hpp>
#include <kdist/kfac/placement.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

using Catch::Matchers::Contains;
using kdist::CostModel;
using kdist::InvalidArgument;
using kdist::kfac::place;
using kdist::kfac::Placement;
using kdist::kfac::placement_time;
using kdist::kfac::PlacementItem;
using kdist::kfac::PlacementKind;
using kdist::kfac::PlacementModels;

namespace {

/// inverse(d) = ai + bi d^3, broadcast(d) = ab + bb * bytes.
struct Linear {
  double ai, bi, ab, bb;
  std::size_t bytes = 4;
  PlacementModels models() const {
    PlacementModels m;
    m.inverse = CostModel::linear(ai, bi);
    m.broadcast = CostModel::linear(ab, bb);
    m.element_bytes = bytes;
    return m;
  }
  double inv(int d) const { return ai + bi * (double(d) * d * d); }
  double bc(int d) const { return ab + bb * (double(d) * (d + 1) / 2 * bytes); }
};

std::vector<PlacementItem> items_of(const std::vector<int>& dims) {
  std::vector<PlacementItem> items;
  for (std::size_t i = 0; i < dims.size(); ++i) items.push_back({"f" + std::to_string(i), dims[i]});
  return items;
}

/// Per-item times from the formulas above, not through the library.
struct Times {
  std::vector<double> inv, bc;
  Times(const Linear& m, const std::vector<int>& dims) {
    for (int d : dims) {
      inv.push_back(m.inv(d));
      bc.push_back(m.bc(d));
    }
  }
};

/// Makespan of `owner` under the load model, one pass over the items.
double brute_eval(const Times& t, int ranks, const std::vector<int>& owner, std::vector<double>& load) {
  double nct = 0.0;
  load.assign(ranks, 0.0);
  for (std::size_t i = 0; i < owner.size(); ++i) {
    if (owner[i] < 0) nct += t.inv[i];
    if (owner[i] >= 0) load[owner[i]] += t.inv[i] + t.bc[i];
  }
  for (double& l : load) l += nct;
  return *std::max_element(load.begin(), load.end());
}

/// Minimum of brute_eval over all (P+1)^N assignments (odometer over {-1, 0..P-1}).
double brute_optimum(const Times& t, int ranks) {
  std::vector<int> owner(t.inv.size(), -1);
  std::vector<double> load;
  double best = std::numeric_limits<double>::infinity();
  while (true) {
    best = std::min(best, brute_eval(t, ranks, owner, load));
    std::size_t i = 0;
    while (i < owner.size() && owner[i] == ranks - 1) owner[i++] = -1;
    if (i == owner.size()) return best;
    ++owner[i];
  }
}

bool near(double a, double b) {
  return std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b));
}

Linear random_linear(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto logu = [&](double lo, double hi) { return lo * std::pow(hi / lo, u(rng)); };
  return Linear{logu(1e-7, 5e-5), logu(3e-11, 3e-10), logu(2e-6, 2e-4), logu(2e-11, 2e-9)};
}

std::vector<int> random_dims(std::mt19937_64& rng, int n) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const bool pooled = u(rng) < 0.3;  // repeated dimensions exercise the search's symmetry rule
  const int pool[] = {16, 64, 65, 257, 512};
  std::vector<int> dims;
  for (int i = 0; i < n; ++i)
    dims.push_back(pooled ? pool[rng() % 5] : static_cast<int>(std::lround(8 * std::pow(128.0, u(rng)))));
  return dims;
}

}  // namespace

TEST_CASE("placement: NCT exactly when the modelled inverse is below the modelled broadcast", "[kfac][placement]") {
  // Constant broadcast equal to inverse(100): d = 100 ties (CT), smaller is NCT, larger CT.
  PlacementModels m;
  m.inverse = CostModel::linear(0.0, 1e-10);
  m.broadcast = CostModel::linear(m.inverse_time(100), 0.0);
  REQUIRE(m.inverse_time(100) == m.broadcast_time(100));
  const std::vector<int> dims{99, 100, 101, 1, 5000};
  const Placement p = place(items_of(dims), m, 3, PlacementKind::lbp);
  CHECK(p.owner[0] == -1);
  CHECK(p.owner[1] >= 0);
  CHECK(p.owner[2] >= 0);
  CHECK(p.owner[3] == -1);
  CHECK(p.owner[4] >= 0);

  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const PlacementModels rm = random_linear(rng).models();
    const std::vector<int> rd = random_dims(rng, 12);
    const Placement q = place(items_of(rd), rm, 4, PlacementKind::lbp);
    for (std::size_t i = 0; i < rd.size(); ++i)
      CHECK((q.owner[i] == -1) == (rm.inverse_time(rd[i]) < rm.broadcast_time(rd[i])));
  }
}

TEST_CASE("placement: LBP gives the largest CT factor to the least-loaded rank", "[kfac][placement]") {
  // Inverse d^3 * 1e-9, no broadcast cost: all CT; largest first, ties to the lowest rank.
  PlacementModels m;
  m.inverse = CostModel::linear(0.0, 1e-9);
  m.broadcast = CostModel::linear(0.0, 0.0);
  const Placement p = place(items_of({10, 30, 20, 30, 10}), m, 2, PlacementKind::lbp);
  // Order 30 (#1) -> 0, 30 (#3) -> 1, 20 (#2) -> 0, 10 (#0) -> 1, 10 (#4) -> 1 (27+1 < 27+8).
  CHECK(p.owner == std::vector<int>{1, 0, 0, 1, 1});
  CHECK(p.load[0] == Approx(35e-6));
  CHECK(p.load[1] == Approx(29e-6));
  CHECK(p.modelled_time == Approx(35e-6));
}

TEST_CASE("placement: optimal equals a brute-force enumeration; LB <= OPT <= LBP <= c(P) OPT",
          "[kfac][placement][slow]") {
  std::mt19937_64 rng(20240611);
  std::vector<double> ratios, worst(5, 1.0);
  int ct = 0, nct = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const Linear lin = random_linear(rng);
    const int n = 1 + static_cast<int>(rng() % 10), ranks = 1 + static_cast<int>(rng() % 4);
    const std::vector<int> dims = random_dims(rng, n);
    const auto items = items_of(dims);
    const PlacementModels m = lin.models();
    INFO("trial " << trial << ", N " << n << ", P " << ranks);
    const Placement opt = place(items, m, ranks, PlacementKind::optimal);
    const Placement lbp = place(items, m, ranks, PlacementKind::lbp);
    const Placement seq = place(items, m, ranks, PlacementKind::sequential);
    const Times t(lin, dims);
    const double brute = brute_optimum(t, ranks);
    REQUIRE(opt.exact);
    CHECK(near(opt.modelled_time, brute));
    std::vector<double> load, brute_load;
    for (const Placement* p : {&opt, &lbp, &seq}) {
      CHECK(near(placement_time(items, m, ranks, p->owner, &load), brute_eval(t, ranks, p->owner, brute_load)));
      for (int r = 0; r < ranks; ++r) CHECK((near(load[r], brute_load[r]) && near(p->load[r], brute_load[r])));
    }
    CHECK(opt.lower_bound <= brute * (1 + 1e-12));
    CHECK(opt.modelled_time <= lbp.modelled_time);
    CHECK(lbp.modelled_time <= kdist::kfac::lbp_bound_factor(ranks) * brute * (1 + 1e-12));
    ratios.push_back(lbp.modelled_time / opt.modelled_time);
    worst[ranks] = std::max(worst[ranks], ratios.back());
    for (int o : lbp.owner) (o < 0 ? nct : ct) += ranks > 1;
  }
  CHECK(ct > 100);
  CHECK(nct > 100);
  std::sort(ratios.begin(), ratios.end());
  std::printf("placement: LBP / optimum over %zu instances: median %.4f, worst %.4f (%d CT, %d NCT factors)\n",
              ratios.size(), ratios[ratios.size() / 2], ratios.back(), ct, nct);
  for (int p = 1; p <= 4; ++p)
    std::printf("  P = %d: worst %.4f, proven bound %.1f\n", p, worst[p], kdist::kfac::lbp_bound_factor(p));
}

namespace {
// The end of the last broadcast when owners invert in `order` and one channel sends in `order`.
double channel_end(const Placement& p, const std::vector<int>& order) {
  std::vector<double> compute(static_cast<std::size_t>(p.ranks), 0.0);
  double channel = 0;
  for (int f : order) {
    double& c = compute[static_cast<std::size_t>(p.owner[static_cast<std::size_t>(f)])];
    c += p.inverse_s[static_cast<std::size_t>(f)];
    channel = std::max(channel, c) + p.broadcast_s[static_cast<std::size_t>(f)];
  }
  return channel;
}
}  // namespace

TEST_CASE("placement: broadcast order is Johnson's per owner and by ready time across owners", "[kfac][placement]") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.1, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    // One owner, up to 6 CT factors: Johnson's order ends the channel as early as any permutation.
    Placement one;
    one.ranks = 2;
    const int n = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < n; ++i) {
      one.owner.push_back(0);
      one.inverse_s.push_back(u(rng));
      one.broadcast_s.push_back(u(rng));
    }
    std::vector<int> perm(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) perm[static_cast<std::size_t>(i)] = i;
    double best = std::numeric_limits<double>::infinity();
    do best = std::min(best, channel_end(one, perm));
    while (std::next_permutation(perm.begin(), perm.end()));
    INFO("trial " << trial << ", " << n << " factors");
    CHECK(channel_end(one, kdist::kfac::broadcast_order(one)) == Approx(best));

    // Random placements: every CT factor once, no NCT, ready times non-decreasing.
    const Linear lin = random_linear(rng);
    const int ranks = 1 + static_cast<int>(rng() % 4);
    const auto items = items_of(random_dims(rng, 1 + static_cast<int>(rng() % 10)));
    const Placement p = place(items, lin.models(), ranks, PlacementKind::lbp);
    const std::vector<int> order = kdist::kfac::broadcast_order(p);
    std::vector<int> ct;
    for (std::size_t i = 0; i < p.owner.size(); ++i)
      if (p.owner[i] >= 0) ct.push_back(static_cast<int>(i));
    std::vector<int> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == ct);
    std::vector<double> ready(static_cast<std::size_t>(ranks), 0.0);
    double last = 0;
    for (int f : order) {
      double& r = ready[static_cast<std::size_t>(p.owner[static_cast<std::size_t>(f)])];
      r += p.inverse_s[static_cast<std::size_t>(f)];
      CHECK(r >= last);
      last = r;
    }
  }
}

TEST_CASE("placement: optimal beats LBP on equal factors and proves it", "[kfac][placement][slow]") {
  // 31 equal factors, inverse 0.6 s and broadcast 0.4 s, on 2 ranks: LBP splits 16/15 (16 s);
  // the optimum keeps one factor local: 15 + 0.6 = 15.6 s (lower bound 31/2 = 15.5 s).
  PlacementModels m;
  m.inverse = CostModel::linear(0.6, 0.0);
  m.broadcast = CostModel::linear(0.4, 0.0);
  const auto items = items_of(std::vector<int>(31, 100));
  const Placement lbp = place(items, m, 2, PlacementKind::lbp);
  const Placement opt = place(items, m, 2, PlacementKind::optimal);
  CHECK(lbp.modelled_time == Approx(16.0));
  CHECK(opt.exact);
  CHECK(opt.modelled_time == Approx(15.6));
  CHECK(opt.lower_bound == Approx(15.5));
  CHECK(std::count(opt.owner.begin(), opt.owner.end(), -1) == 1);
}

TEST_CASE("placement: optimal falls back to LBP above N*P = 64", "[kfac][placement]") {
  std::mt19937_64 rng(3);
  const PlacementModels m = random_linear(rng).models();
  const auto items = items_of(random_dims(rng, 33));
  const Placement opt = place(items, m, 2, PlacementKind::optimal);
  CHECK_FALSE(opt.exact);
  CHECK(opt.owner == place(items, m, 2, PlacementKind::lbp).owner);
  const Placement at_limit = place(items_of(random_dims(rng, 16)), m, 4, PlacementKind::optimal);
  CHECK(at_limit.exact);
}

TEST_CASE("placement: optimal stops at its node limit with a plan no worse than LBP", "[kfac][placement][slow]") {
  // 32 distinct, nearly equal CT factors on 2 ranks: a partition problem the bound cannot close.
  PlacementModels m;
  m.inverse = CostModel::linear(0.0, 1e-10);
  m.broadcast = CostModel::linear(20e-6, 2e-10);
  std::vector<int> dims;
  for (int i = 0; i < 32; ++i) dims.push_back(1000 + (i * 37) % 100);
  const auto items = items_of(dims);
  const Placement opt = place(items, m, 2, PlacementKind::optimal);
  const Placement lbp = place(items, m, 2, PlacementKind::lbp);
  CHECK_FALSE(opt.exact);
  CHECK(opt.modelled_time <= lbp.modelled_time);
  CHECK(opt.modelled_time >= opt.lower_bound);
  CHECK_THAT(opt.describe(items), Contains("not proven optimal"));
}

TEST_CASE("placement: sequential and replicated shapes, P > N, P == 1", "[kfac][placement]") {
  const Linear lin{1e-5, 1e-10, 5e-5, 1e-9};
  const PlacementModels m = lin.models();
  const std::vector<int> dims{300, 20, 785, 256, 10};
  const auto items = items_of(dims);
  const Placement seq = place(items, m, 3, PlacementKind::sequential);
  CHECK(seq.owner == std::vector<int>{0, 1, 2, 0, 1});
  CHECK(seq.load[2] == Approx(lin.inv(785) + lin.bc(785)));
  const Placement rep = place(items, m, 3, PlacementKind::replicated);
  CHECK(rep.owner == std::vector<int>(5, -1));
  double sum = 0.0;
  for (int d : dims) sum += lin.inv(d);
  CHECK(rep.load == std::vector<double>(3, rep.modelled_time));
  CHECK(rep.modelled_time == Approx(sum));

  // 8 ranks, 5 factors: every CT factor has a rank of its own; idle ranks carry only NCT work.
  const Placement wide = place(items, m, 8, PlacementKind::lbp);
  std::vector<int> owners;
  double nct = 0.0;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (wide.owner[i] < 0) nct += lin.inv(dims[i]);
    if (wide.owner[i] >= 0) owners.push_back(wide.owner[i]);
  }
  std::sort(owners.begin(), owners.end());
  CHECK(std::adjacent_find(owners.begin(), owners.end()) == owners.end());
  CHECK(wide.load[7] == Approx(nct));
  CHECK(place(items, m, 8, PlacementKind::sequential).owner == std::vector<int>{0, 1, 2, 3, 4});

  for (PlacementKind k : {PlacementKind::lbp, PlacementKind::sequential, PlacementKind::replicated,
                          PlacementKind::optimal, PlacementKind::channel}) {
    const Placement one = place(items, m, 1, k);
    CHECK(one.owner == std::vector<int>(5, -1));
    CHECK(one.modelled_time == Approx(sum));
    CHECK(one.lower_bound == Approx(sum));
    CHECK(one.exact == (k == PlacementKind::optimal));
  }
  CHECK(place({}, m, 4, PlacementKind::optimal).modelled_time == 0.0);
}

TEST_CASE("placement: describe names every factor, its type and the totals", "[kfac][placement]") {
  const PlacementModels m = Linear{1e-5, 1e-10, 5e-5, 1e-9}.models();
  const std::vector<PlacementItem> items{{"fc1.A", 785}, {"fc1.G", 256}, {"fc2.A", 257}, {"fc2.G", 10}};
  const Placement p = place(items, m, 2, PlacementKind::lbp);
  const std::string s = p.describe(items);
  for (const auto& it : items) CHECK_THAT(s, Contains(it.label));
  CHECK_THAT(s, Contains("lbp") && Contains("NCT") && Contains(" CT ") && Contains("rank 1 load") &&
                    Contains("makespan") && Contains("lower bound"));
  REQUIRE_THROWS_AS(p.describe({items[0]}), InvalidArgument);
  std::printf("%s", s.c_str());
}

TEST_CASE("placement: kind names, models from a store, bad inputs", "[kfac][placement]") {
  for (PlacementKind k : {PlacementKind::lbp, PlacementKind::sequential, PlacementKind::replicated,
                          PlacementKind::optimal, PlacementKind::channel}) {
    PlacementKind back = PlacementKind::lbp;
    CHECK(kdist::kfac::parse_placement(kdist::kfac::to_string(k), &back));
    CHECK(back == k);
  }
  PlacementKind out = PlacementKind::optimal;
  CHECK_FALSE(kdist::kfac::parse_placement("LBP", &out));
  CHECK_FALSE(kdist::kfac::parse_placement("", &out));
  CHECK(out == PlacementKind::optimal);

  kdist::CostModelStore store;
  const PlacementModels defaults = PlacementModels::from_store(store, kdist::DType::float32, 4);
  CHECK(defaults.element_bytes == 4);
  CHECK(defaults.inverse_time(1000) == Approx(0.1));                                        // 1e9 flops at 10 GFLOP/s
  CHECK(defaults.inverse_time(1000, kdist::kfac::kCholeskyFactorWork) == Approx(0.1 / 3));  // potrf alone
  CHECK(defaults.broadcast_time(1000) == Approx(20e-6 + 500500.0 * 4 / 5e9));
  store.set({kdist::CostOp::broadcast, kdist::DType::float64, 4, "world"}, CostModel::linear(1.0, 0.0));
  store.set({kdist::CostOp::broadcast, kdist::DType::float64, 2, "world"}, CostModel::linear(2.0, 0.0));
  const PlacementModels cal = PlacementModels::from_store(store, kdist::DType::float64, 4);
  CHECK(cal.element_bytes == 8);
  CHECK(cal.broadcast_time(10) == 1.0);

  const auto items = items_of({10, 20});
  CHECK_THROWS_WITH(place(items, defaults, 0, PlacementKind::lbp), Contains("ranks must be >= 1, got 0"));
  CHECK_THROWS_AS(kdist::kfac::placement_lower_bound(items, defaults, -1), InvalidArgument);
  CHECK_THROWS_AS(kdist::kfac::channel_lower_bound(items, defaults, 0), InvalidArgument);
  CHECK_THROWS_WITH(kdist::kfac::channel_time(items, defaults, 2, {0, 2}), Contains("owner[1] = 2"));
  CHECK_THROWS_AS(kdist::kfac::lbp_bound_factor(0), InvalidArgument);
  CHECK_THROWS_AS(PlacementModels::from_store(store, kdist::DType::float32, 0), InvalidArgument);
  CHECK_THROWS_WITH(place({{"conv1.A", 0}}, defaults, 2, PlacementKind::lbp),
                    Contains("'conv1.A'") && Contains("got 0"));
  CHECK_THROWS_WITH(placement_time({{"x", -3}}, defaults, 2, {-1}), Contains("got -3"));
  // A factor's modelled work is its inverse's share in (0, 1]: a Cholesky factor costs a third.
  CHECK_THROWS_WITH(place({{"fc1.A", 10, 0.0}}, defaults, 2, PlacementKind::lbp),
                    Contains("'fc1.A'") && Contains("work 0.0") && Contains("(0, 1]"));
  CHECK_THROWS_WITH(placement_time({{"x", 10, 1.5}}, defaults, 2, {-1}), Contains("work 1.5"));
  std::vector<double> load;
  CHECK(placement_time({{"a", 1000, kdist::kfac::kCholeskyFactorWork}, {"b", 1000}}, defaults, 1, {-1, -1}, &load) ==
        Approx(0.1 / 3 + 0.1));
  CHECK_THROWS_WITH(placement_time(items, defaults, 2, {0, 2}), Contains("owner[1] = 2"));
  CHECK_THROWS_WITH(placement_time(items, defaults, 2, {-2, 0}), Contains("owner[0] = -2"));
  CHECK_THROWS_WITH(placement_time(items, defaults, 2, {0}), Contains("1 entries for 2 items"));
  PlacementModels zero = defaults;
  zero.element_bytes = 0;
  CHECK_THROWS_WITH(place(items, zero, 2, PlacementKind::lbp), Contains("element_bytes"));
  CHECK_THROWS_AS(defaults.inverse_time(0), InvalidArgument);
}

namespace {
/// The channel model, written out here: rank r computes its CT and every NCT inverse; the channel
/// sends every CT broadcast after the cheapest CT inverse.
double channel_eval(const Times& t, int ranks, const std::vector<int>& owner) {
  std::vector<double> compute(static_cast<std::size_t>(ranks), 0.0);
  double nct = 0.0, sent = 0.0, first = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < owner.size(); ++i) {
    if (owner[i] < 0) {
      nct += t.inv[i];
    } else {
      compute[static_cast<std::size_t>(owner[i])] += t.inv[i];
      sent += t.bc[i];
      first = std::min(first, t.inv[i]);
    }
  }
  double m = 0.0;
  for (double c : compute) m = std::max(m, c + nct);
  return std::isinf(first) ? m : std::max(m, first + sent);
}

double channel_brute(const Times& t, int ranks) {
  std::vector<int> owner(t.inv.size(), -1);
  double best = std::numeric_limits<double>::infinity();
  while (true) {
    best = std::min(best, channel_eval(t, ranks, owner));
    std::size_t i = 0;
    while (i < owner.size() && owner[i] == ranks - 1) owner[i++] = -1;
    if (i == owner.size()) return best;
    ++owner[i];
  }
}
}  // namespace

TEST_CASE("placement: the channel placement by hand", "[kfac][placement]") {
  // Four factors of d = 10 on 4 ranks: inverse 1e-3 * 1000 = 1, broadcast (55 * 4 bytes) 0.9.
  // LBP makes all four CT (1 >= 0.9), one per rank: 1.9 in its load model, but one channel sends
  // the four broadcasts after the first inverse: 1 + 3.6 = 4.6. Channel: k NCT factors cost every
  // rank k plus at most one CT inverse, the channel 1 + 0.9 (4 - k): k = 2 gives max(3, 2.8) = 3.
  // Its bound: 0.9 X = 4 - 0.75 X for X CT factors in the relaxation, X = 4 / 1.65, 0.9 X = 2.1818.
  const Linear lin{0.0, 1e-3, 0.0, 0.9 / 220};
  const auto items = items_of({10, 10, 10, 10});
  const PlacementModels m = lin.models();
  const Placement lbp = place(items, m, 4, PlacementKind::lbp);
  CHECK(std::count(lbp.owner.begin(), lbp.owner.end(), -1) == 0);
  CHECK(lbp.modelled_time == Approx(1.9));
  CHECK(kdist::kfac::channel_time(items, m, 4, lbp.owner) == Approx(4.6));
  const Placement ch = place(items, m, 4, PlacementKind::channel);
  CHECK(std::count(ch.owner.begin(), ch.owner.end(), -1) == 2);
  std::vector<int> ct;
  for (int o : ch.owner)
    if (o >= 0) ct.push_back(o);
  REQUIRE(ct.size() == 2);
  CHECK(ct[0] != ct[1]);
  CHECK(ch.modelled_time == Approx(3.0));
  CHECK(ch.lower_bound == Approx(0.9 * 4 / 1.65));
  std::vector<double> load;
  CHECK(kdist::kfac::channel_time(items, m, 4, ch.owner, &load) == Approx(3.0));
  std::sort(load.begin(), load.end());
  REQUIRE(load.size() == 4);
  CHECK(load[0] == Approx(2.0));
  CHECK(load[1] == Approx(2.0));
  CHECK(load[2] == Approx(3.0));
  CHECK(load[3] == Approx(3.0));
  // One rank: everything local, the bound is the sum.
  const Placement one = place(items, m, 1, PlacementKind::channel);
  CHECK(one.owner == std::vector<int>(4, -1));
  CHECK(one.lower_bound == Approx(4.0));
}

TEST_CASE("placement: channel against a brute force of its model; bound <= optimum <= channel <= LBP there",
          "[kfac][placement]") {
  std::mt19937_64 rng(20261201);
  std::vector<double> ratios;
  int nct = 0, better = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const Linear lin = random_linear(rng);
    const int n = 1 + static_cast<int>(rng() % 6), ranks = 1 + static_cast<int>(rng() % 4);
    const std::vector<int> dims = random_dims(rng, n);
    const auto items = items_of(dims);
    const PlacementModels m = lin.models();
    INFO("trial " << trial << ", N " << n << ", P " << ranks);
    const Times t(lin, dims);
    const Placement ch = place(items, m, ranks, PlacementKind::channel);
    const Placement lbp = place(items, m, ranks, PlacementKind::lbp);
    const double brute = channel_brute(t, ranks), lbp_there = channel_eval(t, ranks, lbp.owner);
    CHECK(near(ch.modelled_time, channel_eval(t, ranks, ch.owner)));
    CHECK(ch.lower_bound <= brute * (1 + 1e-9));
    CHECK(brute <= ch.modelled_time * (1 + 1e-12));
    CHECK(ch.modelled_time <= lbp_there * (1 + 1e-12));
    ratios.push_back(ch.modelled_time / brute);
    for (int o : ch.owner) nct += o < 0 && ranks > 1;
    better += ch.modelled_time < lbp_there * (1 - 1e-9);
  }
  CHECK(nct > 50);
  CHECK(better > 10);
  std::sort(ratios.begin(), ratios.end());
  std::printf(
      "placement: channel / channel-model optimum over %zu instances: median %.4f, worst %.4f; "
      "better than LBP there in %d\n",
      ratios.size(), ratios[ratios.size() / 2], ratios.back(), better);
}

TEST_CASE("inverse_tasks: CT factors in broadcast order (owner inverts, others receive), then NCT locally",
          "[kfac][placement]") {
  using Kind = kdist::kfac::InverseTask::Kind;
  Placement p;
  p.ranks = 3;
  p.owner = {-1, 2, 0, -1, 0, 1};
  p.inverse_s = {1, 4, 3, 1, 1, 2};
  p.broadcast_s = {1, 1, 1, 1, 1, 1};
  const std::vector<int> order = kdist::kfac::broadcast_order(p);
  for (int rank = 0; rank < p.ranks; ++rank) {
    INFO("rank " << rank);
    const auto tasks = kdist::kfac::inverse_tasks(p, rank);
    REQUIRE(tasks.size() == p.owner.size());
    for (std::size_t k = 0; k < order.size(); ++k) {
      const auto& t = tasks[k];
      CHECK(t.factor == order[k]);
      CHECK(t.root == p.owner[static_cast<std::size_t>(t.factor)]);
      CHECK(t.kind == (t.root == rank ? Kind::invert_and_broadcast : Kind::receive));
    }
    CHECK(tasks[order.size()].factor == 0);
    CHECK(tasks[order.size() + 1].factor == 3);
    for (std::size_t k = order.size(); k < tasks.size(); ++k) {
      CHECK(tasks[k].kind == Kind::invert_local);
      CHECK(tasks[k].root == -1);
    }
  }
}

TEST_CASE("broadcast_order and inverse_tasks refuse a plan that does not hold together", "[kfac][placement]") {
  Placement p;
  p.ranks = 2;
  p.owner = {0, 1};
  p.inverse_s = {1, 1};
  p.broadcast_s = {1, 1};
  REQUIRE_NOTHROW(kdist::kfac::broadcast_order(p));
  Placement outside = p;
  outside.owner[1] = 2;
  CHECK_THROWS_MATCHES(kdist::kfac::broadcast_order(outside), InvalidArgument,
                       Catch::Matchers::Predicate<InvalidArgument>([](const InvalidArgument& e) {
                         return std::string(e.what()).find("owner[1] = 2 is outside [-1, 2)") != std::string::npos;
                       }));
  CHECK_THROWS_AS(kdist::kfac::inverse_tasks(outside, 0), InvalidArgument);
  Placement short_costs = p;
  short_costs.broadcast_s.pop_back();
  CHECK_THROWS_WITH(kdist::kfac::broadcast_order(short_costs),
                    Contains("2 owners, 2 inverse and 1 broadcast costs") && Contains("broadcast_order"));
  CHECK_THROWS_WITH(kdist::kfac::inverse_tasks(p, 2), Contains("rank 2 is outside [0, 2)"));
}

TEST_CASE("with_owners: another assignment of the same plan, loads and makespan in the plan's model",
          "[kfac][placement]") {
  const Linear lin{1e-3, 1e-9, 1e-4, 1e-9};
  const auto items = items_of({300, 200, 100, 50});
  for (const PlacementKind kind : {PlacementKind::lbp, PlacementKind::channel}) {
    const Placement p = place(items, lin.models(), 3, kind);
    const std::vector<int> owner = {2, -1, 0, 0};
    const Placement q = kdist::kfac::with_owners(p, owner);
    std::vector<double> load;
    const double want = kind == PlacementKind::channel ? kdist::kfac::channel_time(items, lin.models(), 3, owner, &load)
                                                       : placement_time(items, lin.models(), 3, owner, &load);
    CHECK(q.owner == owner);
    CHECK(q.modelled_time == want);
    CHECK(q.load == load);
    CHECK(q.lower_bound == p.lower_bound);
    CHECK_FALSE(q.exact);
    CHECK_THROWS_WITH(kdist::kfac::with_owners(p, {0, 1, 3, 0}), Contains("owner[2] = 3 is outside [-1, 3)"));
    CHECK_THROWS_WITH(kdist::kfac::with_owners(p, {0}), Contains("1 entries for 4 items"));
  }
}
