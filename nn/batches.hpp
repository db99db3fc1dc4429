// Data-parallel mini-batches: which samples each rank reads in each step of an epoch.
//
// Contract. Epoch e is a permutation of [0, N) drawn from (seed, e) (std::mt19937_64 seeded
// through std::seed_seq, then std::shuffle), cut into consecutive global batches of
// G = ranks * batch_per_rank samples; the last one holds the N mod G remaining samples when G
// does not divide N (it is kept, not dropped). Rank r reads a contiguous shard of every global
// batch: positions [r * b, (r + 1) * b) of a full batch; in the last partial batch of n samples the
// first n mod P ranks read n / P + 1, the others n / P, which can be 0 in a tiny last batch.
// Concatenated in rank order the shards are the global batch, in permutation order.
//
// Which samples form each global batch depends only on (N, seed, epoch, G), not on how G is split
// into ranks x batch_per_rank, so a run on 2 x 64 sees the batches of a run on 4 x 32. The order
// is deterministic for one standard library (std::shuffle's algorithm is not standardised: every
// rank of a job runs the same binary, so they agree). Callers must weight by the sample count:
// the step's gradient is the mean over the global batch, so a rank contributes its sum over
// indices(batch, rank) divided by global_size(batch), and the ranks SUM-reduce. A rank with 0
// samples still joins every collective of the step, contributing zeros.
#pragma once

#include <cstdint>
#include <vector>

namespace kdist::nn {

class ShardedBatches {
 public:
  /// Throws kdist::InvalidArgument unless samples >= 0, ranks >= 1 and batch_per_rank >= 1.
  ShardedBatches(int samples, int ranks, int batch_per_rank, std::uint64_t seed);

  /// Draws epoch `epoch`'s permutation; epoch 0 is drawn on construction.
  void set_epoch(std::uint64_t epoch);
  std::uint64_t epoch() const { return epoch_; }

  int samples() const { return static_cast<int>(order_.size()); }
  int ranks() const { return ranks_; }
  int batch_per_rank() const { return batch_per_rank_; }

  /// Global batches per epoch: ceil(N / (ranks * batch_per_rank)).
  int batches() const;
  /// Samples in global batch `batch` (ranks * batch_per_rank, except maybe the last).
  int global_size(int batch) const;
  /// The sample indices rank `rank` reads in global batch `batch` (possibly none).
  std::vector<int> indices(int batch, int rank) const;

 private:
  int global_batch() const { return ranks_ * batch_per_rank_; }

  int ranks_;
  int batch_per_rank_;
  std::uint64_t seed_;
  std::uint64_t epoch_ = 0;
  std::vector<int> order_;  // this epoch's permutation of [0, N)
};

}  // namespace kdist::nn
