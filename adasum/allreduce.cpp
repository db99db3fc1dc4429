// How the Adasum all-reduce is computed (the contract is in allreduce.hpp).
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
#include <kdist/core/phase.hpp>

#include <functional>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>

namespace kdist {
namespace adasum {

Topology::Topology(comm::Engine& engine, int node_size)
    : engine_id_(&engine), node_(engine.node_group(node_size)), cross_(engine.cross_node_group(node_size)) {
  for (int l = 0; l < node_.size(); ++l) node_peers_.push_back(node_.rank_in(engine.communicator(), l));
  for (int x = 0; x < cross_.size(); ++x) cross_peers_.push_back(cross_.rank_in(engine.communicator(), x));
}

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;
constexpr double kNoRank = std::numeric_limits<double>::infinity();

// Scratch buffers are reused across all-reduces (uninitialised; a handful kept), so a call does
// not pay for allocating, zero-filling and page-faulting half a vector every time.
template <class T>
class ScratchPool {
 public:
  static std::shared_ptr<T> get(std::size_t n) {
    ScratchPool& p = instance();
    std::lock_guard<std::mutex> lock(p.mutex_);
    auto it = p.free_.lower_bound(n);
    std::size_t cap = n;
    T* buf = nullptr;
    if (it != p.free_.end()) {
      cap = it->first;
      buf = it->second.release();
      p.free_.erase(it);
    } else {
      buf = new T[n > 0 ? n : 1];
    }
    return std::shared_ptr<T>(buf, [cap](T* q) {
      ScratchPool& pool = instance();
      std::lock_guard<std::mutex> lock(pool.mutex_);
      if (pool.free_.size() < kKeep)
        pool.free_.emplace(cap, std::unique_ptr<T[]>(q));
      else
        delete[] q;
    });
  }

 private:
  static constexpr std::size_t kKeep = 4;
  static ScratchPool& instance() {
    static ScratchPool* p = new ScratchPool;  // never destroyed: buffers may be returned at exit
    return *p;
  }
  std::mutex mutex_;
  std::multimap<std::size_t, std::unique_ptr<T[]>> free_;
};

// Schedule tags (< 4096): each step of one all-reduce uses its own.
constexpr int kTagFold = 1, kTagFoldBad = 2, kTagUnfold = 3, kTagUnfoldBad = 4;
constexpr int kTagHalve = 32, kTagGather = 96, kTagNode = 160, kTagCross = 1024;

// Everything the steps of one all-reduce share. Partials messages hold 3 doubles per tensor
// (summed) followed by one per tensor: the lowest rank with a non-finite input (min-reduced).
template <class T>
struct State {
  T* data = nullptr;
  std::function<void()> on_success;  // copies the result back to the caller's view
  std::size_t n = 0, m = 0, g0 = 0;  // buffer size; slice length and global offset of the slice
  std::vector<std::size_t> bounds;
  std::vector<std::string> labels;
  std::size_t tensors = 0;
  std::vector<T> padded, slice;
  std::shared_ptr<T> tmp_buf;  // received vector data (pool scratch)
  T* tmp() { return tmp_buf.get(); }
  T* S = nullptr;  // the slice the cross-rank algorithm works on
  std::vector<double> part, other;
  std::vector<std::vector<double>> node_parts;
  std::vector<double> fold_bad;
  std::vector<char> bad_a, bad_b;  // non-finite flags of the raw inputs read by a partials step

  // Raw inputs are read once, by the first partials step: mark the rank each came from (a side
  // whose data is not raw, i.e. already combined by a fold, passes kNoRank).
  void attribute(double rank_a, double rank_b) {
    for (std::size_t t = 0; t < tensors; ++t) {
      if (bad_a[t]) bad()[t] = std::min(bad()[t], rank_a);
      if (bad_b[t]) bad()[t] = std::min(bad()[t], rank_b);
    }
  }
  int node_size = 1, local = 0;
  AdasumCounters planned;
  AdasumCounters* counters = nullptr;

  std::size_t msg() const { return (kPartials + 1) * tensors; }
  double* bad() { return part.data() + kPartials * tensors; }
  const double* bad() const { return part.data() + kPartials * tensors; }

