// The memory-traffic bound of the in-place Adasum all-reduce (adasum::SharedBuffer), measured with
// the passes' own access pattern: the same shared-window blocks, the same halves, read where the
// same ranks last wrote them, with the arithmetic cut to one add per element. STREAM on private
// arrays (bandwidth.hpp) cannot stand in for it: half of each pass reads lines that the partner
// core has just written, which come from that core's cache or through the shared L3 at a rate no
// private-array kernel sees.
//   for each halving level l (partner p = rank ^ 2^l, the slice halved as VHDD halves it):
//     read    s += mine[i] + p's[i] over the kept half   (the partial sums' traffic)
//     triad   mine[i] = 0.5 (mine[i] + p's[i]) over the kept half   (the apply's traffic)
//   for each level, last first:
//     copy    mine[i] = p's[i] over the partner's piece  (the all-gather's traffic)
// Every pass starts after a barrier and MPI_Win_sync on every rank (the algorithm's one-byte
// messages order its passes the same way), and only the pass is timed. The result is the sum over
// passes of each pass's median over `reps` (after one warm-up) of the maximum over ranks: no
// algorithm with these three dependent passes moves its bytes faster. Latency (the messages, the
// partial sums' round) is not in it. Needs a power-of-two number of ranks, all on one node
// (returns 0 otherwise); collective over `engine`.
#pragma once

#include <mpi.h>
#include <kdist/adasum/shared_buffer.hpp>
#include <kdist/core/timer.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "bench_mpi.hpp"

namespace kdist_bench {

namespace impl {
inline float read_pair(const float* a, const float* b, std::size_t n) {
  float q[16] = {};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) q[k] += a[i + k] + b[i + k];
  for (; i < n; ++i) q[0] += a[i] + b[i];
  float s = 0;
  for (float x : q) s += x;
  return s;
}
}  // namespace impl

inline double in_place_pattern_bound(kdist::comm::Engine& engine, std::size_t n, int reps) {
  const int P = engine.size(), me = engine.rank();
  kdist::adasum::SharedBuffer<float> buf(engine, n);
  bool usable = (P & (P - 1)) == 0 && P > 1 && buf.window().node_size() == P;
  int all_usable = 0, mine_usable = usable ? 1 : 0;
  MPI_Allreduce(&mine_usable, &all_usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_usable) return 0.0;
  for (std::size_t i = 0; i < n; ++i) buf.data()[i] = 0.001f * static_cast<float>((i + 13 * me) % 97);
  struct Pass {
    int kind, partner;  // 0 read, 1 triad, 2 copy
    std::size_t lo, hi;
  };
  std::vector<Pass> passes;
  std::vector<std::pair<std::size_t, std::size_t>> pieces;  // the partner's piece, per level
  std::size_t lo = 0, hi = n;
  for (int d = 1; d < P; d *= 2) {
    const int partner = me ^ d;
    const std::size_t mid = lo + (hi - lo) / 2;
    const bool lower = (me & d) == 0;
    pieces.push_back(lower ? std::make_pair(mid, hi) : std::make_pair(lo, mid));
    lo = lower ? lo : mid;
    hi = lower ? mid : hi;
    passes.push_back({0, partner, lo, hi});
    passes.push_back({1, partner, lo, hi});
  }
  for (int l = static_cast<int>(pieces.size()) - 1; l >= 0; --l)
    passes.push_back(
        {2, me ^ (1 << l), pieces[static_cast<std::size_t>(l)].first, pieces[static_cast<std::size_t>(l)].second});
  std::vector<std::vector<double>> times(passes.size());
  float sink = 0;
  for (int r = 0; r < reps + 1; ++r)
    for (std::size_t k = 0; k < passes.size(); ++k) {
      const Pass& p = passes[k];
      float* mine = buf.data();
      const float* theirs = static_cast<const float*>(buf.window().block(p.partner));
      MPI_Barrier(MPI_COMM_WORLD);
      buf.window().sync();
      const double t0 = kdist::Clock::local_now();
      if (p.kind == 0) sink += impl::read_pair(mine + p.lo, theirs + p.lo, p.hi - p.lo);
      if (p.kind == 1)
        for (std::size_t i = p.lo; i < p.hi; ++i) mine[i] = 0.5f * (mine[i] + theirs[i]);
      if (p.kind == 2) std::copy(theirs + p.lo, theirs + p.hi, mine + p.lo);
      const double t = max_over_ranks(kdist::Clock::local_now() - t0);
      if (r > 0) times[k].push_back(t);
    }
  double bound = sink < 0 ? 1e-30 : 0.0;  // keeps the read pass's result alive
  for (auto& t : times) bound += median(t);
  return bound;
}

}  // namespace kdist_bench
