// What the steps of one Adasum all-reduce share (adasum/allreduce.cpp has the algorithm): the
// State every step's local work reads and writes, the streamed partial sums of a level, the
// apply pass on host memory, reused scratch, and the schedule's tag blocks. Internal to adasum/.
#pragma once

#include <kdist/adasum/allreduce.hpp>
#include <kdist/adasum/host_kernels.hpp>
#include <kdist/comm/shared_window.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace kdist {
namespace adasum {
namespace impl {

using Host = Kokkos::DefaultHostExecutionSpace;
/// "No rank had a non-finite input": the identity of the min-reduction of ranks.
constexpr double kNoRank = std::numeric_limits<double>::infinity();

/// The schedule's tag blocks (Schedule tags are < Schedule::kMaxTag): each step of one all-reduce
/// uses its own tag; a per-level block adds the level (at most kMaxLevels) to its base.
struct Tags {
  static constexpr int kMaxLevels = 32;  ///< an int rank count has at most 30 levels
  static constexpr int fold = 1, fold_bad = 2, unfold = 3, unfold_bad = 4;
  static constexpr int halve = 32;         ///< + level: the exchange of halves (and doubling's vectors)
  static constexpr int gather = 96;        ///< + level: the all-gather in reverse
  static constexpr int node = 160;         ///< + level; node + 62 fold level and + 63 the one-node case
  static constexpr int cross = 1024;       ///< + 32 level + round: partials over the holders
  static constexpr int ready = 2048;       ///< + level: in place, "my vector is final"
  static constexpr int gathered = 2112;    ///< + level: in place, "my piece is in your block"
  static constexpr int node_ready = 2177;  ///< in place, the node's inputs are final
  static constexpr int node_gathered = 2178;
  static constexpr int end = 2179;
};
static_assert(Tags::unfold_bad < Tags::halve, "fold tags below the per-level blocks");
static_assert(Tags::halve + Tags::kMaxLevels < Tags::gather, "halving tags overlap the gather's");
static_assert(Tags::gather + Tags::kMaxLevels < Tags::node, "gather tags overlap the node's");
static_assert(Tags::node + 63 < Tags::cross, "node tags overlap the partials'");
static_assert(Tags::cross + 32 * (Tags::kMaxLevels - 1) + Tags::kMaxLevels <= Tags::ready, "partials tags overlap");
static_assert(Tags::ready + Tags::kMaxLevels < Tags::gathered, "ready tags overlap the gathered ones");
static_assert(Tags::gathered + Tags::kMaxLevels < Tags::node_ready, "gathered tags overlap the node's");
static_assert(Tags::end <= comm::Schedule::kMaxTag, "the tags must fit one Schedule tag block");

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

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