  void add_into_part(const std::vector<double>& x) {
    for (std::size_t i = 0; i < kPartials * tensors; ++i) part[i] += x[i];
    for (std::size_t t = 0; t < tensors; ++t) bad()[t] = std::min(bad()[t], x[kPartials * tensors + t]);
  }
  // Node sum in local-rank order: every rank of the node gets bit-identical totals.
  void sum_node() {
    node_parts[static_cast<std::size_t>(local)] = part;
    std::vector<double> total(msg(), 0.0);
    for (std::size_t t = 0; t < tensors; ++t) total[kPartials * tensors + t] = kNoRank;
    for (const auto& p : node_parts) {
      for (std::size_t i = 0; i < kPartials * tensors; ++i) total[i] += p[i];
      for (std::size_t t = 0; t < tensors; ++t)
        total[kPartials * tensors + t] = std::min(total[kPartials * tensors + t], p[kPartials * tensors + t]);
    }
    part = total;
  }
  void finish() {
    if (counters) *counters = planned;
    check_finite();
    if (on_success) on_success();
  }
  void check_finite() const {
    for (std::size_t t = 0; t < tensors; ++t)
      if (bad()[t] != kNoRank) {
        throw NonFiniteError("kdist::adasum::allreduce", t < labels.size() ? labels[t] : "tensor " + std::to_string(t),
                             static_cast<long long>(bounds[t + 1] - bounds[t]), static_cast<int>(bad()[t]),
                             "tensor index " + std::to_string(t) + "; buffer contents are unspecified");
      }
  }
};

// Only where no step reads the raw inputs with attribution (one rank; hierarchical mode, where
// the node average comes first). Branch-free, so it vectorises.
template <class T>
void scan_nonfinite(State<T>& st, int my_rank) {
  for (std::size_t t = 0; t < st.tensors; ++t) {
    int bad = 0;
    for (std::size_t i = st.bounds[t]; i < st.bounds[t + 1]; ++i) bad |= !compat::isfinite(st.data[i]);
    if (bad) st.bad()[t] = my_rank;
  }
}

// Builds the schedule of one all-reduce, step by step. The tree it computes is documented in
// allreduce.hpp; each method below adds the steps of one phase.
template <class T>
class Builder {
 public:
  Builder(comm::Engine& engine, std::shared_ptr<State<T>> st, const Topology* hier, bool doubling)
      : st_(std::move(st)), s_(*st_), hier_(hier), me_(engine.rank()), doubling_(doubling && !hier) {
    k_ = hier ? hier->node().size() : 1;
    N_ = hier ? hier->cross().size() : engine.size();
    c_ = hier ? hier->cross().rank() : me_;
    s_.node_size = k_;
    s_.local = hier ? hier->node().rank() : 0;
    while (Pp_ * 2 <= N_) {
      Pp_ *= 2;
      ++L_;
    }
    q_ = N_ - Pp_;
  }

  comm::Schedule build() {
    node_average();
    lo_ = 0;
    hi_ = s_.m;
    const bool folded_away = c_ < 2 * q_ && c_ % 2 == 1;
    folds_in_ = c_ < 2 * q_ && c_ % 2 == 0;
    // Flat mode reads every raw input exactly once in the first partials step (the fold, or
    // level 0), which attributes non-finite values to their rank; otherwise scan up front.
    raw_ = k_ == 1;
    if (!raw_ || (L_ == 0 && q_ == 0)) scan_nonfinite(s_, me_);
    if (folded_away) {
      fold_away();
    } else {
      v_ = folds_in_ ? c_ / 2 : c_ - q_;
      // Scratch: the whole slice for the fold and for doubling, half of it for the halving steps.
      s_.tmp_buf = ScratchPool<T>::get(folds_in_ || doubling_ ? s_.m : (s_.m + 1) / 2);
      if (folds_in_) fold_in();
      if (doubling_) {
        for (int l = 0; l < L_; ++l) doubling_level(l);
      } else {
        for (int l = 0; l < L_; ++l) halving_level(l);
        for (int l = L_ - 1; l >= 0; --l) gather_level(l);
      }
      if (folds_in_) unfold();
    }
    node_gather();
    sched_.step().then([st = st_] { st->finish(); });
    return std::move(sched_);
  }

 private:
  using Buffer = comm::Buffer;
  int mi() const { return static_cast<int>(s_.m); }
  int msg() const { return static_cast<int>(s_.msg()); }
  int cross_rank(int x) const { return hier_ ? hier_->cross_peer(x) : x; }
  int real(int virt) const { return cross_rank(virt < q_ ? 2 * virt : virt + q_); }

