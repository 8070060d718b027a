// Data parallelism: the sharded loader. With N ranks, each takes a contiguous shard of the
// global batch that a single-rank loader would form, so together they see exactly its rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "tests/expect_error.h"
#include "train/data.h"

using namespace mt;

namespace {

constexpr int64_t B = 13;  // over 2 ranks: shards of 7 and 6; over 3: 5, 4 and 4

std::vector<int64_t> all_rows(int64_t n) {
  std::vector<int64_t> v(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}


}  // namespace

// ---- the sharded loader -------------------------------------------------------------------

namespace {
// Row i's single feature is i, so a batch's x names its rows.
data::Dataset numbered(int64_t n) {
  data::Dataset d;
  d.size = n;
  d.dim = 1;
  d.classes = 2;
  for (int64_t i = 0; i < n; ++i) {
    d.features.push_back(float(i));
    d.labels.push_back(i % 2);
  }
  return d;
}
}  // namespace

TEST(LoaderShard, ShardsTileTheGlobalBatchInOrder) {
  const data::Dataset d = numbered(40);  // 3 steps of 13 per epoch: step 3 is a new epoch
  data::Loader single(d, all_rows(d.size), B, 1, true, 9);
  for (int world = 1; world <= 3; ++world)
    for (int64_t k : {1, 2}) {
      std::vector<std::unique_ptr<data::Loader>> ranks;
      int64_t total = 0, smallest = B, largest = 0;
      for (int r = 0; r < world; ++r) {
        ranks.push_back(std::make_unique<data::Loader>(d, all_rows(d.size), B, k, true, 9, r, world));
        total += ranks.back()->shard_size();
        smallest = std::min(smallest, ranks.back()->shard_size());
        largest = std::max(largest, ranks.back()->shard_size());
      }
      EXPECT_EQ(total, B);
      EXPECT_LE(largest - smallest, 1);
      for (int64_t step = 0; step < 5; ++step) {
        const std::vector<double> want = single.step_batches(step, kCPU)[0].x.to_vector();
        std::vector<double> got;
        for (const auto& rank : ranks) {
          int64_t rows = 0;
          for (const auto& mb : rank->step_batches(step, kCPU)) {
            const std::vector<double> v = mb.x.to_vector();
            got.insert(got.end(), v.begin(), v.end());
            rows += mb.x.size(0);
          }
          EXPECT_EQ(rows, rank->shard_size());
        }
        // Equal and in the same order: the shards are disjoint and cover the batch.
        EXPECT_EQ(got, want) << "world " << world << ", k = " << k << ", step " << step;
      }
    }
}

TEST(LoaderShard, BadRankOrWorldIsAClearError) {
  const data::Dataset d = numbered(40);
  auto make = [&](int64_t batch, int64_t k, int rank, int world) {
    data::Loader l(d, all_rows(d.size), batch, k, true, 9, rank, world);
  };
  test::expect_error([&] { make(13, 1, 0, 0); }, {"rank 0", "world of 0"});
  test::expect_error([&] { make(13, 1, 3, 3); }, {"rank 3", "world of 3"});
  test::expect_error([&] { make(13, 1, -1, 2); }, {"rank -1"});
  test::expect_error([&] { make(13, 5, 0, 3); },
                     {"batch_size 13", "world 3", "shards of 4 or 5", "5 microbatches"});
  test::expect_error([&] { make(2, 1, 0, 3); }, {"batch_size 2", "world 3", "shards of 0"});
  test::expect_error([&] { make(13, 0, 0, 1); }, {"microbatches must be at least 1"});
  make(12, 4, 2, 3);  // shards of exactly k samples are fine
}
