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
#include <kdist/adasum/host_kernels.hpp>
#include <kdist/comm/shared_window.hpp>
#include <kdist/core/phase.hpp>

#include <functional>

#include <algorithm>
#include <cmath>
#include <cstring>
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
constexpr int kTagReady = 2048, kTagGathered = 2112, kTagNodeReady = 2177, kTagNodeGathered = 2178;

// The partials of one level's kept range [lo, hi) (offsets into the slice), fed chunk by chunk
// as the partner's half arrives. Each tensor's piece is summed in kBlock-element blocks counted
// from the piece's start, and the blocks are added in order to a total carried from chunk to
// chunk; a block that straddles a chunk's end waits for the next chunk. These are exactly the
// blocks and the order of one unchunked pass (partials() on a serial space), so the sums do not
// depend on the chunk size, bit for bit. With more than one host thread the blocks of a run are
// summed in parallel into scratch first; the order of addition stays the same.
template <class T>
class PartialStream {
 public:
  void start(std::size_t lo, std::size_t hi, std::size_t g0, const std::vector<std::size_t>* bounds, double* part) {
    lo_ = lo;
    hi_ = hi;
    done_ = lo;
    g0_ = g0;
    bounds_ = bounds;
    part_ = part;
    t_ = 0;
    where_ = impl::locality_of(2 * (hi - lo) * sizeof(T));
    std::fill(part, part + kPartials * (bounds->size() - 1), 0.0);
  }
  // Adds every block of [done, upto) that is complete; a and b point at element lo.
  void feed(const T* a, const T* b, std::size_t upto) {
    const std::vector<std::size_t>& bd = *bounds_;
    const std::size_t tensors = bd.size() - 1;
    while (done_ < upto && t_ < tensors) {
      const std::size_t g = g0_ + done_;
      if (bd[t_ + 1] <= g) {  // tensor t_ ends before: next (empty tensors skipped too)
        ++t_;
        continue;
      }
      const std::size_t piece_end = std::min(bd[t_ + 1] - g0_, hi_);
      const std::size_t last = piece_end <= upto ? piece_end : done_ + (upto - done_) / impl::kBlock * impl::kBlock;
      if (last == done_) return;  // the block in progress is not complete yet
      add_run(a, b, done_ - lo_, last - lo_, part_ + kPartials * t_);
      done_ = last;
    }
  }
  void finish(const T* a, const T* b) { feed(a, b, hi_); }

 private:
  void add_run(const T* a, const T* b, std::size_t begin, std::size_t end, double* v) const {
    if (Host().concurrency() == 1) return impl::add_blocks_host(a, b, begin, end, v, where_);
    const std::size_t blocks = (end - begin + impl::kBlock - 1) / impl::kBlock;
    std::vector<double> sums(kPartials * blocks, 0.0);
    double* out = sums.data();
    Kokkos::parallel_for("kdist::adasum::partials", Kokkos::RangePolicy<Host>(0, blocks), [=](const std::size_t k) {
      const std::size_t s = begin + k * impl::kBlock;
      impl::add_blocks_host(a, b, s, std::min(s + impl::kBlock, end), out + kPartials * k);
    });
    for (std::size_t k = 0; k < blocks; ++k)
      for (int j = 0; j < kPartials; ++j) v[j] += out[kPartials * k + static_cast<std::size_t>(j)];
  }
  std::size_t lo_ = 0, hi_ = 0, done_ = 0, g0_ = 0, t_ = 0;
  impl::Locality where_ = impl::Locality::memory;  // the pass's inputs fit in L2: interleave blocks
  const std::vector<std::size_t>* bounds_ = nullptr;
  double* part_ = nullptr;
};

