// The MLP's guarantees, for a tiny GPT trained through the `train` program's trainer (two runs
// bitwise and a resumed run bitwise are GptTraining.TwoRunsAndAResumedRunAreBitwiseEqual):
//   - microbatches = the full batch, and CPU data-parallel ranks (threads) = one rank, in f64;
//   - ZeRO-1 = the plain optimizer (with keep_best's saves at validation passes, collectives too);
//   - forensics: an activation that overflows is named by its module's path;
//   - `train eval` on a GPT checkpoint reproduces the run's validation loss, `train predict` refuses
//     a GPT and points to `train sample`;
//   - checkpoint.keep_best keeps the lowest validation loss's step as best.safetensors;
//   - perplexity beside loss and bits per byte;
//   - on a GPU: a CUDA graph run equals the eager run bit for bit.
// Dropout is 0 where runs are compared across microbatch or rank layouts: a mask is keyed by the
// microbatch and the element's place in it, so another layout draws other masks. The exception:
// N ranks of one microbatch draw what one rank of N microbatches draws (microbatches are
// numbered over all ranks), and train like it with dropout on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "app/config.h"
#include "app/config_trainer.h"
#include "app/inference.h"
#include "core/device.h"
#include "core/safetensors.h"
#include "tests/log_capture.h"
#include "tests/max_rel_diff.h"
#include "tests/run_train.h"
#include "tests/temp_dir.h"
#include "train/checkpoint.h"
#include "train/metrics.h"

using namespace mt;
using mt::test::TempDir;
using mt::test::max_rel_diff;
namespace fs = std::filesystem;

namespace {

// A 2-layer GPT of width 16 on 40 lines of text, bytes as tokens: 10 steps of 6 windows of 16.
Config gpt_config(const TempDir& dir, const std::vector<std::string>& sets = {}) {
  const fs::path text = dir.path / "text.txt";
  if (!fs::exists(text)) {
    std::ofstream out(text);
    for (int i = 0; i < 40; ++i) out << "To be, or not to be, that is the question " << i << ".\n";
  }
  return parse_config(
      "model: {kind: gpt, n_layer: 2, n_head: 2, n_embd: 16, block_size: 16, vocab_size: 256}\n"
      "data: {kind: text, path: " + text.string() + ", val_fraction: 0.2, eval_windows: 8}\n"
      "optim: {lr: 0.01, steps: 10, warmup_steps: 2, batch_size: 6, microbatches: 1}\n"
      "eval: {every: 5, batch_size: 4}\n"
      "checkpoint: {dir: " + (dir.path / "ckpt").string() + ", every: 5, keep_last: 2}\n"
      "logging: {every: 5}\n"
      "device: cpu\n",
      "tiny-gpt", sets);
}

std::vector<std::vector<double>> params_of(train::Trainer& t) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : t.model().parameters()) out.push_back(p.to_vector());
  return out;
}

double max_diff(train::Trainer& a, train::Trainer& b) { return max_rel_diff(params_of(a), params_of(b)); }

TEST(GptGuarantees, MicrobatchesTrainLikeTheFullBatchInF64) {
  TempDir d1, d3;
  app::ConfigTrainer one(gpt_config(d1, {"precision.compute_dtype=f64"}), kCPU);
  one.run();
  Config cfg = gpt_config(d3, {"precision.compute_dtype=f64"});
  cfg.optim.microbatches = 3;
  app::ConfigTrainer three(cfg, kCPU);
  three.run();
  // The same gradients up to the order of the sums: 10 AdamW steps later, rounding apart.
  EXPECT_LT(max_diff(one, three), 1e-10);
  EXPECT_GT(max_diff(one, three), 0) << "different summation orders should leave some rounding";
}

