// Language-model data (data/token_windows.h, data.kind tokens) and sampling (train/sample.h):
// windows of T + 1 tokens, batches as a pure function of (seed, step), the split by position,
// several shards as one stream, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "app/config.h"
#include "app/registry.h"
#include "core/rng.h"
#include "data/token_shards.h"
#include "data/token_windows.h"
#include "nn/gpt.h"
#include "ops/elementwise/elementwise.h"
#include "tests/expect_error.h"
#include "tests/temp_dir.h"
#include "train/errors.h"
#include "train/sample.h"

using namespace mt;

namespace {

data::TokenStream counting(int64_t n, int64_t vocab = 1000) {
  data::TokenStream s;
  s.vocab_size = vocab;
  s.source = "counting";
  for (int64_t i = 0; i < n; ++i) s.tokens.push_back(int32_t(i % vocab));
  return s;
}

TEST(TokenWindows, TargetsAreTheNextTokens) {
  data::TokenStream s = counting(100);
  data::TokenWindows w(s, 10, 50, 8, "train");
  EXPECT_EQ(w.windows(), 32);  // starts 10 .. 41: the last window ends at token 49
  auto [x, y] = w.gather({0, 31}, kCPU);
  ASSERT_EQ(x.shape(), (Shape{2, 8}));
  std::vector<double> xv = x.to_vector(), yv = y.to_vector();
  for (int64_t j = 0; j < 8; ++j) {
    EXPECT_EQ(xv[size_t(j)], 10 + j);
    EXPECT_EQ(yv[size_t(j)], 11 + j);
    EXPECT_EQ(xv[size_t(8 + j)], 41 + j);
    EXPECT_EQ(yv[size_t(8 + j)], 42 + j);
  }
  test::expect_error([&] { w.gather({32}, kCPU); }, {"start 32"});
}

TEST(TokenWindows, StepBatchesArePureFunctionsOfSeedAndStep) {
  auto a = data::step_window_starts(1000, 16, 7, 3);
  EXPECT_EQ(a, data::step_window_starts(1000, 16, 7, 3));
  EXPECT_NE(a, data::step_window_starts(1000, 16, 7, 4));
  EXPECT_NE(a, data::step_window_starts(1000, 16, 8, 3));
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 200; ++step)
    for (int64_t s : data::step_window_starts(50, 8, 1, step)) {
      ASSERT_TRUE(s >= 0 && s < 50);
      seen.insert(s);
    }
  EXPECT_EQ(seen.size(), 50u);  // every window is drawn sooner or later
}

TEST(TokenWindows, ValidationSplitIsHeldOutByPosition) {
  EXPECT_EQ(data::validation_begin(1000, 0.1), 900);
  data::TokenStream s = counting(1000);
  data::TokenWindows val(s, data::validation_begin(1000, 0.1), 1000, 16, "validation");
  std::vector<int64_t> starts = val.evenly_spaced(5);
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 20, 41, 62, 83}));
  auto [x, y] = val.gather(starts, kCPU);
  for (double v : x.to_vector()) EXPECT_GE(v, 900);  // no validation window reaches into training
  EXPECT_EQ(val.evenly_spaced(1000).size(), 84u);
}

TEST(TokenWindows, BadInput) {
  data::TokenStream s = counting(10);
  test::expect_error([&] { data::TokenWindows(s, 0, 10, 10, "train"); },
                     {"train", "counting", "10 tokens", "T + 1 = 11"});
}

// data.path of `data.kind: tokens` may be a glob pattern, as llm.c's -i is: the matching shards,
// in name order (not the order they were written in), are one stream: the batches and held-out
// windows of one shard that holds them all, joined.
TEST(TokenData, AGlobPatternOfShardsIsOneStreamInNameOrder) {
  test::TempDir t;
  std::vector<std::vector<uint16_t>> parts(3);
  std::vector<uint16_t> joined;
  for (size_t k = 0; k < parts.size(); ++k) {
    for (int i = 0; i < 300 + 50 * int(k); ++i)
      parts[k].push_back(uint16_t((37 * i + 11 * k) % 256));
    joined.insert(joined.end(), parts[k].begin(), parts[k].end());
  }
  for (size_t k : {2, 0, 1})
    write_token_shard(t / ("part_" + std::to_string(k) + ".bin"), parts[k]);
  write_token_shard(t / "other.bin", std::vector<uint16_t>{1, 2, 3});  // does not match
  write_token_shard(t / "joined.bin", joined);
  auto source = [&](const std::string& path) {
    const Config c = load_config("", {"model.kind=gpt", "model.block_size=16",
                                      "model.vocab_size=256", "data.kind=tokens",
                                      "data.path=" + path, "optim.batch_size=6", "device=cpu"});
    return app::data_kind("tokens").source(c);
  };
  const auto globbed = source(t / "part_*.bin"), one = source(t / "joined.bin");
  EXPECT_NE(globbed->describe()[0].find("part_0.bin … " + (t / "part_2.bin") + " (3 shards)"),
            std::string::npos) << globbed->describe()[0];
  for (int64_t step : {0, 1, 7}) {
    const std::vector<data::Batch> a = globbed->step_batches(step, kCPU),
                                   b = one->step_batches(step, kCPU);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].x.to_vector(), b[i].x.to_vector()) << "step " << step;
      EXPECT_EQ(a[i].y.to_vector(), b[i].y.to_vector()) << "step " << step;
    }
  }
  auto held_out = [](const data::Source& s) {
    std::vector<double> x;
    s.for_each_held_out(data::HeldOut::validation, 8, kCPU, [&](const data::Batch& b) {
      for (double v : b.x.to_vector()) x.push_back(v);
    });
    return x;
  };
  EXPECT_EQ(held_out(*globbed), held_out(*one));
  EXPECT_FALSE(held_out(*one).empty());
  test::expect_error([&] { source(t / "none_*.bin"); },
                     {"data.path", "no file matches the pattern '" + (t / "none_*.bin") + "'"});
}

