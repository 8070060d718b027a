// data::TokenSource (data/token_source.h): token windows as the trainer's data source.
#include <gtest/gtest.h>

#include <algorithm>

#include "data/token_source.h"
#include "tests/expect_error.h"

using namespace mt;

namespace {

data::TokenStream counting(int64_t n) {
  data::TokenStream s;
  s.vocab_size = 1000;
  s.source = "counting";
  for (int64_t i = 0; i < n; ++i) s.tokens.push_back(int32_t(i % 1000));
  return s;
}

// N ranks' shards of a step, side by side, are the one-rank batch; the held-out windows never
// reach into the training part.
TEST(TokenSource, RanksTogetherSeeTheOneRankBatch) {
  data::TokenSourceOptions o{.block_size = 8, .batch_size = 7, .microbatches = 2,
                             .val_fraction = 0.2, .eval_windows = 10, .seed = 3};
  data::TokenSource one(counting(500), "bytes", o);
  for (int64_t step : {0, 5}) {
    std::vector<double> whole;
    for (const data::Batch& b : one.step_batches(step, kCPU)) {
      auto v = b.x.to_vector();
      whole.insert(whole.end(), v.begin(), v.end());
    }
    EXPECT_EQ(whole.size(), 7u * 8u);
    std::vector<double> joined;
    for (int r = 0; r < 3; ++r) {
      data::TokenSource rank(counting(500), "bytes", o);
      rank.shard(r, 3);
      EXPECT_EQ(rank.shard_size(), r == 0 ? 3 : 2);
      for (const data::Batch& b : rank.step_batches(step, kCPU)) {
        auto v = b.x.to_vector();
        joined.insert(joined.end(), v.begin(), v.end());
      }
    }
    EXPECT_EQ(joined, whole) << "step " << step;
  }
  EXPECT_EQ(one.held_out_size(data::HeldOut::validation), 10);
  EXPECT_EQ(one.held_out_size(data::HeldOut::test), 0);
  int64_t seen = 0;
  one.for_each_held_out(data::HeldOut::validation, 4, kCPU, [&](const data::Batch& b) {
    for (double v : b.x.to_vector()) EXPECT_GE(v, 400);
    seen += b.x.size(0);
  });
  EXPECT_EQ(seen, 10);
  // Nor does any training window, its target included: tokens 400 .. 499 are held out.
  for (int64_t step = 0; step < 200; ++step)
    for (const data::Batch& b : one.step_batches(step, kCPU))
      for (double v : b.y.to_vector()) ASSERT_LT(v, 400) << "step " << step;
  data::TokenSource three(counting(500), "bytes", {.block_size = 8, .batch_size = 4, .microbatches = 2});
  test::expect_error([&] { three.shard(0, 3); }, {"batch_size 4", "3 ranks", "microbatches = 2"});
}

// eval_windows 0 is the held-out part tiled: windows T apart, each token a target once, as
// llm.c reads its validation split. It was every window, one a token apart: T times the work
// for the same targets (on a 100-million-token validation shard, 100 million windows).
TEST(TokenSource, ZeroEvalWindowsTileTheHeldOutPart) {
  // 500 tokens, the last 100 held out (tokens 400 .. 499): 92 windows of 8 + 1 tokens, of which
  // those at 0, 8, ..., 88 tile it, 12 of them; the targets 497 .. 499 fill no window.
  data::TokenSource source(counting(500), "bytes",
                           {.block_size = 8, .batch_size = 4, .val_fraction = 0.2,
                            .eval_windows = 0});
  EXPECT_EQ(source.held_out_size(data::HeldOut::validation), 12);
  std::vector<double> targets;
  source.for_each_held_out(data::HeldOut::validation, 5, kCPU, [&](const data::Batch& b) {
    const auto y = b.y.to_vector();
    targets.insert(targets.end(), y.begin(), y.end());
  });
  std::vector<double> expected;
  for (int t = 401; t <= 496; ++t) expected.push_back(t);
  EXPECT_EQ(targets, expected);
}

}  // namespace
