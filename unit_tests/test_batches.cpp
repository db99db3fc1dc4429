// nn/batches: the P ranks of a job are simulated in one process (ShardedBatches is pure
// arithmetic on a permutation): coverage, determinism, rank-count independence, the last batch.
#include <catch2/catch.hpp>
#include <kdist/core/error.hpp>
#include <kdist/nn/batches.hpp>

#include <algorithm>
#include <utility>
#include <vector>

using kdist::nn::ShardedBatches;

namespace {
/// Global batch `batch` as the ranks' shards concatenated in rank order.
std::vector<int> concatenated(const ShardedBatches& s, int batch) {
  std::vector<int> all;
  for (int r = 0; r < s.ranks(); ++r) {
    const std::vector<int> mine = s.indices(batch, r);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  return all;
}

std::vector<std::vector<int>> epoch_batches(const ShardedBatches& s) {
  std::vector<std::vector<int>> out;
  for (int b = 0; b < s.batches(); ++b) out.push_back(concatenated(s, b));
  return out;
}
}  // namespace

TEST_CASE("ShardedBatches: every sample once per epoch over all ranks and batches", "[nn][batches]") {
  const int batch_per_rank = 5;
  for (const int n : {47, 41, 3}) {  // 41 at 4 ranks: a last batch of 1 sample, ranks 1..3 get none
    for (int ranks = 1; ranks <= 4; ++ranks) {
      ShardedBatches s(n, ranks, batch_per_rank, 1234);
      for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
        INFO("n " << n << ", ranks " << ranks << ", epoch " << epoch);
        s.set_epoch(epoch);
        CHECK(s.batches() == (n + ranks * batch_per_rank - 1) / (ranks * batch_per_rank));
        std::vector<int> seen(n, 0);
        int total = 0;
        for (int b = 0; b < s.batches(); ++b) {
          int in_batch = 0;
          for (int r = 0; r < ranks; ++r)
            for (int i : s.indices(b, r)) {
              REQUIRE((i >= 0 && i < n));
              ++seen[i];
              ++in_batch;
            }
          CHECK(in_batch == s.global_size(b));
          total += in_batch;
        }
        CHECK(total == n);
        CHECK(std::count(seen.begin(), seen.end(), 1) == n);
      }
    }
  }
}

TEST_CASE("ShardedBatches: the same seed and epoch give the same order", "[nn][batches]") {
  ShardedBatches a(100, 3, 7, 42), b(100, 3, 7, 42);
  const auto epoch0 = epoch_batches(a);
  CHECK(epoch_batches(b) == epoch0);
  a.set_epoch(1);
  b.set_epoch(1);
  CHECK(epoch_batches(a) == epoch_batches(b));
  CHECK(epoch_batches(a) != epoch0);  // a new epoch reshuffles
  a.set_epoch(0);
  CHECK(epoch_batches(a) == epoch0);  // and an epoch can be drawn again
  CHECK(a.epoch() == 0);
  CHECK(epoch_batches(ShardedBatches(100, 3, 7, 43)) != epoch0);
}

TEST_CASE("ShardedBatches: global batches do not depend on the rank count", "[nn][batches]") {
  // Global batch 12 = 1 x 12 = 2 x 6 = 3 x 4 = 4 x 3 = 6 x 2; 50 samples leave a last batch of 2.
  for (std::uint64_t epoch : {0u, 5u}) {
    ShardedBatches one(50, 1, 12, 9);
    one.set_epoch(epoch);
    const auto expected = epoch_batches(one);
    REQUIRE(expected.size() == 5);
    CHECK(expected.back().size() == 2);
    for (const auto& [ranks, per_rank] : std::vector<std::pair<int, int>>{{2, 6}, {3, 4}, {4, 3}, {6, 2}}) {
      INFO(ranks << " ranks x " << per_rank << ", epoch " << epoch);
      ShardedBatches s(50, ranks, per_rank, 9);
      s.set_epoch(epoch);
      CHECK(epoch_batches(s) == expected);
    }
  }
}

TEST_CASE("ShardedBatches: full batches give each rank its contiguous shard; the last is spread evenly",
          "[nn][batches]") {
  ShardedBatches s(23, 4, 3, 1);  // global batch 12: one full batch, then 11 samples
  REQUIRE(s.batches() == 2);
  CHECK(s.global_size(0) == 12);
  CHECK(s.global_size(1) == 11);
  const std::vector<int> full = concatenated(s, 0);
  for (int r = 0; r < 4; ++r)
    CHECK(s.indices(0, r) == std::vector<int>(full.begin() + 3 * r, full.begin() + 3 * (r + 1)));
  const std::vector<int> sizes{3, 3, 3, 2};  // 11 = 4 * 2 + 3: the first three ranks read one more
  for (int r = 0; r < 4; ++r) CHECK(s.indices(1, r).size() == static_cast<std::size_t>(sizes[r]));

  ShardedBatches tiny(13, 4, 3, 1);  // a last batch of one sample: only rank 0 reads
  REQUIRE(tiny.batches() == 2);
  CHECK(tiny.global_size(1) == 1);
  CHECK(tiny.indices(1, 0).size() == 1);
  for (int r = 1; r < 4; ++r) CHECK(tiny.indices(1, r).empty());

  ShardedBatches exact(24, 4, 3, 1);  // divisible: no partial batch
  CHECK(exact.batches() == 2);
  CHECK(exact.global_size(1) == 12);
  CHECK(ShardedBatches(0, 2, 3, 1).batches() == 0);
}

TEST_CASE("ShardedBatches: bad sizes and out-of-range batch or rank throw", "[nn][batches]") {
  CHECK_THROWS_AS(ShardedBatches(-1, 1, 1, 0), kdist::InvalidArgument);
  CHECK_THROWS_AS(ShardedBatches(10, 0, 1, 0), kdist::InvalidArgument);
  CHECK_THROWS_WITH(ShardedBatches(10, 2, 0, 0), Catch::Contains("batch_per_rank 0"));
  ShardedBatches s(10, 2, 3, 0);
  CHECK_THROWS_WITH(s.indices(2, 0), Catch::Contains("batch 2 is not in [0, 2)"));
  CHECK_THROWS_WITH(s.indices(0, 2), Catch::Contains("rank 2 is not in [0, 2)"));
  CHECK_THROWS_AS(s.global_size(-1), kdist::InvalidArgument);
}