  // Hierarchical: the node average, by reduce-scatter of a padded copy.
  void node_average() {
    if (k_ <= 1) {
      s_.m = s_.n;
      s_.g0 = 0;
      s_.S = s_.data;
      return;
    }
    const std::size_t k = static_cast<std::size_t>(k_);
    s_.m = (s_.n + k - 1) / k;
    s_.g0 = s_.m * static_cast<std::size_t>(s_.local);
    s_.padded.assign(s_.m * k, T(0));
    std::copy(s_.data, s_.data + s_.n, s_.padded.begin());
    s_.slice.assign(s_.m, T(0));
    s_.S = s_.slice.data();
    s_.node_parts.assign(k, std::vector<double>(s_.msg(), 0.0));
    sched_.step()
        .reduce_scatter(comm::Group::of(hier_->node()), Buffer::host(s_.padded.data(), s_.padded.size()),
                        Buffer::host(s_.slice.data(), s_.m))
        .then([st = st_, k] {
          Phase phase("kdist::adasum::node_average");
          const T f = T(1) / static_cast<T>(k);
          for (auto& x : st->slice) x *= f;
        });
  }

  // Hierarchical: the partials of the pair just formed are summed over the node's slices.
  void node_sum(int tag) {
    if (k_ <= 1) return;
    sched_.step();
    for (int l = 0; l < k_; ++l) {
      if (l == s_.local) continue;
      sched_.send(hier_->node_peer(l), Buffer::host(s_.part.data(), s_.msg()), tag);
      sched_.recv(hier_->node_peer(l), Buffer::host(s_.node_parts[static_cast<std::size_t>(l)].data(), s_.msg()), tag);
    }
    sched_.then([st = st_] { st->sum_node(); });
    s_.planned.partial_bytes_sent += static_cast<long long>(k_ - 1) * msg() * 8;
  }

  // Odd rank 2i+1 (i < q) hands its vector to 2i and gets the result back at the end.
  void fold_away() {
    const int peer = cross_rank(c_ - 1);
    send_slice(peer, kTagFold, kTagFoldBad);
    sched_.step()
        .recv(peer, Buffer::host(s_.S, s_.m), kTagUnfold)
        .recv(peer, Buffer::host(s_.bad(), s_.tensors), kTagUnfoldBad);
    s_.planned.vector_exchanges += 1;
  }

  // One step handing the whole slice and its non-finite markers to `peer`.
  void send_slice(int peer, int tag, int tag_bad) {
    sched_.step().send(peer, Buffer::host(s_.S, s_.m), tag).send(peer, Buffer::host(s_.bad(), s_.tensors), tag_bad);
    s_.planned.vector_bytes_sent += static_cast<long long>(s_.m) * sizeof(T);
    s_.planned.vector_exchanges += 1;
  }

  // Even rank 2i (i < q) combines its partner's vector with its own as a.
  void fold_in() {
    const int odd = cross_rank(c_ + 1);
    s_.fold_bad.assign(s_.tensors, kNoRank);
    sched_.step()
        .recv(odd, Buffer::host(s_.tmp(), s_.m), kTagFold)
        .recv(odd, Buffer::host(s_.fold_bad.data(), s_.tensors), kTagFoldBad)
        .then([st = st_, raw = raw_, me = me_, odd] {
          Phase phase("kdist::adasum::fold_in");
          partials(Host(), st->S, st->tmp(), st->g0, st->m, st->bounds, st->part.data(), raw ? &st->bad_a : nullptr,
                   raw ? &st->bad_b : nullptr);
          if (raw) st->attribute(me, odd);
          for (std::size_t t = 0; t < st->tensors; ++t) st->bad()[t] = std::min(st->bad()[t], st->fold_bad[t]);
        });
    s_.planned.vector_exchanges += 1;
    node_sum(kTagNode + 63);
    if (k_ > 1) s_.planned.partial_reductions += 1;
    sched_.step().then([st = st_] {
      Phase phase("kdist::adasum::apply");
      apply(Host(), st->S, st->S, st->tmp(), st->g0, st->m, st->bounds, st->part.data());
    });
  }