// memcpy that accepts the null pointers of empty buffers (memcpy may not be passed them).
inline void copy_bytes(void* dst, const void* src, std::size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

// apply() of operator.hpp on host memory with the host kernels (the same bits): out := ca a + cb b
// over the slice [begin, begin + len) of the global buffer, tensor by tensor; threads, when the
// host space has them, take runs of 4096 elements. With also_to (indexed like out), the same
// pass writes the result there too (the in-place all-gather's push; it may be b, since each
// element's b is read before its result is written).
template <class T>
void apply_slice(T* out, const T* a, const T* b, std::size_t begin, std::size_t len,
                 const std::vector<std::size_t>& bounds, const double* summed, T* also_to = nullptr) {
  constexpr std::size_t kRun = 4096;
  auto run = [=](std::size_t s, std::size_t e, double ca, double cb) {
    impl::apply_host(out + s, a + s, b + s, e - s, ca, cb, also_to ? also_to + s : nullptr);
  };
  for (std::size_t t = 0; t + 1 < bounds.size(); ++t) {
    std::size_t lo = 0, hi = 0;
    if (!impl::overlap(bounds, t, begin, len, &lo, &hi)) continue;
    const double* p = summed + kPartials * t;
    const double ca = coefficient(p[0], p[1]), cb = coefficient(p[0], p[2]);
    if (Host().concurrency() == 1) {
      run(lo, hi, ca, cb);
      continue;
    }
    Kokkos::parallel_for("kdist::adasum::apply", Kokkos::RangePolicy<Host>(0, (hi - lo + kRun - 1) / kRun),
                         [=](const std::size_t k) {
                           const std::size_t s = lo + k * kRun;
                           run(s, std::min(s + kRun, hi), ca, cb);
                         });
  }
}

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
  std::vector<char> bad_a, bad_b;       // non-finite flags of the raw inputs read by a partials step
  std::vector<char> pack_out, pack_in;  // doubling's messages: the vector, then its markers
  void pack() {
    copy_bytes(pack_out.data(), S, m * sizeof(T));
    copy_bytes(pack_out.data() + m * sizeof(T), bad(), tensors * sizeof(double));
  }
  PartialStream<T> stream;                     // the partials of the level in progress
  const comm::SharedWindow* window = nullptr;  // the data lives in its block; peers read in place
  char token = 1;                              // the "ready" / "done" messages' payload
  std::vector<char> tokens_in;                 // one slot per token received in a step
  T* block(int engine_rank) const { return window ? static_cast<T*>(window->block(engine_rank)) : nullptr; }

  // The partials of the whole slice in one pass (the fold, doubling), in the stream's order.
  void whole_partials(const T* a, const T* b) {
    stream.start(0, m, g0, &bounds, part.data());
    stream.finish(a, b);
  }
  // After a partials pass: which tensors' pieces of a / b held a NaN or Inf (non-finite norms).
  void flag_nonfinite() {
    bad_a.assign(tensors, 0);
    bad_b.assign(tensors, 0);
    for (std::size_t t = 0; t < tensors; ++t) {
      bad_a[t] = !std::isfinite(part[kPartials * t + 1]);
      bad_b[t] = !std::isfinite(part[kPartials * t + 2]);
    }
  }

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
    if (window) window->sync();  // what peers pushed into this block, before the caller reads it
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
  Builder(comm::Engine& engine, std::shared_ptr<State<T>> st, const Topology* hier, bool doubling, std::size_t chunk,
          bool chunk_everywhere)
      : st_(std::move(st)),
        s_(*st_),
        hier_(hier),
        engine_(engine),
        me_(engine.rank()),
        doubling_(doubling && !hier),
        chunk_(chunk),
        chunk_everywhere_(chunk_everywhere) {
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
    // Flat doubling over a power of two: level 0's vector rides in the Engine's signature check
    // to the same partner (rank ^ 1), so at 2 ranks the whole all-reduce is one message. Only for
    // small vectors: the check copies its message in and out (three passes over the payload),
    // which above a few tens of KiB costs more than the message saved (forced doubling of 16 MiB
    // took 52-55 ms with it against 27 ms without, on shared memory).
    constexpr std::size_t kMaxCheckPayload = 64u << 10;
    piggyback_ = doubling_ && q_ == 0 && L_ > 0 && engine.options().check_consistency &&
                 s_.n * sizeof(T) + s_.tensors * sizeof(double) <= kMaxCheckPayload;
    if (s_.window) {
      node_in_place_ = k_ > 1;
      for (int l = 0; l < k_ && hier_; ++l) node_in_place_ = node_in_place_ && s_.block(hier_->node_peer(l));
      s_.tokens_in.assign(static_cast<std::size_t>(std::max(k_, L_ + 1)), 0);
    }
  }

  /// The bytes level 0 exchanges inside the check (piggyback()), packed now from the input.
  comm::CheckPayload check_payload() {
    if (!piggyback_) return {};
    s_.pack();
    return {s_.pack_out.data(), s_.pack_in.data(), s_.pack_out.size()};
  }

  comm::Schedule build() {
    // Room for the in-place path's steps (about six a level, a few more around them), so that
    // adding them moves no std::function; chunked levels grow the vector as before.
    sched_.reserve(static_cast<std::size_t>(8 + 6 * L_));
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
      // Scratch: the whole slice for the fold and for doubling, half of it for the halving steps;
      // none when every level reads its partner in place (a pool visit costs locks and allocations).
      if (folds_in_ || doubling_ || !every_level_in_place())
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
    s_.node_parts.assign(k, std::vector<double>(s_.msg(), 0.0));
    if (node_in_place_) return node_average_in_place();
    s_.padded.assign(s_.m * k, T(0));
    std::copy(s_.data, s_.data + s_.n, s_.padded.begin());
    s_.slice.assign(s_.m, T(0));
    s_.S = s_.slice.data();
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
    s_.planned.vector_messages += 1;
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
          st->whole_partials(st->S, st->tmp());
          if (raw) {
            st->flag_nonfinite();
            st->attribute(me, odd);
          }
          for (std::size_t t = 0; t < st->tensors; ++t) st->bad()[t] = std::min(st->bad()[t], st->fold_bad[t]);
        });
    s_.planned.vector_exchanges += 1;
    node_sum(kTagNode + 63);
    if (k_ > 1) s_.planned.partial_reductions += 1;
    sched_.step().then([st = st_] {
      Phase phase("kdist::adasum::apply");
      apply_slice(st->S, st->S, st->tmp(), st->g0, st->m, st->bounds, st->part.data());
    });
  }

  // One halving level: the partner, which half this rank keeps, and where raw inputs came from.
  struct Level {
    int l, partner;
    bool lower, raw_here;
    double mine_from, theirs_from;
    std::size_t keep_lo, keep_hi, send_lo, send_hi;
  };
  Level plan_level(int l) {
    const int d = 1 << l;
    Level lv;
    lv.l = l;
    lv.partner = real(v_ ^ d);
    lv.lower = (v_ & d) == 0;
    // Level 0 of flat mode reads raw inputs, except those of ranks that folded one in.
    const bool mine_raw = raw_ && l == 0 && v_ >= q_, theirs_raw = raw_ && l == 0 && (v_ ^ d) >= q_;
    lv.raw_here = mine_raw || theirs_raw;
    lv.mine_from = mine_raw ? me_ : kNoRank;
    lv.theirs_from = theirs_raw ? lv.partner : kNoRank;
    const std::size_t mid = lo_ + (hi_ - lo_) / 2;
    lv.keep_lo = lv.lower ? lo_ : mid;
    lv.keep_hi = lv.lower ? mid : hi_;
    lv.send_lo = lv.lower ? mid : lo_;
    lv.send_hi = lv.lower ? hi_ : mid;
    slices_.push_back({lo_, hi_});
    return lv;
  }

  // Level l of vector halving, distance doubling, with partner v XOR 2^l: form the partials of
  // the kept half (the partner's piece received in chunks, each summed while the next moves, or
  // read in place), sum them over the 2^(l+1) holders, apply (at the last level chunk by chunk,
  // see gather_level).
  void halving_level(int l) {
    const Level lv = plan_level(l);
    const bool in_place = reads_in_place(lv.partner);
    // a is the lower virtual rank's vector; the partner's piece is in tmp or its block.
    const T* theirs = in_place ? s_.block(lv.partner) + slice_offset() + lv.keep_lo : nullptr;
    auto a_b = [lower = lv.lower, keep_lo = lv.keep_lo, theirs](State<T>& st) {
      const T* mine = st.S + keep_lo;
      const T* other = theirs ? theirs : st.tmp();
      return lower ? std::make_pair(mine, other) : std::make_pair(other, mine);
    };
    if (in_place) {
      if (lv.mine_from != kNoRank && lv.theirs_from != kNoRank)  // both inputs as submitted (symmetric)
        hear_inputs_final({lv.partner}, kTagReady + l);
      else
        tell_and_hear({lv.partner}, kTagReady + l);
      sched_.then([st = st_, keep_lo = lv.keep_lo, keep_hi = lv.keep_hi] {
        st->window->sync();
        st->stream.start(keep_lo, keep_hi, st->g0, &st->bounds, st->part.data());
      });
      sched_.step();
      s_.planned.in_place_levels += 1;
    } else {
      receive_in_chunks(lv, a_b);
    }
    sched_.then([st = st_, a_b, lv] {
      Phase phase("kdist::adasum::partials");
      const auto ab = a_b(*st);
      st->stream.finish(ab.first, ab.second);
      if (lv.raw_here) {
        st->flag_nonfinite();
        st->attribute(lv.lower ? lv.mine_from : lv.theirs_from, lv.lower ? lv.theirs_from : lv.mine_from);
      }
    });
    node_sum(kTagNode + l);
    sum_partials_over_holders(l);
    // The last level applies its first chunk here and the rest while the all-gather sends; in
    // place, it writes the result into the partner's block as well (the all-gather's push).
    const std::size_t keep_n = lv.keep_hi - lv.keep_lo;
    const std::size_t apply_n = l == L_ - 1 && !in_place ? std::min(chunk_for(lv.partner), keep_n) : keep_n;
    T* push_to = l == L_ - 1 && in_place ? s_.block(lv.partner) + slice_offset() + lv.keep_lo : nullptr;
    sched_.step().then([st = st_, a_b, keep_lo = lv.keep_lo, apply_n, push_to] {
      Phase phase("kdist::adasum::apply");
      const auto ab = a_b(*st);
      apply_slice(st->S + keep_lo, ab.first, ab.second, st->g0 + keep_lo, apply_n, st->bounds, st->part.data(),
                  push_to);
    });
    lo_ = lv.keep_lo;
    hi_ = lv.keep_hi;
    last_lower_ = lv.lower;
  }

  // The exchange of halves in chunks; the partials of each received chunk are summed while the
  // next one moves (the last chunk's by the step that follows).
  template <class AB>
  void receive_in_chunks(const Level& lv, AB a_b) {
    const std::size_t K = chunk_for(lv.partner), keep_n = lv.keep_hi - lv.keep_lo, send_n = lv.send_hi - lv.send_lo;
    const std::size_t chunks = std::max<std::size_t>({1, (keep_n + K - 1) / K, (send_n + K - 1) / K});
    for (std::size_t c = 0; c < chunks; ++c) {
      sched_.step();
      const std::size_t s0 = std::min(c * K, send_n), s1 = std::min(s0 + K, send_n);
      const std::size_t r0 = std::min(c * K, keep_n), r1 = std::min(r0 + K, keep_n);
      if (s1 > s0) sched_.send(lv.partner, Buffer::host(s_.S + lv.send_lo + s0, s1 - s0), kTagHalve + lv.l);
      if (r1 > r0) sched_.recv(lv.partner, Buffer::host(s_.tmp() + r0, r1 - r0), kTagHalve + lv.l);
      if (s1 > s0) s_.planned.vector_messages += 1;
      if (c == 0) {
        sched_.during([st = st_, keep_lo = lv.keep_lo, keep_hi = lv.keep_hi] {
          st->stream.start(keep_lo, keep_hi, st->g0, &st->bounds, st->part.data());
        });
      } else {  // the chunk before has arrived: sum it while this one moves
        sched_.during([st = st_, a_b, upto = lv.keep_lo + r0] {
          Phase phase("kdist::adasum::partials");
          const auto ab = a_b(*st);
          st->stream.feed(ab.first, ab.second, upto);
        });
      }
    }
    s_.planned.vector_bytes_sent += static_cast<long long>(send_n) * sizeof(T);
    s_.planned.vector_exchanges += 1;
  }

  // ---- in place, through the shared window (the data is this rank's block) -------------------
  //
  // Levels whose partner shares the node read its block where it lies, and the all-gather writes
  // into it. Reads: a rank tells a halving partner with a one-byte message (after MPI_Win_sync) that
  // its vector after the level before is final, and the partner reads only after that message. The
  // first read of a partner's input as submitted needs no message when the Engine checks: the
  // check's agreement, which comes before the first step, already says that the partner has
  // submitted, and every rank syncs its window before submitting (hear_inputs_final). Every read of
  // a block (a partials pass, the node average) comes before a message that the reader sends the
  // block's owner afterwards and the owner waits for (the partials round; in hierarchical mode the
  // node's partials or gather round). Writes: a halving level writes only the kept half of one's own
  // block, which the partner does not read. The all-gather pushes: at gather level l a rank writes
  // its piece into the level-l partner's block at the same offsets (the last level's apply writes it
  // there directly), then tells the partner with a one-byte message, which the partner waits for
  // before it pushes the grown piece on. The range pushed into is the partner's sent half of level
  // l: nobody reads it after that level's partials (the pusher read it then) and nobody else writes
  // it. After its last message a rank syncs its window once more (State::finish), and the caller may
  // read and write its buffer as soon as wait() returns: nothing is left that reads it or writes it.
  // Pushing instead of reading the partner's piece saves the final "done reading" round and, at the
  // last level, a pass: the apply stores each result twice.

  bool reads_in_place(int peer) const { return s_.window && (k_ == 1 || node_in_place_) && s_.block(peer) != nullptr; }
  bool every_level_in_place() const {
    for (int l = 0; l < L_; ++l)
      if (!reads_in_place(real(v_ ^ (1 << l)))) return false;
    return true;
  }
  // The partner's copy of this rank's slice: same offsets in its block (same node position).
  std::size_t slice_offset() const { return static_cast<std::size_t>(s_.S - s_.data); }

  // A step that exchanges one-byte messages with `peers` after MPI_Win_sync; its local work
  // (the caller's then(), which syncs again before reading) runs once every peer's has come.
  void tell_and_hear(const std::vector<int>& peers, int tag) {
    sched_.step().then([st = st_] { st->window->sync(); });
    sched_.step();
    for (std::size_t i = 0; i < peers.size(); ++i) {
      sched_.send(peers[i], Buffer::host(&s_.token, 1), tag);
      sched_.recv(peers[i], Buffer::host(&s_.tokens_in[i], 1), tag);
    }
  }
  // Before the first read of peers' inputs, unchanged since they submitted: with the Engine's
  // check on, the schedule starts only once every rank has submitted (Engine::submit), each
  // after syncing its window (allreduce_host), so the one-byte round would only repeat that.
  void hear_inputs_final(const std::vector<int>& peers, int tag) {
    if (!engine_.options().check_consistency) return tell_and_hear(peers, tag);
    sched_.step();
  }
  // Gather level l, in place: push this rank's piece into the partner's block (the last level's
  // apply already did), say so, and wait for the partner's piece.
  void gather_in_place(int l, int partner) {
    if (l != L_ - 1) {
      T* theirs = s_.block(partner) + slice_offset();
      sched_.step().then([st = st_, theirs, lo = lo_, hi = hi_] {
        st->window->sync();  // the piece holds what the partner of the level before pushed
        Phase phase("kdist::adasum::gather");
        std::copy(st->S + lo, st->S + hi, theirs + lo);
      });
    }
    tell_and_hear({partner}, kTagGathered + l);
    s_.planned.in_place_levels += 1;
    lo_ = slices_[static_cast<std::size_t>(l)].first;
    hi_ = slices_[static_cast<std::size_t>(l)].second;
  }

  // Hierarchical, in place: this rank's slice of the node average, read from every node peer's
  // block, written into its own block (a region no peer reads).
  void node_average_in_place() {
    std::vector<int> peers;
    for (int l = 0; l < k_; ++l)
      if (l != s_.local) peers.push_back(hier_->node_peer(l));
    std::vector<const T*> blocks;
    for (int l = 0; l < k_; ++l) blocks.push_back(s_.block(hier_->node_peer(l)));
    s_.S = s_.data + s_.g0;
    hear_inputs_final(peers, kTagNodeReady);
    sched_.then([st = st_, blocks] {
      st->window->sync();
      Phase phase("kdist::adasum::node_average");
      const T f = T(1) / static_cast<T>(blocks.size());
      for (std::size_t i = 0; i < st->m; ++i) {
        const std::size_t g = st->g0 + i;
        T x = T(0);
        if (g < st->n)
          for (const T* b : blocks) x += b[g];
        st->S[i] = x * f;
      }
    });
    s_.planned.in_place_levels += 1;
  }

  // Hierarchical, in place: push this rank's slice of the result into every node peer's block
  // (where only its owner reads, and only after the message that follows), then hear theirs.
  void node_gather_in_place() {
    std::vector<int> peers;
    std::vector<T*> blocks;
    for (int l = 0; l < k_; ++l)
      if (l != s_.local) {
        peers.push_back(hier_->node_peer(l));
        blocks.push_back(s_.block(hier_->node_peer(l)));
      }
    sched_.step().then([st = st_, blocks] {
      st->window->sync();
      Phase phase("kdist::adasum::node_gather");
      const std::size_t lo = std::min(st->g0, st->n), hi = std::min(st->g0 + st->m, st->n);
      for (T* b : blocks) std::copy(st->data + lo, st->data + hi, b + lo);
    });
    tell_and_hear(peers, kTagNodeGathered);
    s_.planned.in_place_levels += 1;
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
    // One message a level: the vector and its non-finite markers packed together (every
    // message costs microseconds of software on a TCP link, more than these bytes do).
    const std::size_t vec_bytes = s_.m * sizeof(T), bytes = vec_bytes + s_.tensors * sizeof(double);
    s_.pack_out.resize(bytes);
    s_.pack_in.resize(bytes);
    if (l == 0 && piggyback_) {
      sched_.step();  // the signature check brought the partner's bytes into pack_in
    } else {
      sched_.step().then([st = st_] { st->pack(); });
      sched_.step()
          .send(partner, Buffer::host(s_.pack_out.data(), bytes), kTagHalve + l)
          .recv(partner, Buffer::host(s_.pack_in.data(), bytes), kTagHalve + l);
    }
    sched_.then([st = st_, lower, raw_here, mine_from, theirs_from, tensors, vec_bytes] {
      Phase phase("kdist::adasum::pair");
      copy_bytes(st->tmp(), st->pack_in.data(), vec_bytes);
      copy_bytes(st->other.data(), st->pack_in.data() + vec_bytes, st->tensors * sizeof(double));
      for (int t = 0; t < tensors; ++t) st->bad()[t] = std::min(st->bad()[t], st->other[static_cast<std::size_t>(t)]);
      T* mine = st->S;
      const T* theirs = st->tmp();
      const T* a = lower ? mine : theirs;
      const T* b = lower ? theirs : mine;
      st->whole_partials(a, b);
      if (raw_here) {
        st->flag_nonfinite();
        st->attribute(lower ? mine_from : theirs_from, lower ? theirs_from : mine_from);
      }
      apply_slice(mine, a, b, st->g0, st->m, st->bounds, st->part.data());
    });
    s_.planned.vector_bytes_sent += static_cast<long long>(s_.m) * sizeof(T);
    s_.planned.vector_exchanges += 1;
    s_.planned.vector_messages += 1;
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

  // All-gather in reverse: hand the partner this rank's piece of the level-l slice, in chunks.
  // At the last level the piece is still being applied: each chunk is applied while the chunk
  // before it is sent (halving_level applied the first).
  void gather_level(int l) {
    const int partner = real(v_ ^ (1 << l));
    if (reads_in_place(partner)) return gather_in_place(l, partner);
    const std::size_t plo = slices_[static_cast<std::size_t>(l)].first;
    const std::size_t phi = slices_[static_cast<std::size_t>(l)].second;
    const std::size_t olo = lo_ == plo ? hi_ : plo, ohi = lo_ == plo ? phi : lo_;  // partner's piece
    const std::size_t K = chunk_for(partner), mine_n = hi_ - lo_, theirs_n = ohi - olo;
    const std::size_t chunks = std::max<std::size_t>({1, (mine_n + K - 1) / K, (theirs_n + K - 1) / K});
    const bool applying = l == L_ - 1;
    for (std::size_t c = 0; c < chunks; ++c) {
      sched_.step();
      const std::size_t s0 = std::min(c * K, mine_n), s1 = std::min(s0 + K, mine_n);
      const std::size_t r0 = std::min(c * K, theirs_n), r1 = std::min(r0 + K, theirs_n);
      if (s1 > s0) sched_.send(partner, Buffer::host(s_.S + lo_ + s0, s1 - s0), kTagGather + l);
      if (r1 > r0) sched_.recv(partner, Buffer::host(s_.S + olo + r0, r1 - r0), kTagGather + l);
      if (s1 > s0) s_.planned.vector_messages += 1;
      const std::size_t next0 = std::min(s1, mine_n), next1 = std::min(next0 + K, mine_n);
      if (applying && next1 > next0) {
        sched_.during([st = st_, lower = last_lower_, lo = lo_, next0, next1] {
          Phase phase("kdist::adasum::apply");
          T* mine = st->S + lo + next0;
          const T* theirs = st->tmp() + next0;
          apply_slice(mine, lower ? mine : theirs, lower ? theirs : mine, st->g0 + lo + next0, next1 - next0,
                      st->bounds, st->part.data());
        });
      }
    }
    s_.planned.vector_bytes_sent += static_cast<long long>(mine_n) * sizeof(T);
    s_.planned.vector_exchanges += 1;
    lo_ = plo;
    hi_ = phi;
  }

  void unfold() { send_slice(cross_rank(c_ + 1), kTagUnfold, kTagUnfoldBad); }

  // Hierarchical: all-gather the slices inside the node.
  void node_gather() {
    if (k_ <= 1) return;
    if (L_ == 0) node_sum(kTagNode + 62);  // one node: still agree on non-finite inputs
    if (node_in_place_) return node_gather_in_place();
    sched_.step()
        .allgather(comm::Group::of(hier_->node()), Buffer::host(s_.slice.data(), s_.m),
                   Buffer::host(s_.padded.data(), s_.padded.size()))
        .then([st = st_] { std::copy(st->padded.begin(), st->padded.begin() + static_cast<long>(st->n), st->data); });
  }

  std::shared_ptr<State<T>> st_;
  State<T>& s_;
  const Topology* hier_;
  const comm::Engine& engine_;
  comm::Schedule sched_{"adasum"};
  int me_, k_ = 1, N_ = 1, c_ = 0, Pp_ = 1, L_ = 0, q_ = 0, v_ = 0;
  bool doubling_ = false, raw_ = true, folds_in_ = false, last_lower_ = true, node_in_place_ = false,
       piggyback_ = false;
  std::size_t chunk_ = 1;  // elements per VHDD chunk
  bool chunk_everywhere_ = false;

  // A partner on this node is reached by MPI copying on the CPU, which a chunk's partial sums
  // cannot overlap: unless the caller set a chunk size, such levels go in one message (256 KiB
  // chunks cost 6-30 % there at 4-16 MiB, and saved 1.5-9 % at 16 MiB over the emulated link).
  std::size_t chunk_for(int partner) const {
    return chunk_everywhere_ || !engine_.shares_node(partner) ? chunk_ : std::numeric_limits<std::size_t>::max() / 2;
  }
  std::size_t lo_ = 0, hi_ = 0;
  std::vector<std::pair<std::size_t, std::size_t>> slices_;  // slice before each level
};

}  // namespace

