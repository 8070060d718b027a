// A tiny GPT trained through the `train` program's trainer (model.kind gpt, data.kind text): two
// runs bitwise equal, a stopped and resumed run bitwise equal to an uninterrupted one (dropout on:
// its masks follow the step), validation loss and bits per byte reported, and the config's bad
// values named.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "app/config.h"
#include "app/config_trainer.h"
#include "app/registry.h"
#include "tests/run_train.h"
#include "tests/expect_error.h"
#include "tests/log_capture.h"
#include "tests/temp_dir.h"

using namespace mt;
using mt::test::TempDir;

namespace {

Config tiny_gpt_config(const TempDir& dir) {
  const auto text = dir.path / "text.txt";
  std::ofstream out(text);
  for (int i = 0; i < 40; ++i) out << "To be, or not to be, that is the question " << i << ".\n";
  out.close();
  return parse_config(
      "model: {kind: gpt, n_layer: 2, n_head: 2, n_embd: 16, block_size: 16, vocab_size: 256, "
      "dropout: 0.1}\n"
      "data: {kind: text, path: " + text.string() + ", val_fraction: 0.2, eval_windows: 8}\n"
      "optim: {lr: 0.01, steps: 8, warmup_steps: 2, batch_size: 6, microbatches: 2}\n"
      "eval: {every: 4, batch_size: 4}\n"
      "checkpoint: {dir: " + (dir.path / "ckpt").string() + ", every: 4, keep_last: 2}\n"
      "logging: {every: 2}\n",
      "tiny-gpt");
}

std::vector<std::vector<double>> params_of(train::Trainer& t) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : t.model().parameters()) out.push_back(p.to_vector());
  return out;
}

TEST(GptTraining, TwoRunsAndAResumedRunAreBitwiseEqual) {
  TempDir a, b, c;
  app::ConfigTrainer first(tiny_gpt_config(a), kCPU);
  const train::RunSummary s = first.run();
  const auto expected = params_of(first);
  app::ConfigTrainer second(tiny_gpt_config(b), kCPU);
  second.run();
  EXPECT_EQ(params_of(second), expected);

  app::ConfigTrainer resumed(tiny_gpt_config(c), kCPU);
  resumed.resume((a.path / "ckpt/step-000004.safetensors").string());
  EXPECT_EQ(resumed.step(), 4);
  resumed.run();
  EXPECT_EQ(params_of(resumed), expected);

  // Validation on the held-out tail: a loss below the uniform ln 256 = 5.55 after 8 steps, and
  // bits per byte = loss / ln 2 for bytes.
  EXPECT_GT(s.val_loss, 0);
  EXPECT_LT(s.val_loss, 5.5);
  ASSERT_TRUE(s.val_metrics.contains("bpb"));
  EXPECT_NEAR(s.val_metrics.at("bpb"), s.val_loss / std::log(2.0), 1e-9);
}

// With cuda_graph the quiet steps are replays of one captured step; the dropout masks still
// follow the step (the replays read its part of the key from device memory, advanced by a kernel
// of the graph), so the run ends bit for bit where the eager run ends. A graph that replayed the
// captured step's masks would drift from the eager run at the first replay after the capture.
TEST(CudaGptTraining, AGraphedRunWithDropoutIsTheEagerRunBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  TempDir a, b;
  Config cfg = tiny_gpt_config(a);
  cfg.device = "cuda";
  app::ConfigTrainer eager(cfg, cuda_device(0));
  const train::RunSummary ea = eager.run();
  cfg = tiny_gpt_config(b);
  cfg.device = "cuda";
  cfg.cuda_graph = true;
  LogCapture log;
  app::ConfigTrainer graphed(cfg, cuda_device(0));
  const train::RunSummary gr = graphed.run();
  // Steps 1, 3, 5, 7 are logged (every 2): step 0 warms up, step 2 (the log's "step 3") is
  // captured and replayed, and steps 4 and 6 are replays.
  EXPECT_TRUE(log.contains("cuda_graph: step 3 captured")) << "the step was not captured";
  EXPECT_EQ(params_of(graphed), params_of(eager));
  EXPECT_EQ(gr.train_loss, ea.train_loss);
  EXPECT_EQ(gr.val_loss, ea.val_loss);
}

