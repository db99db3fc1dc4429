// The memory-traffic bound of the in-place Adasum all-reduce (adasum::SharedBuffer), measured with
// the passes' own access pattern: the same shared-window blocks, the same halves, read where the
// same ranks last wrote them, with the arithmetic cut to one add per element. STREAM on private
// arrays (bandwidth.hpp) cannot stand in for it: half of each pass reads lines that the partner
// core has just written, which come from that core's cache or through the shared L3 at a rate no
// private-array kernel sees.
//   for each halving level l (partner p = rank ^ 2^l, the slice halved as VHDD halves it):
//     read    s += mine[i] + p's[i] over the kept half   (the partial sums' traffic)
//     triad   mine[i] = 0.5 (mine[i] + p's[i]) over the kept half  (the apply's traffic);
//             at the last level p's[i] gets the result too  (the apply's push)
//   for each level but the last, last first:
//     push    p's[i] = mine[i] over this rank's piece  (the all-gather's traffic)
// Every pass starts after a barrier and MPI_Win_sync on every rank (the algorithm's one-byte
// messages order its passes the same way), and only the pass is timed. sample() returns the sum
// over passes of the slowest rank's time: what these three dependent passes cost with the
// arithmetic taken out. Latency (the messages, the partial sums' round) is not in it. bench_adasum
// takes one sample after each repeat of the operation, on the same buffer, so that a drift of
// the host lands on both. Needs a power-of-two number of ranks, all on one node (usable());
// collective over the buffer's Engine, on MPI_COMM_WORLD's ranks. The passes' loops run at the
// widest vector ISA the CPU has, as the kernels they bound do (adasum/host_kernels dispatches to
// AVX2 / AVX-512 at run time; the build itself targets plain x86-64).
#pragma once

#include <mpi.h>
#include <kdist/adasum/shared_buffer.hpp>
#include <kdist/core/timer.hpp>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "common/bench_mpi.hpp"

namespace kdist_bench {

// GCC's target_clones: one copy per ISA, the widest the CPU runs picked when the program loads.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__)
#define KDIST_BENCH_WIDEST_ISA __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KDIST_BENCH_WIDEST_ISA
#endif

namespace impl {
KDIST_BENCH_WIDEST_ISA inline float read_pair(const float* a, const float* b, std::size_t n) {
  float q[16] = {};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) q[k] += a[i + k] + b[i + k];
  for (; i < n; ++i) q[0] += a[i] + b[i];
  float s = 0;
  for (float x : q) s += x;
  return s;
}
/// mine[i] = 0.5 (mine[i] + theirs[i]) on [lo, hi), and theirs[i] too with `push`.
KDIST_BENCH_WIDEST_ISA inline void average_pair(float* mine, float* theirs, std::size_t lo, std::size_t hi, bool push) {
  if (push)
    for (std::size_t i = lo; i < hi; ++i) mine[i] = theirs[i] = 0.5f * (mine[i] + theirs[i]);
  else
    for (std::size_t i = lo; i < hi; ++i) mine[i] = 0.5f * (mine[i] + theirs[i]);
}
}  // namespace impl

class InPlaceBound {
 public:
  /// On the buffer the operation uses, so that each leaves the caches as the other finds them.
  explicit InPlaceBound(kdist::adasum::SharedBuffer<float>& buf) : buf_(buf) {
    const int P = buf.window().engine()->size(), me = buf.window().engine()->rank();
    const int mine = (P & (P - 1)) == 0 && P > 1 && buf.window().node_size() == P ? 1 : 0;
    int all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    usable_ = all == 1;
    if (!usable_) return;
    std::vector<std::pair<std::size_t, std::size_t>> kept;  // this rank's piece after each level
    std::size_t lo = 0, hi = buf.size();
    for (int d = 1; d < P; d *= 2) {
      const std::size_t mid = lo + (hi - lo) / 2;
      const bool lower = (me & d) == 0;
      lo = lower ? lo : mid;
      hi = lower ? mid : hi;
      kept.push_back({lo, hi});
      passes_.push_back({Kind::read, me ^ d, lo, hi});
      passes_.push_back({2 * d < P ? Kind::triad : Kind::triad_push, me ^ d, lo, hi});
    }
    for (int l = static_cast<int>(kept.size()) - 2; l >= 0; --l) {
      const auto& piece = kept[static_cast<std::size_t>(l)];
      passes_.push_back({Kind::push, me ^ (1 << l), piece.first, piece.second});
    }
  }
  /// False (and sample() 0) unless the ranks are a power of two >= 2 on one node.
  bool usable() const { return usable_; }

  /// One run of the passes: the sum over passes of the slowest rank's time. Collective.
  double sample() {
    double total = 0;
    for (const Pass& p : passes_) {
      float* mine = buf_.data();
      float* theirs = static_cast<float*>(buf_.window().block(p.partner));
      MPI_Barrier(MPI_COMM_WORLD);
      buf_.window().sync();
      const double t0 = kdist::Clock::local_now();
      if (p.kind == Kind::read) sink_ += impl::read_pair(mine + p.lo, theirs + p.lo, p.hi - p.lo);
      if (p.kind == Kind::triad || p.kind == Kind::triad_push)
        impl::average_pair(mine, theirs, p.lo, p.hi, p.kind == Kind::triad_push);
      if (p.kind == Kind::push) std::copy(mine + p.lo, mine + p.hi, theirs + p.lo);
      total += max_over_ranks(kdist::Clock::local_now() - t0);
    }
    return sink_ < 0 ? total + 1e-30 : total;  // keeps the read pass's result alive
  }

 private:
  enum class Kind { read, triad, triad_push, push };
  struct Pass {
    Kind kind;
    int partner;
    std::size_t lo, hi;
  };
  kdist::adasum::SharedBuffer<float>& buf_;
  std::vector<Pass> passes_;
  bool usable_ = false;
  float sink_ = 0;
};

}  // namespace kdist_bench