namespace impl {

template <class T>
comm::Request allreduce_host(comm::Engine& engine, T* data, std::size_t n, comm::Layout layout, const Options& options,
                             std::function<void()> on_success, const comm::SharedWindow* window) {
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
  if (window && window->engine() != &engine)
    kdist::impl::throw_invalid("kdist::adasum::allreduce", "the SharedBuffer was made with another Engine");
  s.window = options.in_place ? window : nullptr;
  s.part.assign(s.msg(), 0.0);
  s.other.assign(s.msg(), 0.0);
  for (std::size_t t = 0; t < s.tensors; ++t) s.bad()[t] = kNoRank;
  const bool doubling = !hier && (options.algorithm == Algorithm::doubling ||
                                  (options.algorithm == Algorithm::automatic && n * sizeof(T) < options.small_bytes));
  const std::size_t chunk_bytes = options.chunk_bytes ? options.chunk_bytes : default_chunk_bytes();
  const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes / sizeof(T));
  Builder<T> builder(engine, st, hier, doubling, chunk, options.chunk_bytes != 0);
  comm::Schedule sched = builder.build();
  const comm::CheckPayload payload = builder.check_payload();
  // Ranks that chunk differently would send messages of different sizes: the chunk is part of
  // the signature whenever it can split a half.
  std::string label = doubling ? "adasum/doubling" : n > chunk ? "adasum/chunks of " + std::to_string(chunk) : "adasum";
  if (s.window) label += "/in place";
  auto what =
      comm::OpDescription::composite(dtype_of<T>(), static_cast<long long>(n), std::move(label), std::move(layout));
  if (s.window) s.window->sync();  // orders the caller's writes before the check's messages
  return engine.submit(std::move(sched), std::move(what), payload);
}

template comm::Request allreduce_host<float>(comm::Engine&, float*, std::size_t, comm::Layout, const Options&,
                                             std::function<void()>, const comm::SharedWindow*);
template comm::Request allreduce_host<double>(comm::Engine&, double*, std::size_t, comm::Layout, const Options&,
                                              std::function<void()>, const comm::SharedWindow*);

}  // namespace impl

std::size_t default_chunk_bytes() {
  constexpr std::size_t lo = 64u << 10, hi = 1u << 20;
  const std::size_t l2 = impl::l2_cache_bytes();
  return l2 ? std::min(hi, std::max(lo, l2 / 8)) : std::size_t(256u << 10);
}

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
