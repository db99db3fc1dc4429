#include <kdist/core/error.hpp>
#include <kdist/nn/batches.hpp>

#include <algorithm>
#include <climits>
#include <numeric>
#include <random>
#include <string>

namespace kdist::nn {

namespace {
constexpr const char* kWho = "kdist::nn::ShardedBatches";

/// Both 64-bit values, as 32-bit words (std::seed_seq keeps only the low 32 bits of each).
std::mt19937_64 epoch_engine(std::uint64_t seed, std::uint64_t epoch) {
  std::seed_seq seq{std::uint32_t(seed), std::uint32_t(seed >> 32), std::uint32_t(epoch), std::uint32_t(epoch >> 32)};
  return std::mt19937_64(seq);
}
}  // namespace

ShardedBatches::ShardedBatches(int samples, int ranks, int batch_per_rank, std::uint64_t seed)
    : ranks_(ranks), batch_per_rank_(batch_per_rank), seed_(seed) {
  if (samples < 0 || ranks < 1 || batch_per_rank < 1)
    impl::throw_invalid(kWho, "needs samples >= 0, ranks >= 1 and batch_per_rank >= 1, got samples " +
                                  std::to_string(samples) + ", ranks " + std::to_string(ranks) + ", batch_per_rank " +
                                  std::to_string(batch_per_rank));
  if (static_cast<long long>(ranks) * batch_per_rank > INT_MAX)
    impl::throw_invalid(kWho, "ranks * batch_per_rank overflows int");
  order_.resize(static_cast<std::size_t>(samples));
  set_epoch(0);
}

void ShardedBatches::set_epoch(std::uint64_t epoch) {
  epoch_ = epoch;
  std::iota(order_.begin(), order_.end(), 0);
  std::mt19937_64 engine = epoch_engine(seed_, epoch);
  std::shuffle(order_.begin(), order_.end(), engine);
}

int ShardedBatches::batches() const {
  // In 64 bits: samples + global batch - 1 passes INT_MAX for a large set (1.5e9 samples, 1e9 a batch).
  return static_cast<int>((static_cast<long long>(samples()) + global_batch() - 1) / global_batch());
}

int ShardedBatches::global_size(int batch) const {
  if (batch < 0 || batch >= batches())
    impl::throw_invalid(kWho, "batch " + std::to_string(batch) + " is not in [0, " + std::to_string(batches()) + ")");
  return std::min(global_batch(), samples() - batch * global_batch());
}

std::vector<int> ShardedBatches::indices(int batch, int rank) const {
  const int n = global_size(batch);
  if (rank < 0 || rank >= ranks_)
    impl::throw_invalid(kWho, "rank " + std::to_string(rank) + " is not in [0, " + std::to_string(ranks_) + ")");
  // A full batch gives every rank batch_per_rank; a partial one spreads n as evenly as it can.
  const int base = n / ranks_, extra = n % ranks_;
  const int count = base + (rank < extra ? 1 : 0);
  const int begin = batch * global_batch() + rank * base + std::min(rank, extra);
  return std::vector<int>(order_.begin() + begin, order_.begin() + begin + count);
}

}  // namespace kdist::nn