  // Level l of vector halving, distance doubling: exchange halves with partner v XOR 2^l, form
  // the partials of the kept half, sum them over the 2^(l+1) holders, apply.
  void halving_level(int l) {
    const int d = 1 << l;
    const int partner = real(v_ ^ d);
    const bool lower = (v_ & d) == 0;
    slices_.push_back({lo_, hi_});
    // Level 0 of flat mode reads raw inputs, except those of ranks that folded one in.
    const bool mine_raw = raw_ && l == 0 && v_ >= q_, theirs_raw = raw_ && l == 0 && (v_ ^ d) >= q_;
    const bool raw_here = mine_raw || theirs_raw;
    const double mine_from = mine_raw ? me_ : kNoRank, theirs_from = theirs_raw ? partner : kNoRank;
    const std::size_t mid = lo_ + (hi_ - lo_) / 2;
    const std::size_t keep_lo = lower ? lo_ : mid, keep_hi = lower ? mid : hi_;
    const std::size_t send_lo = lower ? mid : lo_, send_hi = lower ? hi_ : mid;
    sched_.step()
        .send(partner, Buffer::host(s_.S + send_lo, send_hi - send_lo), kTagHalve + l)
        .recv(partner, Buffer::host(s_.tmp(), keep_hi - keep_lo), kTagHalve + l)
        .then([st = st_, lower, keep_lo, keep_hi, raw_here, mine_from, theirs_from] {
          Phase phase("kdist::adasum::partials");
          T* mine = st->S + keep_lo;
          const T* theirs = st->tmp();
          partials(Host(), lower ? mine : theirs, lower ? theirs : mine, st->g0 + keep_lo, keep_hi - keep_lo,
                   st->bounds, st->part.data(), raw_here ? &st->bad_a : nullptr, raw_here ? &st->bad_b : nullptr);
          if (raw_here) st->attribute(lower ? mine_from : theirs_from, lower ? theirs_from : mine_from);
        });
    s_.planned.vector_bytes_sent += static_cast<long long>(send_hi - send_lo) * sizeof(T);
    s_.planned.vector_exchanges += 1;
    node_sum(kTagNode + l);
    sum_partials_over_holders(l);
    sched_.step().then([st = st_, lower, keep_lo, keep_hi] {
      Phase phase("kdist::adasum::apply");
      T* mine = st->S + keep_lo;
      const T* theirs = st->tmp();
      apply(Host(), mine, lower ? mine : theirs, lower ? theirs : mine, st->g0 + keep_lo, keep_hi - keep_lo, st->bounds,
            st->part.data());
    });
    lo_ = keep_lo;
    hi_ = keep_hi;
  }

  // Level l of whole-vector recursive doubling: exchange vectors and non-finite markers with
  // partner v XOR 2^l, then both apply the pair operator with the lower virtual rank's vector as a.
  void doubling_level(int l) {
    const int d = 1 << l;
    const int partner = real(v_ ^ d);
    const bool lower = (v_ & d) == 0;
    const bool mine_raw = raw_ && l == 0 && v_ >= q_, theirs_raw = raw_ && l == 0 && (v_ ^ d) >= q_;
    const bool raw_here = mine_raw || theirs_raw;
    const double mine_from = mine_raw ? me_ : kNoRank, theirs_from = theirs_raw ? partner : kNoRank;
    const int tensors = static_cast<int>(s_.tensors);
    sched_.step()
        .send(partner, Buffer::host(s_.S, s_.m), kTagHalve + l)
        .send(partner, Buffer::host(s_.bad(), s_.tensors), kTagGather + l)
        .recv(partner, Buffer::host(s_.tmp(), s_.m), kTagHalve + l)
        .recv(partner, Buffer::host(s_.other.data(), s_.tensors), kTagGather + l)
        .then([st = st_, lower, raw_here, mine_from, theirs_from, tensors] {
          Phase phase("kdist::adasum::pair");
          for (int t = 0; t < tensors; ++t)
            st->bad()[t] = std::min(st->bad()[t], st->other[static_cast<std::size_t>(t)]);
          T* mine = st->S;
          const T* theirs = st->tmp();
          const T* a = lower ? mine : theirs;
          const T* b = lower ? theirs : mine;
          partials(Host(), a, b, st->g0, st->m, st->bounds, st->part.data(), raw_here ? &st->bad_a : nullptr,
                   raw_here ? &st->bad_b : nullptr);
          if (raw_here) st->attribute(lower ? mine_from : theirs_from, lower ? theirs_from : mine_from);
          apply(Host(), mine, a, b, st->g0, st->m, st->bounds, st->part.data());
        });
    s_.planned.vector_bytes_sent += static_cast<long long>(s_.m) * sizeof(T);
    s_.planned.vector_exchanges += 1;
    s_.planned.partial_bytes_sent += static_cast<long long>(s_.tensors) * 8;
  }