TEST(GptGuarantees, CpuRanksAndZero1TrainLikeOneRankInF64) {
  TempDir d0;
  Config single_cfg = gpt_config(d0, {"precision.compute_dtype=f64"});
  single_cfg.optim.microbatches = 2;
  app::ConfigTrainer single(single_cfg, kCPU);
  const train::RunSummary ref = single.run();
  for (int n : {2, 3}) {
    for (bool zero : {false, true}) {
      SCOPED_TRACE(testing::Message() << n << " ranks" << (zero ? ", ZeRO-1" : ""));
      TempDir d;
      Config cfg = single_cfg;
      cfg.checkpoint.dir = (d.path / "ckpt").string();
      cfg.optim.microbatches = 1;  // 6 windows over 3 ranks leave 2 each
      cfg.optim.shard_state = zero;
      cfg.checkpoint.keep_best = true;  // a save at a validation pass: with ZeRO-1, a collective
      const train::LocalRun run = app::run_local_ranks(cfg, n);
      for (const auto& t : run.ranks) {
        EXPECT_LT(max_diff(*t, single), 1e-10);
        EXPECT_EQ(params_of(*t), params_of(*run.ranks[0]));  // the replicas stay equal
      }
      EXPECT_EQ(run.ranks[0]->sharded_optimizer() != nullptr, zero);
      EXPECT_NEAR(run.summary.val_loss, ref.val_loss, 1e-10 * ref.val_loss);
      EXPECT_TRUE(fs::exists(d.path / "ckpt/best.safetensors"));
    }
  }
}

// Rank r's microbatch is microbatch r of the step: with dropout on, N ranks of one microbatch
// train like one rank of N microbatches. (Ranks that numbered their own microbatches from 0 all
// drew one mask, unlike the single rank.)
TEST(GptGuarantees, RanksWithDropoutDrawTheMasksOfOneRankWithAsManyMicrobatches) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(testing::Message() << n << " ranks");
    TempDir d0, d;
    Config single_cfg = gpt_config(d0, {"precision.compute_dtype=f64", "model.dropout=0.3"});
    single_cfg.optim.microbatches = n;
    app::ConfigTrainer single(single_cfg, kCPU);
    single.run();
    Config cfg = single_cfg;
    cfg.checkpoint.dir = (d.path / "ckpt").string();
    cfg.optim.microbatches = 1;
    const train::LocalRun run = app::run_local_ranks(cfg, n);
    for (const auto& t : run.ranks) EXPECT_LT(max_diff(*t, single), 1e-10);
  }
}

// A huge but finite gain in block 1's second LayerNorm: its output (normalized values, some above
// 1 in size, times 3e38) overflows to inf, and the run stops naming that module by its path,
// before anything is saved.
TEST(GptGuarantees, ForensicsNamesTheModuleWhoseOutputOverflows) {
  TempDir d;
  Config cfg = gpt_config(d, {"logging.every=1"});
  app::ConfigTrainer t(cfg, kCPU);
  t.set_step_callback([](int64_t step, train::Trainer& tr) {
    if (step != 3) return;
    for (const auto& [name, p] : tr.model().named_parameters())
      if (name == "transformer.h.1.ln_2.weight") p.detach().fill_(3e38);
  });
  try {
    t.run();
    ADD_FAILURE() << "the run finished without a NonFiniteError";
  } catch (const train::NonFiniteError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("step 4: non-finite activation: the output of transformer.h.1.ln_2 LayerNorm"),
              std::string::npos) << msg;
  }
  EXPECT_TRUE(train::list_checkpoints((d.path / "ckpt").string()).empty());
}

// model.bias: false (nanoGPT's default): no bias in any Linear or LayerNorm, and it trains.
TEST(GptGuarantees, AModelWithoutBiasesTrains) {
  TempDir d;
  app::ConfigTrainer t(gpt_config(d, {"model.bias=false"}), kCPU);
  std::vector<std::vector<double>> before;
  for (const auto& [name, p] : t.model().named_parameters()) {
    EXPECT_FALSE(name.ends_with(".bias")) << name;
    before.push_back(p.to_vector());
  }
  const train::RunSummary s = t.run();
  EXPECT_LT(s.val_loss, std::log(256.0));
  EXPECT_NE(params_of(t), before);
}

// Perplexity is exp of the mean loss: of the logged batch's loss, and of the validation loss.
TEST(GptGuarantees, PerplexityIsLoggedBesideLossAndBitsPerByte) {
  TempDir d;
  app::ConfigTrainer t(gpt_config(d), kCPU);
  const train::RunSummary s = t.run();
  ASSERT_TRUE(s.val_metrics.contains("ppl"));
  EXPECT_NEAR(s.val_metrics.at("ppl"), std::exp(s.val_loss), 1e-12 * std::exp(s.val_loss));
  EXPECT_NEAR(s.val_metrics.at("bpb"), s.val_loss / std::log(2.0), 1e-9);
  int64_t batches = 0, vals = 0;
  std::ifstream in(d.path / "ckpt/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto r = nlohmann::json::parse(line);
    if (r.contains("batch_loss")) {
      ++batches;
      EXPECT_NEAR(r["ppl"].get<double>(), std::exp(r["batch_loss"].get<double>()), 1e-9) << line;
    }
    if (r.contains("val_loss")) {
      ++vals;
      EXPECT_NEAR(r["val_ppl"].get<double>(), std::exp(r["val_loss"].get<double>()), 1e-9) << line;
    }
  }
  EXPECT_EQ(batches, 2);
  EXPECT_EQ(vals, 2);
}