TEST(GptTraining, BadConfigsAreNamed) {
  TempDir d;
  const Config good = tiny_gpt_config(d);
  const std::string text = good.data.path;
  test::expect_error([&] { parse_config("model: {kind: gpt, block_size: 16}\ndata: {kind: text, path: " + text + ", block_size: 32}\n", "bad"); },
                     {"data.block_size", "larger than the model's block_size 16"});
  test::expect_error([&] { parse_config("model: {kind: gpt, n_embd: 30, n_head: 4}\ndata: {kind: text, path: " + text + "}\n", "bad"); },
                     {"model.n_embd", "divisible by model.n_head = 4"});
  test::expect_error([&] { parse_config("model: {kind: mlp}\ndata: {kind: text, path: " + text + "}\n", "bad"); },
                     {"data.kind", "model.kind gpt"});
  // A folder (or a device) is not "no such file": it is there.
  test::expect_error([&] { parse_config("model: {kind: gpt}\ndata: {kind: text, path: " + d.path.string() + "}\n", "bad"); },
                     {"data.path: is a directory (data.kind text reads a file)"});
  test::expect_error([&] { parse_config("model: {kind: gpt}\ndata: {kind: tokens, path: /dev/null}\n", "bad"); },
                     {"data.path: is not a regular file"});
  test::expect_error([&] { parse_config("model: {kind: gpt}\ndata: {kind: text, path: " + text + ".gone}\n", "bad"); },
                     {"data.path: no such file"});
  test::expect_error([&] {
    app::ConfigTrainer t(parse_config("model: {kind: gpt}\ndata: {kind: synthetic}\ncheckpoint: {dir: " +
                                          (d.path / "c").string() + "}\n", "bad"), kCPU);
  }, {"gpt trains on token data", "data.kind synthetic"});
  test::expect_error([&] { parse_config("model: {kind: gpt, dropout: 1.5}\ndata: {kind: text, path: " + text + "}\n", "bad"); },
                     {"model.dropout", "[0, 1)"});
  // A corpus shorter than T + 1 tokens for the held-out part: named when the trainer is built.
  const auto small = d.path / "small.txt";
  std::ofstream(small) << "short text";
  Config tiny = good;
  tiny.data.path = small.string();
  test::expect_error([&] { app::ConfigTrainer t(tiny, kCPU); }, {"small.txt", "fewer than T + 1 = 17"});
  // Token ids at or above the vocabulary: a byte tokenizer for a model of 100 ids.
  const Config narrow = parse_config("model: {kind: gpt, block_size: 16, vocab_size: 100}\n"
                                     "data: {kind: text, path: " + text + "}\n", "narrow");
  test::expect_error([&] { app::ConfigTrainer t(narrow, kCPU); }, {"model.vocab_size", "256 ids"});
}

// The shipped GPT configs parse, validate and print (`train --print-config`, run from the source
// folder as a user runs them), and say what their comments say.
TEST(GptConfigs, ShippedConfigsParseAndHoldTheirRecipes) {
  for (const char* name : {"shakespeare", "shakespeare-gpu", "gpt2-124m"}) {
    std::string out;
    EXPECT_EQ(test::run_shell(std::string("cd " MT_SOURCE_DIR " && " MT_BINARY_DIR "/train --config configs/") +
                                  name + ".yaml --print-config 2>&1", &out), 0) << name << ": " << out;
    EXPECT_NE(out.find("kind: \"gpt\""), std::string::npos) << out;
  }
  auto load = [](const std::string& name) {
    return load_config(MT_SOURCE_DIR "/configs/" + name + ".yaml",
                       {"data.path=" MT_SOURCE_DIR "/assets/tinyshakespeare.txt"});
  };
  // nanoGPT's shakespeare_char.
  const Config g = load("shakespeare-gpu");
  const Params& m = g.model.params;
  EXPECT_EQ(m.integer("n_layer"), 6);
  EXPECT_EQ(m.integer("n_head"), 6);
  EXPECT_EQ(m.integer("n_embd"), 384);
  EXPECT_EQ(m.integer("block_size"), 256);
  EXPECT_EQ(m.number("dropout"), 0.2);
  EXPECT_FALSE(g.model.bias);
  EXPECT_EQ(g.optim.batch_size, 64);
  EXPECT_EQ(g.optim.lr, 1e-3);
  EXPECT_EQ(g.optim.min_lr, 1e-4);
  EXPECT_EQ(g.optim.steps, 5000);
  EXPECT_EQ(g.optim.warmup_steps, 100);
  EXPECT_EQ(g.optim.betas, (std::array<double, 2>{0.9, 0.99}));
  EXPECT_EQ(g.optim.weight_decay, 0.1);
  EXPECT_EQ(g.optim.clip_norm, 1.0);
  EXPECT_EQ(g.eval.every, 250);
  EXPECT_EQ(g.data.params.integer("eval_windows"), 200 * 64);
  EXPECT_EQ(g.precision.compute_dtype, DType::bf16);
  EXPECT_TRUE(g.checkpoint.keep_best);
  EXPECT_FALSE(g.cuda_graph);  // dropout under a graph is refused (the masks are keyed on the host)
  // GPT-2 small.
  const Config s = load("gpt2-124m");
  EXPECT_EQ(s.model.params.integer("n_layer"), 12);
  EXPECT_EQ(s.model.params.integer("n_embd"), 768);
  EXPECT_EQ(s.model.params.integer("block_size"), 1024);
  EXPECT_EQ(s.model.params.integer("vocab_size"), 50257);
  EXPECT_EQ(s.data.params.string("tokenizer"), "gpt2");
  EXPECT_EQ(s.optim.betas, (std::array<double, 2>{0.9, 0.95}));
  EXPECT_TRUE(s.cuda_graph);
  EXPECT_EQ(s.precision.compute_dtype, DType::bf16);
  EXPECT_EQ(app::gpt_config(s).padded_vocab(), 50304);  // GPT-2's 50257 ids padded, as llm.c's
}

}  // namespace