TEST(Sample, SameSeedSameTokens) {
  manual_seed(0);
  nn::GPT model({.n_layer = 1, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 20});
  train::SampleOptions o{.tokens = 30, .temperature = 1.0, .top_k = 5, .seed = 11};
  auto a = train::sample(model, {1, 2, 3}, 20, 8, o, kCPU);  // longer than block_size: cropped
  EXPECT_EQ(a.size(), 30u);
  EXPECT_EQ(a, train::sample(model, {1, 2, 3}, 20, 8, o, kCPU));
  o.seed = 12;
  EXPECT_NE(a, train::sample(model, {1, 2, 3}, 20, 8, o, kCPU));
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 20);
  // top_k = 1 is greedy: the argmax of the logits every time, whatever the seed.
  o.top_k = 1;
  auto g1 = train::sample(model, {1}, 20, 8, o, kCPU);
  o.seed = 99;
  EXPECT_EQ(g1, train::sample(model, {1}, 20, 8, o, kCPU));
  // So is a tiny temperature: the largest logit is taken off before the division, which would
  // overflow on its own.
  o.top_k = 0;
  o.temperature = 1e-320;
  EXPECT_EQ(g1, train::sample(model, {1}, 20, 8, o, kCPU));
  EXPECT_TRUE(model.is_training());  // the mode is restored
}

TEST(Sample, BadOptions) {
  manual_seed(0);
  nn::GPT model({.n_layer = 1, .n_head = 1, .n_embd = 8, .block_size = 4, .vocab_size = 10});
  auto run = [&](std::vector<int32_t> prompt, train::SampleOptions o) {
    return [&model, prompt, o] { train::sample(model, prompt, 10, 4, o, kCPU); };
  };
  test::expect_error(run({}, {}), {"prompt is empty"});
  test::expect_error(run({1}, {.temperature = 0}), {"temperature", "positive", "0"});
  test::expect_error(run({1}, {.temperature = -1}), {"temperature"});
  test::expect_error(run({1}, {.top_k = 11}), {"top_k", "[0, 10]", "11"});
  test::expect_error(run({10}, {}), {"prompt token 10", "[0, 10)"});
  // A model whose logits are not finite has no distribution: an error, not the last id drawn.
  for (const auto& [name, p] : model.named_parameters())
    if (name == "transformer.ln_f.weight") p.detach().fill_(std::nan(""));
  test::expect_error(run({1}, {}), {"logits at token 0 after the prompt are not finite"});
  EXPECT_THROW((run({1}, {})()), train::NonFiniteError);  // `train sample` exits 3 on it
  EXPECT_TRUE(model.is_training());  // restored on the error's way out too
}

// A model whose logits turn NaN at its third call: the first two tokens are drawn.
struct NanOnThirdCall : nn::Module {
  std::shared_ptr<nn::GPT> gpt = register_module(
      "gpt", nn::GPT({.n_layer = 1, .n_head = 1, .n_embd = 8, .block_size = 4, .vocab_size = 10}));
  int calls = 0;
  Tensor forward(const Tensor& x) override {
    Tensor y = (*gpt)(x);
    return ++calls == 3 ? scale(y, std::nan("")) : y;
  }
};

// on_token sees every token as it is drawn, in order (what `train sample` prints as it goes),
// and a model that goes bad midway has had its earlier tokens seen before the error.
TEST(Sample, OnTokenSeesEachTokenAsItIsDrawn) {
  manual_seed(0);
  NanOnThirdCall model;
  std::vector<int32_t> seen;
  train::SampleOptions o{.tokens = 2, .seed = 3, .on_token = [&](int32_t t) { seen.push_back(t); }};
  const auto two = train::sample(model, {1}, 10, 4, o, kCPU);
  EXPECT_EQ(seen, two);
  EXPECT_EQ(two.size(), 2u);
  seen.clear();
  model.calls = 0;
  o.tokens = 5;
  test::expect_error([&] { train::sample(model, {1}, 10, 4, o, kCPU); },
                     {"logits at token 2 after the prompt are not finite"});
  EXPECT_EQ(seen, two) << "the tokens before the bad logits were handed on as they were drawn";
}

}  // namespace
