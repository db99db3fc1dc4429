#include <kdist/adasum/allreduce.hpp>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

namespace kdist {
namespace adasum {

Topology::Topology(const comm::Communicator& world, int node_size)
    : node_(world.node(node_size)), cross_(world.cross_node(node_size)) {
  for (int l = 0; l < node_.size(); ++l) node_peers_.push_back(node_.rank_in(world, l));
  for (int x = 0; x < cross_.size(); ++x) cross_peers_.push_back(cross_.rank_in(world, x));
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

}  // namespace

template <class T>
comm::Request allreduce(comm::Engine& engine, T* data, std::size_t n, std::vector<std::size_t> bounds,
                        std::vector<std::string> labels, const Topology* hier, AdasumCounters* counters) {
  impl::check_bounds("kdist::adasum::allreduce", bounds, n);
  auto st = std::make_shared<State<T>>();
  State<T>& s = *st;
  s.data = data;
  s.n = n;
  s.bounds = std::move(bounds);
  s.labels = std::move(labels);
  s.tensors = s.bounds.size() - 1;
  s.counters = counters;
  s.part.assign(s.msg(), 0.0);
  s.other.assign(s.msg(), 0.0);
  for (std::size_t t = 0; t < s.tensors; ++t) s.bad()[t] = kNoRank;
  const int me = engine.rank();

  const MPI_Datatype type = comm::mpi_type<T>();
  const int k = hier ? hier->node().size() : 1;
  const int N = hier ? hier->cross().size() : engine.size();
  const int c = hier ? hier->cross().rank() : me;
  s.node_size = k;
  s.local = hier ? hier->node().rank() : 0;
  auto cross_rank = [&](int x) { return hier ? hier->cross_peer(x) : x; };
  comm::Schedule sched("adasum");

  // ---- hierarchical: node average by reduce-scatter on a padded copy -------------------------
  if (k > 1) {
    s.m = (n + static_cast<std::size_t>(k) - 1) / static_cast<std::size_t>(k);
    s.g0 = s.m * static_cast<std::size_t>(s.local);
    s.padded.assign(s.m * static_cast<std::size_t>(k), T(0));
    std::copy(data, data + n, s.padded.begin());
    s.slice.assign(s.m, T(0));
    s.S = s.slice.data();
    s.node_parts.assign(static_cast<std::size_t>(k), std::vector<double>(s.msg(), 0.0));
    sched.step()
        .reduce_scatter_block(hier->node().raw(), s.padded.data(), s.slice.data(), static_cast<int>(s.m), type)
        .then([st, k] {
          const T f = T(1) / static_cast<T>(k);
          for (auto& x : st->slice) x *= f;
        });
  } else {
    s.m = n;
    s.g0 = 0;
    s.S = data;
  }
  const int mi = static_cast<int>(s.m);
  const int msg = static_cast<int>(s.msg());

  // Partials of the pair just formed are summed over the node's slices (hierarchical).
  auto node_sum_step = [&](int tag) {
    if (k <= 1) return;
    sched.step();
    for (int l = 0; l < k; ++l) {
      if (l == s.local) continue;
      sched.send(hier->node_peer(l), s.part.data(), msg, MPI_DOUBLE, tag);
      sched.recv(hier->node_peer(l), s.node_parts[static_cast<std::size_t>(l)].data(), msg, MPI_DOUBLE, tag);
    }
    sched.then([st] { st->sum_node(); });
    s.planned.partial_bytes_sent += static_cast<long long>(k - 1) * msg * 8;
  };

  // ---- fold for rank counts that are not powers of two ---------------------------------------
  int Pp = 1, L = 0;
  while (Pp * 2 <= N) {
    Pp *= 2;
    ++L;
  }
  const int q = N - Pp;
  const bool folded_away = c < 2 * q && c % 2 == 1;
  const bool folds_in = c < 2 * q && c % 2 == 0;
  // Flat mode reads every raw input exactly once in the first partials step (the fold, or level
  // 0), which attributes non-finite values to their rank; otherwise scan up front.
  const bool raw = k == 1;
  if (!raw || (L == 0 && q == 0)) scan_nonfinite(s, me);
  if (folded_away) {
    sched.step()
        .send(cross_rank(c - 1), s.S, mi, type, kTagFold)
        .send(cross_rank(c - 1), s.bad(), static_cast<int>(s.tensors), MPI_DOUBLE, kTagFoldBad);
    sched.step()
        .recv(cross_rank(c - 1), s.S, mi, type, kTagUnfold)
        .recv(cross_rank(c - 1), s.bad(), static_cast<int>(s.tensors), MPI_DOUBLE, kTagUnfoldBad);
    s.planned.vector_bytes_sent += static_cast<long long>(s.m) * sizeof(T);
    s.planned.vector_exchanges += 2;
  } else {
    const int v = folds_in ? c / 2 : c - q;
    auto real = [&](int virt) { return cross_rank(virt < q ? 2 * virt : virt + q); };
    // Scratch: the whole slice for the fold, half of it for the halving steps.
    s.tmp_buf = ScratchPool<T>::get(folds_in ? s.m : (s.m + 1) / 2);
    if (folds_in) {
      s.fold_bad.assign(s.tensors, kNoRank);
      sched.step()
          .recv(cross_rank(c + 1), s.tmp(), mi, type, kTagFold)
          .recv(cross_rank(c + 1), s.fold_bad.data(), static_cast<int>(s.tensors), MPI_DOUBLE, kTagFoldBad)
          .then([st, raw, me, odd = cross_rank(c + 1)] {
            partials(Host(), st->S, st->tmp(), st->g0, st->m, st->bounds, st->part.data(), raw ? &st->bad_a : nullptr,
                     raw ? &st->bad_b : nullptr);
            if (raw) st->attribute(me, odd);
            for (std::size_t t = 0; t < st->tensors; ++t) st->bad()[t] = std::min(st->bad()[t], st->fold_bad[t]);
          });
      s.planned.vector_exchanges += 1;
      node_sum_step(kTagNode + 63);
      if (k > 1) s.planned.partial_reductions += 1;
      sched.step().then([st] { apply(Host(), st->S, st->S, st->tmp(), st->g0, st->m, st->bounds, st->part.data()); });
    }

    // ---- vector halving, distance doubling -----------------------------------------------------
    std::vector<std::pair<std::size_t, std::size_t>> slices;  // slice before each level
    std::size_t lo = 0, hi = s.m;
    for (int l = 0; l < L; ++l) {
      const int d = 1 << l;
      const int partner = real(v ^ d);
      const bool lower = (v & d) == 0;
      slices.push_back({lo, hi});
      // Level 0 of flat mode reads raw inputs, except those of ranks that folded one in.
      const bool mine_raw = raw && l == 0 && v >= q, theirs_raw = raw && l == 0 && (v ^ d) >= q;
      const bool raw_here = mine_raw || theirs_raw;
      const double mine_from = mine_raw ? me : kNoRank, theirs_from = theirs_raw ? partner : kNoRank;
      const std::size_t first = (hi - lo) / 2, mid = lo + first;
      const std::size_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
      const std::size_t send_lo = lower ? mid : lo, send_hi = lower ? hi : mid;
      sched.step()
          .send(partner, s.S + send_lo, static_cast<int>(send_hi - send_lo), type, kTagHalve + l)
          .recv(partner, s.tmp(), static_cast<int>(keep_hi - keep_lo), type, kTagHalve + l)
          .then([st, lower, keep_lo, keep_hi, raw_here, mine_from, theirs_from] {
            T* mine = st->S + keep_lo;
            const T* theirs = st->tmp();
            const T* a = lower ? mine : theirs;
            const T* b = lower ? theirs : mine;
            partials(Host(), a, b, st->g0 + keep_lo, keep_hi - keep_lo, st->bounds, st->part.data(),
                     raw_here ? &st->bad_a : nullptr, raw_here ? &st->bad_b : nullptr);
            if (raw_here) st->attribute(lower ? mine_from : theirs_from, lower ? theirs_from : mine_from);
          });
      s.planned.vector_bytes_sent += static_cast<long long>(send_hi - send_lo) * sizeof(T);
      s.planned.vector_exchanges += 1;
      node_sum_step(kTagNode + l);
      // Sum over the 2d virtual ranks holding pieces of a and b: recursive doubling.
      for (int r = 0; r <= l; ++r) {
        sched.step()
            .send(real(v ^ (1 << r)), s.part.data(), msg, MPI_DOUBLE, kTagCross + 32 * l + r)
            .recv(real(v ^ (1 << r)), s.other.data(), msg, MPI_DOUBLE, kTagCross + 32 * l + r)
            .then([st] { st->add_into_part(st->other); });
        s.planned.partial_bytes_sent += static_cast<long long>(msg) * 8;
      }
      s.planned.partial_reductions += 1;
      sched.step().then([st, lower, keep_lo, keep_hi] {
        T* mine = st->S + keep_lo;
        const T* theirs = st->tmp();
        apply(Host(), mine, lower ? mine : theirs, lower ? theirs : mine, st->g0 + keep_lo, keep_hi - keep_lo,
              st->bounds, st->part.data());
      });
      lo = keep_lo;
      hi = keep_hi;
    }
    // ---- all-gather in reverse --------------------------------------------------------------
    for (int l = L - 1; l >= 0; --l) {
      const int partner = real(v ^ (1 << l));
      const std::size_t plo = slices[static_cast<std::size_t>(l)].first,
                        phi = slices[static_cast<std::size_t>(l)].second;
      const std::size_t olo = lo == plo ? hi : plo, ohi = lo == plo ? phi : lo;  // partner's piece
      sched.step()
          .send(partner, s.S + lo, static_cast<int>(hi - lo), type, kTagGather + l)
          .recv(partner, s.S + olo, static_cast<int>(ohi - olo), type, kTagGather + l);
      s.planned.vector_bytes_sent += static_cast<long long>(hi - lo) * sizeof(T);
      s.planned.vector_exchanges += 1;
      lo = plo;
      hi = phi;
    }
    if (folds_in) {
      sched.step()
          .send(cross_rank(c + 1), s.S, mi, type, kTagUnfold)
          .send(cross_rank(c + 1), s.bad(), static_cast<int>(s.tensors), MPI_DOUBLE, kTagUnfoldBad);
      s.planned.vector_bytes_sent += static_cast<long long>(s.m) * sizeof(T);
      s.planned.vector_exchanges += 1;
    }
  }

  // ---- hierarchical: all-gather inside the node ---------------------------------------------
  if (k > 1) {
    if (L == 0) node_sum_step(kTagNode + 62);  // one node: still agree on non-finite inputs
    sched.step().allgather(hier->node().raw(), s.slice.data(), s.padded.data(), mi, type).then([st] {
      std::copy(st->padded.begin(), st->padded.begin() + static_cast<long>(st->n), st->data);
    });
  }
  sched.step().then([st] { st->finish(); });
  return engine.submit(std::move(sched), static_cast<long long>(n), comm::dtype_of<T>());
}

template comm::Request allreduce<float>(comm::Engine&, float*, std::size_t, std::vector<std::size_t>,
                                        std::vector<std::string>, const Topology*, AdasumCounters*);
template comm::Request allreduce<double>(comm::Engine&, double*, std::size_t, std::vector<std::size_t>,
                                         std::vector<std::string>, const Topology*, AdasumCounters*);

}  // namespace adasum
}  // namespace kdist