// `train eval` rebuilds the run's data split and task from the checkpoint: the run's last
// validation loss, to the bit (the same windows, batches and arithmetic); --split test is refused
// (token data has none); `train predict` points to `train sample`.
TEST(GptGuarantees, TrainEvalReproducesTheValidationLossAndPredictRefuses) {
  TempDir d;
  app::ConfigTrainer t(gpt_config(d), kCPU);
  const train::RunSummary s = t.run();
  const std::string ckpt = (d.path / "ckpt").string();
  std::string out;
  ASSERT_EQ(test::run_train("eval --checkpoint " + ckpt, &out, false), 0) << out;
  EXPECT_EQ(out.rfind("val: loss " + train::format_value(s.val_loss) + " | bpb ", 0), 0u) << out;
  EXPECT_NE(out.find("| ppl "), std::string::npos) << out;
  EXPECT_NE(out.find("(8 windows)"), std::string::npos) << out;
  // The exact value, through the library call the command makes.
  EXPECT_EQ(app::evaluate_checkpoint(ckpt).loss, s.val_loss);
  EXPECT_EQ(test::run_train("eval --checkpoint " + ckpt + " --split test", &out), 2);
  EXPECT_NE(out.find("has no test set"), std::string::npos) << out;
  EXPECT_EQ(test::run_train("predict --checkpoint " + ckpt + " --input x.csv --output y.csv", &out), 2);
  EXPECT_NE(out.find("is a language model"), std::string::npos) << out;
  EXPECT_NE(out.find("train sample --checkpoint"), std::string::npos) << out;
}

// keep_best: best.safetensors is the step of the lowest validation loss, it survives keep_last's
// pruning, `--resume DIR` still takes the newest step (and keeps the best unless beaten), and
// `--resume best.safetensors` continues from the best. The held-out text is another line than the
// training text, and the learning rate high: the validation loss falls for 3 steps, then rises as
// the model learns its one training line, so the best is not the last.
TEST(GptGuarantees, KeepBestKeepsTheLowestValidationLoss) {
  TempDir d;
  const fs::path text = d.path / "two-texts.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 36; ++i) out << "To be, or not to be, that is the question " << i << ".\n";
    for (int i = 0; i < 6; ++i) out << "All the world's a stage, and all the men and women merely players.\n";
  }
  Config cfg = gpt_config(d, {"checkpoint.every=2", "checkpoint.keep_last=1", "checkpoint.keep_best=true",
                              "eval.every=1", "optim.lr=0.05", "optim.steps=16", "data.path=" + text.string()});
  app::ConfigTrainer t(cfg, kCPU);
  t.run();
  double best = INFINITY;
  int64_t best_step = 0, last_step = 0;
  std::ifstream in(d.path / "ckpt/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto r = nlohmann::json::parse(line);
    if (!r.contains("val_loss")) continue;
    last_step = r["step"].get<int64_t>();
    if (r["val_loss"].get<double>() < best) best = r["val_loss"], best_step = last_step;
  }
  ASSERT_EQ(last_step, 16);
  ASSERT_LT(best_step, last_step) << "the validation loss never rose: the test shows nothing";
  const std::string best_file = (d.path / "ckpt/best.safetensors").string();
  const auto meta = read_safetensors_metadata(best_file);
  EXPECT_EQ(meta.at("step"), std::to_string(best_step));
  EXPECT_EQ(std::stod(meta.at("val_loss")), best);
  EXPECT_EQ(train::list_checkpoints((d.path / "ckpt").string()).size(), 1u);  // keep_last
  EXPECT_EQ(train::load_checkpoint(best_file).step, best_step);
  // eval on the best file gives its validation loss back.
  EXPECT_EQ(app::evaluate_checkpoint(best_file).loss, best);

  // A resumed run from the directory continues from the newest step...
  Config more = cfg;
  more.optim.steps = 18;
  app::ConfigTrainer resumed(more, kCPU);
  resumed.resume((d.path / "ckpt").string());
  EXPECT_EQ(resumed.step(), 16);
  resumed.run();
  // ...and keeps the best unless it beats it (its validation losses at 17 and 18 only replace a
  // higher one).
  double after = INFINITY;
  std::ifstream in2(d.path / "ckpt/metrics.jsonl");
  for (std::string line; std::getline(in2, line);)
    if (const auto r = nlohmann::json::parse(line); r.contains("val_loss")) after = std::min(after, r["val_loss"].get<double>());
  EXPECT_EQ(std::stod(read_safetensors_metadata(best_file).at("val_loss")), after);
  // From the best file, the run goes on from the best step.
  TempDir d2;
  Config from_best = cfg;
  from_best.checkpoint.dir = (d2.path / "ckpt").string();
  app::ConfigTrainer b(from_best, kCPU);
  b.resume(best_file);
  EXPECT_EQ(b.step(), best_step);
}