  // Recursive doubling over the 2^(l+1) virtual ranks holding pieces of a and b, in a fixed
  // order, so every holder gets bit-identical sums.
  void sum_partials_over_holders(int l) {
    for (int r = 0; r <= l; ++r) {
      const int peer = real(v_ ^ (1 << r));
      sched_.step()
          .send(peer, Buffer::host(s_.part.data(), s_.msg()), kTagCross + 32 * l + r)
          .recv(peer, Buffer::host(s_.other.data(), s_.msg()), kTagCross + 32 * l + r)
          .then([st = st_] { st->add_into_part(st->other); });
      s_.planned.partial_bytes_sent += static_cast<long long>(msg()) * 8;
    }
    s_.planned.partial_reductions += 1;
  }

  // All-gather in reverse: hand the partner this rank's piece of the level-l slice.
  void gather_level(int l) {
    const int partner = real(v_ ^ (1 << l));
    const std::size_t plo = slices_[static_cast<std::size_t>(l)].first;
    const std::size_t phi = slices_[static_cast<std::size_t>(l)].second;
    const std::size_t olo = lo_ == plo ? hi_ : plo, ohi = lo_ == plo ? phi : lo_;  // partner's piece
    sched_.step()
        .send(partner, Buffer::host(s_.S + lo_, hi_ - lo_), kTagGather + l)
        .recv(partner, Buffer::host(s_.S + olo, ohi - olo), kTagGather + l);
    s_.planned.vector_bytes_sent += static_cast<long long>(hi_ - lo_) * sizeof(T);
    s_.planned.vector_exchanges += 1;
    lo_ = plo;
    hi_ = phi;
  }

  void unfold() { send_slice(cross_rank(c_ + 1), kTagUnfold, kTagUnfoldBad); }

  // Hierarchical: all-gather the slices inside the node.
  void node_gather() {
    if (k_ <= 1) return;
    if (L_ == 0) node_sum(kTagNode + 62);  // one node: still agree on non-finite inputs
    sched_.step()
        .allgather(comm::Group::of(hier_->node()), Buffer::host(s_.slice.data(), s_.m),
                   Buffer::host(s_.padded.data(), s_.padded.size()))
        .then([st = st_] { std::copy(st->padded.begin(), st->padded.begin() + static_cast<long>(st->n), st->data); });
  }

  std::shared_ptr<State<T>> st_;
  State<T>& s_;
  const Topology* hier_;
  comm::Schedule sched_{"adasum"};
  int me_, k_ = 1, N_ = 1, c_ = 0, Pp_ = 1, L_ = 0, q_ = 0, v_ = 0;
  bool doubling_ = false, raw_ = true, folds_in_ = false;
  std::size_t lo_ = 0, hi_ = 0;
  std::vector<std::pair<std::size_t, std::size_t>> slices_;  // slice before each level
};

}  // namespace

namespace impl {

template <class T>
comm::Request allreduce_host(comm::Engine& engine, T* data, std::size_t n, comm::Layout layout, const Options& options,
                             std::function<void()> on_success) {
  const Topology* hier = options.hierarchy;
  AdasumCounters* counters = options.counters;
  check_bounds("kdist::adasum::allreduce", layout.bounds, n);
  if (hier && hier->engine() != &engine)
    kdist::impl::throw_invalid("kdist::adasum::allreduce", "the Topology was built from another Engine");
  auto st = std::make_shared<State<T>>();
  State<T>& s = *st;
  s.data = data;
  s.n = n;
  s.bounds = layout.bounds;
  s.labels = layout.labels;
  s.tensors = s.bounds.size() - 1;
  s.counters = counters;
  s.on_success = std::move(on_success);
  s.part.assign(s.msg(), 0.0);
  s.other.assign(s.msg(), 0.0);
  for (std::size_t t = 0; t < s.tensors; ++t) s.bad()[t] = kNoRank;
  const bool doubling = !hier && (options.algorithm == Algorithm::doubling ||
                                  (options.algorithm == Algorithm::automatic && n * sizeof(T) < options.small_bytes));
  Builder<T> builder(engine, st, hier, doubling);
  comm::Schedule sched = builder.build();
  comm::OpDescription what;
  what.dtype = dtype_of<T>();
  what.count = static_cast<long long>(n);
  what.label = doubling ? "adasum/doubling" : "adasum";
  what.layout = std::move(layout);
  return engine.submit(std::move(sched), std::move(what));
}

template comm::Request allreduce_host<float>(comm::Engine&, float*, std::size_t, comm::Layout, const Options&,
                                             std::function<void()>);
template comm::Request allreduce_host<double>(comm::Engine&, double*, std::size_t, comm::Layout, const Options&,
                                              std::function<void()>);

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
