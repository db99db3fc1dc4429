// How the Adasum all-reduce is computed (the contract is in allreduce.hpp): this file holds the
// algorithm's overview, the Plan, build() and the entry point; each phase's steps are built in
// its own unit under adasum/impl/ (adasum/impl/builder.hpp lists them).
//
// The algorithm (vector-halving distance-doubling, one engine Schedule): at distance d = 1, 2, 4
// ... partner v XOR d; the lower virtual rank keeps the first floor(n/2) elements of its current
// slice and sends the rest; the partials [a.b, a.a, b.b] of each tensor are summed over the 2d
// virtual ranks that hold pieces of the two vectors (point-to-point recursive doubling, so every
// holder gets bit-identical sums) and applied; then the slices are all-gathered in reverse order.
// Per rank this moves at most 2 (P'-1)/P' n elements of vector data (P' = 2^k; up to one element
// more per level when halves are uneven), plus n twice for a folded pair, in at most 2k + 2
// exchanges, and makes k small reductions (AdasumCounters reports both).
//
// Recursive doubling (Algorithm::doubling, flat only): after the fold, at distance d = 1, 2, 4 ...
// partner v XOR d; both send their whole vector and non-finite markers, both form the partials of
// (lower's, upper's) over the whole vector and apply them. Every rank of a 2d-block then holds the
// same bits: the two halves of the block held identical vectors (induction), so every pair
// computes the same pair operation on the same inputs. Per rank L n elements in L exchanges (plus
// the fold), no partials round; the partials are summed in one pass per tensor instead of per
// piece and then across holders, so the two algorithms agree to rounding, not bit for bit.
//
// Hierarchical mode (node size s): average inside each node by reduce-scatter (the buffer is
// padded to a multiple of s), run the algorithm above across nodes on each slice, with a
// tensor's partials summed over every rank holding a piece of it (the node's other slices
// included), then all-gather inside the node. The result is exactly Adasum over node averages.
//
// Range: partials are accumulated in double, and a squared norm below sqrt(DBL_MIN) (~1.5e-154)
// counts as zero (coefficient 1). For float storage no representable tensor is that
// small; for double storage, tensors with norms below ~1e-77 are treated as zero.
//
// NaN or Inf in any input: every rank throws kdist::NonFiniteError naming the first such
// tensor (by label) and the lowest rank where it appeared. The rank of each tensor's non-finite
// input travels with the partial sums (a min), so detection costs no extra message. Buffer
// contents are unspecified after this error. (Double inputs above ~1e154 in magnitude, whose
// squared norms overflow, are reported the same way: Adasum's coefficients overflow there too.)
#include <kdist/adasum/allreduce.hpp>
#include <kdist/adasum/impl/builder.hpp>
#include <kdist/comm/shared_window.hpp>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace kdist {
namespace adasum {

Topology::Topology(comm::Engine& engine, int node_size)
    : engine_id_(&engine), node_(engine.node_group(node_size)), cross_(engine.cross_node_group(node_size)) {
  for (int l = 0; l < node_.size(); ++l) node_peers_.push_back(node_.rank_in(engine.communicator(), l));
  for (int x = 0; x < cross_.size(); ++x) cross_peers_.push_back(cross_.rank_in(engine.communicator(), x));
  // Decided once, by all ranks together: each rank alone sees only its own node, and partners on
  // one machine that decided apart (one reading in place, the other sending) waited for ever.
  // Shared-memory nodes (node_size 0, the same on every rank) lie in one machine by construction.
  if (node_size == 0) {
    nodes_share_memory_ = true;
    return;
  }
  int mine = 1;
  for (int p : node_peers_) mine = mine && engine.shares_node(p);
  nodes_share_memory_ = engine.allreduce_values<int>({mine}, comm::ReduceOp::min, "kdist::adasum::Topology")[0] == 1;
}

namespace impl {

template <class T>
Plan Plan::choose(std::size_t n, const Options& options, bool window) {
  Plan p;
  p.hierarchy = options.hierarchy;
  p.doubling = !p.hierarchy && (options.algorithm == Algorithm::doubling ||
                                (options.algorithm == Algorithm::automatic && n * sizeof(T) < options.small_bytes));
  const std::size_t chunk_bytes = options.chunk_bytes ? options.chunk_bytes : kDefaultChunkBytes;
  p.chunk = std::max<std::size_t>(1, chunk_bytes / sizeof(T));
  p.chunk_everywhere = options.chunk_bytes != 0;
  p.in_place = options.in_place && window;
  return p;
}

// Ranks that chunk differently would send messages of different sizes: the chunk is part of the
// plan whenever it can split a buffer of n elements.
std::string Plan::describe(std::size_t n) const {
  std::string s = doubling ? "doubling" : "vhdd";
  if (hierarchy) s += ", nodes of " + std::to_string(hierarchy->node().size());
  if (!doubling && n > chunk) s += ", chunks of " + std::to_string(chunk) + (chunk_everywhere ? " everywhere" : "");
  if (in_place) s += ", in place";
  return s;
}

template <class T>
comm::Schedule Builder<T>::build() {
  // Room for the in-place path's steps (about six a level, a few more around them), so that
  // adding them moves no std::function; chunked levels grow the vector as before.
  sched_.reserve(static_cast<std::size_t>(8 + 6 * levels_));
  node_average();
  lo_ = 0;
  hi_ = state_.m;
  const bool folded_away = cross_index_ < 2 * extra_ && cross_index_ % 2 == 1;
  folds_in_ = cross_index_ < 2 * extra_ && cross_index_ % 2 == 0;
  // Flat mode reads every raw input exactly once in the first partials step (the fold, or
  // level 0), which attributes non-finite values to their rank; otherwise scan up front.
  raw_ = node_size_ == 1;
  if (!raw_ || (levels_ == 0 && extra_ == 0)) scan_nonfinite(state_, rank_);
  if (folded_away) {
    fold_away();
  } else {
    virtual_rank_ = folds_in_ ? cross_index_ / 2 : cross_index_ - extra_;
    // Scratch: the whole slice for the fold and for doubling, half of it for the halving steps;
    // none when every level reads its partner in place (a pool visit costs locks and allocations).
    if (folds_in_ || doubling_ || !every_level_in_place())
      state_.tmp_buf = ScratchPool<T>::get(folds_in_ || doubling_ ? state_.m : (state_.m + 1) / 2);
    if (folds_in_) fold_in();
    if (doubling_) {
      for (int l = 0; l < levels_; ++l) doubling_level(l);
    } else {
      for (int l = 0; l < levels_; ++l) halving_level(l);
      for (int l = levels_ - 1; l >= 0; --l) gather_level(l);
    }
    if (folds_in_) unfold();
  }
  node_gather();
  sched_.step().then([st = shared_] { st->finish(); });
  return std::move(sched_);
}

template <class T>
comm::Request allreduce_host(comm::Engine& engine, T* data, std::size_t n, comm::Layout layout, const Options& options,
                             std::function<void()> on_success, const comm::SharedWindow* window) {
  const Topology* hier = options.hierarchy;
  check_bounds("kdist::adasum::allreduce", layout.bounds, n);
  if (hier && hier->engine() != &engine)
    kdist::impl::throw_invalid("kdist::adasum::allreduce", "the Topology was built from another Engine");
  if (window && window->engine() != &engine)
    kdist::impl::throw_invalid("kdist::adasum::allreduce", "the SharedBuffer was made with another Engine");
  const Plan plan = Plan::choose<T>(n, options, window != nullptr);
  auto st = std::make_shared<State<T>>();
  State<T>& s = *st;
  s.data = data;
  s.n = n;
  s.bounds = layout.bounds;
  s.labels = layout.labels;
  s.tensors = s.bounds.size() - 1;
  s.counters = options.counters;
  s.on_success = std::move(on_success);
  s.window = plan.in_place ? window : nullptr;
  s.part.assign(s.msg(), 0.0);
  s.other.assign(s.msg(), 0.0);
  for (std::size_t t = 0; t < s.tensors; ++t) s.bad()[t] = kNoRank;
  Builder<T> builder(engine, st, plan);
  comm::Schedule sched = builder.build();
  const comm::CheckPayload payload = builder.check_payload();
  auto what = comm::OpDescription::composite(dtype_of<T>(), static_cast<long long>(n), "adasum", std::move(layout),
                                             plan.describe(n));
  if (s.window) s.window->sync();  // orders the caller's writes before the check's messages
  return engine.submit(std::move(sched), std::move(what), payload);
}

template comm::Request allreduce_host<float>(comm::Engine&, float*, std::size_t, comm::Layout, const Options&,
                                             std::function<void()>, const comm::SharedWindow*);
template comm::Request allreduce_host<double>(comm::Engine&, double*, std::size_t, comm::Layout, const Options&,
                                              std::function<void()>, const comm::SharedWindow*);

}  // namespace impl

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::automatic:
      return "automatic";
    case Algorithm::vhdd:
      return "vhdd";
    case Algorithm::doubling:
      return "doubling";
  }
  return "unknown";
}

std::size_t small_bytes_from(const CostModelStore& store, DType dtype, int ranks) {
  const CostKey vhdd{CostOp::adasum, dtype, ranks, "world"}, doubling{CostOp::adasum, dtype, ranks, "world/doubling"};
  if (!store.has(vhdd) || !store.has(doubling)) return kDefaultSmallBytes;
  const CostModel v = store.get(vhdd), d = store.get(doubling);
  for (double x : v.x())
    if (v.time(x) <= d.time(x)) return static_cast<std::size_t>(x);
  return v.x().empty() ? kDefaultSmallBytes : static_cast<std::size_t>(v.x().back()) * 2;
}
}  // namespace adasum
}  // namespace kdist