// scripts/load_checkpoint_torch.py loads the checkpoint into a PyTorch GPT (nanoGPT's module
// names) and computes the validation loss on the same windows: `train eval`'s value to within
// f32 rounding (both sum the same B·T per-token losses in f32, in other orders; |Δ| ≤ 1e-5 · loss;
// measured 6e-8 relative with PyTorch 1.13 on the CPU). Skipped where no python with torch and
// yaml is found (MT_PYTHON, else python3, else /usr/bin/python3).
TEST(GptTorch, CheckpointLoadsIntoPyTorchWithTheSameValLoss) {
  std::string python;
  const char* env = std::getenv("MT_PYTHON");
  for (std::string p : {std::string(env ? env : ""), std::string("python3"), std::string("/usr/bin/python3")})
    if (python.empty() && !p.empty() && test::run_shell(p + " -c 'import torch, yaml' 2>/dev/null", nullptr) == 0)
      python = p;
  if (python.empty()) GTEST_SKIP() << "no python3 with torch and yaml (MT_PYTHON, python3, /usr/bin/python3)";
  TempDir d;
  for (const char* bias : {"true", "false"}) {
    SCOPED_TRACE(std::string("model.bias ") + bias);
    Config cfg = gpt_config(d, {std::string("model.bias=") + bias, "checkpoint.overwrite=true"});
    app::ConfigTrainer t(cfg, kCPU);
    t.run();
    const std::string ckpt = (d.path / "ckpt").string();
    const double minitrain = app::evaluate_checkpoint(ckpt).loss;
    std::string out;
    ASSERT_EQ(test::run_shell(python + " " MT_SOURCE_DIR "/scripts/load_checkpoint_torch.py " + ckpt + " 2>&1", &out), 0) << out;
    double torch_loss = NAN;
    int windows = 0;
    ASSERT_EQ(std::sscanf(out.c_str(), "val: loss %lf (%d windows)", &torch_loss, &windows), 2) << out;
    EXPECT_EQ(windows, 8);
    EXPECT_NEAR(torch_loss, minitrain, 1e-5 * minitrain) << out;
    std::printf("train eval %.7f, PyTorch %.7f: relative difference %.2g\n", minitrain, torch_loss,
                std::abs(torch_loss - minitrain) / minitrain);
  }
}

// The GPT's step as one CUDA graph replays what the eager step computes, bit for bit (dropout 0
// here; with dropout, each replay draws its own step's masks:
// CudaGptTraining.AGraphedRunWithDropoutIsTheEagerRunBitForBit).
TEST(CudaGptGraph, GraphRunEqualsTheEagerRunBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  for (const char* dt : {"f32", "bf16"}) {
    SCOPED_TRACE(dt);
    TempDir d1, d2;
    const std::vector<std::string> extra = {std::string("precision.compute_dtype=") + dt,
                                            "optim.microbatches=2", "logging.every=7"};
    Config cfg = gpt_config(d1, extra);
    cfg.device = "cuda";
    app::ConfigTrainer eager(cfg, cuda_device(0));
    const train::RunSummary a = eager.run();
    cfg = gpt_config(d2, extra);
    cfg.device = "cuda";
    cfg.cuda_graph = true;
    LogCapture log;
    app::ConfigTrainer graph(cfg, cuda_device(0));
    const train::RunSummary b = graph.run();
    EXPECT_TRUE(log.contains("cuda_graph: step 2 captured")) << "the step was not captured";
    EXPECT_EQ(params_of(eager), params_of(graph));
    EXPECT_EQ(a.train_loss, b.train_loss);
    EXPECT_EQ(a.val_loss, b.val_loss);
  }
}

}  // namespace
