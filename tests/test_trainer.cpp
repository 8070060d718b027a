// The trainer on the CPU (and, where a GPU is present, its CUDA-graph mode): the loader, microbatches = one batch through whole training runs,
// bitwise resume, checkpoint corruption, the CLI's exit codes, and the default config's accuracy.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "app/config.h"
#include "app/config_trainer.h"
#include "core/autograd.h"
#include "data/data.h"
#include "optim/schedule.h"
#include "tests/log_capture.h"
#include "tests/max_rel_diff.h"
#include "tests/run_train.h"
#include "tests/temp_dir.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace mt;
using mt::test::run_train;
using mt::test::TempDir;
using mt::test::max_rel_diff;
namespace fs = std::filesystem;

namespace {

// A small, quick run: 24 steps of 48 samples.
Config small_config(const TempDir& dir, DType dt = DType::f32, int64_t k = 1) {
  std::vector<std::string> sets = {
      "model.input=12", "model.hidden=[16]", "model.classes=4", "data.samples=600",
      "optim.steps=24", "optim.batch_size=48", "optim.warmup_steps=4",
      "optim.microbatches=" + std::to_string(k), "eval.every=12", "logging.every=6",
      "checkpoint.every=12", "checkpoint.keep_last=5", "checkpoint.dir=" + (dir / "ckpt"),
      std::string("precision.compute_dtype=") + dtype_name(dt), "device=cpu"};
  return load_config("", sets);
}

std::vector<std::vector<double>> params_of(train::Trainer& t) {
  std::vector<std::vector<double>> out;
  for (auto& p : t.model().parameters()) out.push_back(p.to_vector());
  return out;
}

}  // namespace

TEST(Loader, SameSeedSameOrderAndUnevenLastMicrobatch) {
  data::Dataset d = data::make_synthetic(103, 5, 3, 0.5, 7);
  data::Split split = data::split_indices(d.size, 0.1, 7);
  EXPECT_EQ(split.val.size(), 10u);
  EXPECT_EQ(split.train.size(), 93u);
  data::Loader a(d, split.train, 10, 4, true, 3), b(d, split.train, 10, 4, true, 3);
  EXPECT_EQ(a.steps_per_epoch(), 9);
  for (int64_t step : {0, 5, 9, 20}) {
    auto ma = a.step_batches(step, kCPU), mb = b.step_batches(step, kCPU);
    ASSERT_EQ(ma.size(), 4u);
    std::vector<int64_t> sizes;
    for (size_t i = 0; i < ma.size(); ++i) {
      sizes.push_back(ma[i].x.size(0));
      EXPECT_EQ(ma[i].x.to_vector(), mb[i].x.to_vector());
      EXPECT_EQ(ma[i].y.to_vector(), mb[i].y.to_vector());
    }
    EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 2, 2}));  // the last ones are smaller
  }
  // A different seed or epoch gives another order.
  data::Loader c(d, split.train, 10, 4, true, 4);
  EXPECT_NE(a.step_batches(0, kCPU)[0].y.to_vector(), c.step_batches(0, kCPU)[0].y.to_vector());
  EXPECT_NE(a.step_batches(0, kCPU)[0].x.to_vector(), a.step_batches(9, kCPU)[0].x.to_vector());
  EXPECT_THROW(data::microbatch_sizes(3, 4), Error);
}

// The steps of one epoch take disjoint batches that together hold steps_per_epoch x batch_size
// different samples: the step number alone says where in the epoch a (resumed) run is.
TEST(Loader, TheStepsOfAnEpochTakeDisjointBatches) {
  data::Dataset d = data::make_synthetic(103, 5, 3, 0.5, 7);
  data::Split split = data::split_indices(d.size, 0.1, 7);
  for (bool shuffle : {false, true}) {
    data::Loader loader(d, split.train, 10, 2, shuffle, 3);
    std::set<std::vector<double>> seen;  // a sample's features identify it (continuous draws)
    for (int64_t step = 0; step < loader.steps_per_epoch(); ++step)
      for (const auto& mb : loader.step_batches(step, kCPU)) {
        const std::vector<double> x = mb.x.to_vector();
        for (size_t r = 0; r < x.size() / 5; ++r) seen.insert({x.begin() + long(5 * r), x.begin() + long(5 * r + 5)});
      }
    EXPECT_EQ(seen.size(), size_t(loader.steps_per_epoch() * 10)) << "shuffle " << shuffle;
  }
}

TEST(Loader, SyntheticTestDrawIsIndependentOfTraining) {
  data::Dataset train = data::make_synthetic(50, 4, 3, 0.5, 1, 0);
  data::Dataset test = data::make_synthetic(50, 4, 3, 0.5, 1, 1);
  EXPECT_NE(train.features, test.features);
  EXPECT_EQ(train.features, data::make_synthetic(50, 4, 3, 0.5, 1, 0).features);
}

// Whole training runs: k = 4 microbatches per step ends with the parameters of k = 1.
TEST(TrainerMicrobatch, FourMicrobatchesTrainLikeOneBatch) {
  for (DType dt : {DType::f64, DType::f32}) {
    TempDir dir;
    app::ConfigTrainer one(small_config(dir, dt, 1), kCPU);
    one.run();
    TempDir dir4;
    app::ConfigTrainer four(small_config(dir4, dt, 4), kCPU);
    four.run();
    // f64: only summation order differs (1e-10 after 24 AdamW steps); f32: 1e-4.
    EXPECT_LE(max_rel_diff(params_of(one), params_of(four)), dt == DType::f64 ? 1e-10 : 1e-4)
        << dtype_name(dt);
  }
}

TEST(TrainerResume, StoppedAndResumedRunEndsBitwiseEqual) {
  TempDir dir;
  app::ConfigTrainer full(small_config(dir), kCPU);
  full.run();
  auto expected = params_of(full);
  // Resume from the step-12 checkpoint the full run left, in a fresh trainer.
  TempDir dir2;
  Config cfg = small_config(dir2);
  app::ConfigTrainer resumed(cfg, kCPU);
  resumed.resume(dir / "ckpt/step-000012.safetensors");
  EXPECT_EQ(resumed.step(), 12);
  resumed.run();
  EXPECT_EQ(params_of(resumed), expected);
}

// Raising optim.steps on resume recomputes the cosine schedule over the new length: the learning
// rate jumps back up, and one line says so, with both values. The same length says nothing.
TEST(TrainerResume, ALongerRunSaysTheScheduleIsRecomputed) {
  TempDir dir;
  app::ConfigTrainer full(small_config(dir), kCPU);  // 24 steps, warmup 4, lr 0.003
  full.run();
  TempDir dir2;
  Config longer = small_config(dir2);
  longer.optim.steps = 48;
  LogCapture log;
  app::ConfigTrainer resumed(longer, kCPU);
  resumed.resume(dir / "ckpt");
  const std::string ended = train::format_value(optim::WarmupCosineLR(0.003, 4, 24).lr_at(23));
  const std::string goes_on = train::format_value(optim::WarmupCosineLR(0.003, 4, 48).lr_at(24));
  EXPECT_TRUE(log.contains("the run was 24 steps long and is now 48: the cosine schedule is "
                           "recomputed over 48 steps, so the learning rate goes from " + ended +
                           " at step 24 (the old schedule) to " + goes_on + " at step 25"));

  TempDir dir3;
  LogCapture same;
  app::ConfigTrainer again(small_config(dir3), kCPU);
  again.resume(dir / "ckpt/step-000012.safetensors");
  EXPECT_TRUE(same.contains("resumed from"));
  EXPECT_FALSE(same.contains("steps long"));
}

TEST(TrainerCheckpoint, TruncatedOrCorruptCheckpointsAreClearErrors) {
  TempDir dir;
  app::ConfigTrainer t(small_config(dir), kCPU);
  t.run();
  const std::string good = dir / "ckpt/step-000024.safetensors";
  ASSERT_TRUE(fs::exists(good));
  train::Checkpoint c = train::load_checkpoint(dir / "ckpt");  // the directory: the newest
  EXPECT_EQ(c.step, 24);
  EXPECT_EQ(c.model.front().first, "layers.0.weight");
  // Truncate a copy.
  const std::string bad = dir / "ckpt/step-000099.safetensors";
  fs::copy_file(good, bad);
  fs::copy_file(dir / "ckpt/step-000024.optim.safetensors", dir / "ckpt/step-000099.optim.safetensors");
  fs::resize_file(bad, fs::file_size(bad) - 10);
  try {
    train::load_checkpoint(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step-000099"), std::string::npos) << e.what();
  }
  // A checkpoint of another model shape does not load into this one.
  TempDir dir2;
  Config other = small_config(dir2);
  other.model.hidden = {8};
  app::ConfigTrainer t2(other, kCPU);
  EXPECT_THROW(t2.resume(good), Error);
}

TEST(TrainerNumerics, NonFiniteLossStopsWithoutSavingAndKeepsTheLastCheckpoint) {
  TempDir dir;
  Config cfg = small_config(dir);
  cfg.optim.lr = 1e30;  // step 1 is finite and saved; its update makes the weights ~1e30
  cfg.optim.clip_norm = 0;
  cfg.optim.schedule = "constant";
  cfg.optim.warmup_steps = 0;
  cfg.logging.every = 1;
  cfg.checkpoint.every = 1;  // every step that passes its check is saved
  app::ConfigTrainer t(cfg, kCPU);
  EXPECT_THROW(t.run(), train::NonFiniteError);
  const auto saved = train::list_checkpoints(dir / "ckpt");
  ASSERT_GT(saved.size(), 0u) << "no checkpoint before the divergence: the loop below checks nothing";
  // The step that failed its check (the trainer stopped on it) left no checkpoint.
  char failed[32];
  std::snprintf(failed, sizeof failed, "step-%06lld.safetensors", static_cast<long long>(t.step() + 1));
  EXPECT_FALSE(fs::exists(fs::path(dir / "ckpt") / failed));
  EXPECT_EQ(train::load_checkpoint(dir / "ckpt").step, t.step());
  for (const auto& f : saved) {
    train::Checkpoint c = train::load_checkpoint(f);
    for (auto& [name, p] : c.model)
      for (double v : p.to_vector()) ASSERT_TRUE(std::isfinite(v)) << name << " in " << f;
  }
}

TEST(TrainCli, ExitCodesAndNothingWrittenOnBadConfig) {
  TempDir dir;
  const std::string out = dir / "never";
  EXPECT_EQ(run_train("--config " + std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml --set optim.lrr=1 --set checkpoint.dir=" + out), 2);
  EXPECT_EQ(run_train("--config " + std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml --set optim.microbatches=1000 --set checkpoint.dir=" + out), 2);
  EXPECT_EQ(run_train("--config /nonexistent.yaml"), 2);
  EXPECT_EQ(run_train("--bogus"), 2);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(run_train("--list-ops"), 0);
  EXPECT_EQ(run_train("--version"), 0);
  EXPECT_EQ(run_train("--config " + std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml --resume " + (dir / "missing") + " --set device=cpu --set checkpoint.dir=" + out), 2);  // a --resume that cannot be used
}

// Inputs that were read without a bound, sizes that overflowed or exhausted memory, and values
// that only failed once the run was under way: each is exit code 2 at start-up, nothing written.
// "At start-up": each call has a limit of a minute (exit code 124 past it), which a call that
// reads /dev/zero forever reaches and a busy machine does not.
TEST(TrainCli, BadInputsExitTwoAtOnce) {
  TempDir dir;
  const std::string out = dir / "never";
  const std::string run = "--config " + std::string(MT_SOURCE_DIR) +
                          "/configs/mlp.yaml --set device=cpu --set optim.steps=2 "
                          "--set optim.warmup_steps=0 --set checkpoint.dir=" + out + " ";
  const std::string two_docs = dir.write("two.yaml", "seed: 1\n---\nseed: 2\n");
  std::ofstream(dir / "file") << "not a folder";
  auto run_train = [](const std::string& args) { return test::run_train_within(60, args); };
  EXPECT_EQ(run_train("--config /dev/zero"), 2);                            // was read forever
  EXPECT_EQ(run_train(run + "--set data.kind=csv --set data.path=/dev/zero"), 2);  // the same
  EXPECT_EQ(run_train(run + "--set model.classes=4611686018427387904"), 2);  // was a segfault
  EXPECT_EQ(run_train(run + "--set model.hidden=[1000000000000]"), 2);      // was std::bad_alloc
  EXPECT_EQ(run_train(run + "--set model.hidden=[16777216,16777216]"), 2);  // 1 PiB: the memory check
  EXPECT_EQ(run_train(run + "--set data.samples=3"), 2);                    // was exit code 1
  EXPECT_EQ(run_train("--config " + two_docs + " --set checkpoint.dir=" + out), 2);
  EXPECT_EQ(run_train(run + "--set checkpoint.dir=\"$(printf '" + out + "\\377')\""), 2);  // not UTF-8
  EXPECT_EQ(run_train(run + "--set checkpoint.dir=" + (dir / "file/ckpt")), 2);  // failed at a save
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + "\377"));
}

// What the README promises: the default config reaches at least 95% test accuracy on the CPU.
TEST(TrainerDefaultConfig, ReachesTheStatedAccuracy) {
  TempDir dir;
  Config cfg = load_config(std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml",
                           {"device=cpu", "checkpoint.dir=" + (dir / "run")});
  app::ConfigTrainer t(cfg, kCPU);
  train::RunSummary s = t.run();
  EXPECT_GE(s.test_metrics.at("accuracy"), 0.95);
  EXPECT_GE(s.val_metrics.at("accuracy"), 0.95);
  EXPECT_TRUE(fs::exists(dir / "run/curve.svg"));
  EXPECT_TRUE(fs::exists(dir / "run/metrics.jsonl"));
}

// The picture of a run: both panels, every series, and nothing a log axis cannot show (a zero or
// NaN loss is left out instead of becoming NaN coordinates); a line without a step is skipped.
TEST(TrainerCurve, SvgDrawsEverySeriesAndSkipsWhatItCannotShow) {
  TempDir dir;
  {
    std::ofstream m(dir / "metrics.jsonl");
    m << R"({"step": 10, "loss": 2.0, "accuracy": 0.5})" "\n"
      << R"({"step": 20, "loss": 0.0, "accuracy": 0.7})" "\n"
      << R"({"step": 20, "val_loss": 0.4, "val_accuracy": 0.75})" "\n"
      << R"({"loss": 9.0})" "\n"
      << "not json\n"
      << R"({"step": 30, "loss": 0.3, "accuracy": 0.8})" "\n";
  }
  const train::Curves c = train::read_curves(dir / "metrics.jsonl");
  EXPECT_EQ(c.train_loss.size(), 3u);
  EXPECT_EQ(c.val_loss.size(), 1u);
  EXPECT_EQ(c.train_accuracy.size(), 3u);
  EXPECT_EQ(c.val_accuracy.size(), 1u);
  train::write_curve_svg(dir / "curve.svg", c, "a <test> & run");
  std::ifstream in(dir / "curve.svg");
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* want : {"loss (log scale)", "accuracy", ">training<", ">validation<",
                           "a &lt;test&gt; &amp; run", "</svg>"})
    EXPECT_NE(svg.find(want), std::string::npos) << want;
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  // Two training-loss dots (the zero is left out) plus one validation-loss dot: 3 on the log panel.
  size_t dots = 0;
  for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1))
    ++dots;
  EXPECT_EQ(dots, 3u + 4u);  // and 3 + 1 accuracy dots
}

// The test set's loss and accuracy, measured once at the end, are a diamond on each panel at
// their step (here the last, so at the right edge: x = 58 + 303 on the loss panel, 58 + 303 + 76
// + 303 on the accuracy panel), with "test" in the legend; a run without a test set has neither.
TEST(TrainerCurve, TheTestPointIsPlottedAtItsStep) {
  TempDir dir;
  {
    std::ofstream m(dir / "metrics.jsonl");
    m << R"({"step": 10, "loss": 2.0, "accuracy": 0.5})" "\n"
      << R"({"step": 20, "loss": 0.5, "accuracy": 0.7})" "\n"
      << R"({"step": 20, "test_loss": 0.4, "test_accuracy": 0.75})" "\n";
  }
  const train::Curves c = train::read_curves(dir / "metrics.jsonl");
  ASSERT_EQ(c.test_loss.size(), 1u);
  ASSERT_EQ(c.test_accuracy.size(), 1u);
  train::write_curve_svg(dir / "curve.svg", c, "run");
  auto read_svg = [&] {
    std::ifstream in(dir / "curve.svg");
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  std::string svg = read_svg();
  EXPECT_NE(svg.find("<title>test loss 0.4 at step 20</title>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("<title>test accuracy 0.75 at step 20</title>"), std::string::npos) << svg;
  // The diamonds' top vertices: at the panels' right edges.
  EXPECT_NE(svg.find("<polygon points='361.0,"), std::string::npos) << svg;
  EXPECT_NE(svg.find("<polygon points='740.0,"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">test<"), std::string::npos);

  train::Curves none = c;
  none.test_loss.clear();
  none.test_accuracy.clear();
  train::write_curve_svg(dir / "curve.svg", none, "run");
  svg = read_svg();
  EXPECT_EQ(svg.find("test"), std::string::npos) << svg;
}

// A long run's curve stays readable: no dots once a series has many points, log-axis labels
// never closer than a text height, and the legend above the plots, where no curve runs.
TEST(TrainerCurve, ALongRunsCurveHasNoDotsNoOverlappingLabelsAndAFreeLegend) {
  TempDir dir;
  train::Curves c;
  for (int64_t s = 25; s <= 20000; s += 25) {
    const double loss = 2.0 * std::exp(-double(s) / 1500);  // 2 down to 3e-6: six decades
    c.train_loss.push_back({s, loss});
    c.train_accuracy.push_back({s, 1 - loss / 3});
    if (s % 100 == 0) c.val_loss.push_back({s, 1.5 * loss}), c.val_accuracy.push_back({s, 1 - loss / 2});
  }
  train::write_curve_svg(dir / "curve.svg", c, "long");
  std::ifstream in(dir / "curve.svg");
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(svg.find("<circle"), std::string::npos);
  // The y labels of the loss panel (text-anchor end at x = left - 6 = 52): at least 14 px apart.
  std::vector<double> ys;
  for (size_t at = svg.find("<text x='52.0' y='"); at != std::string::npos;
       at = svg.find("<text x='52.0' y='", at + 1))
    ys.push_back(std::stod(svg.substr(at + 18)));
  ASSERT_GE(ys.size(), 3u) << svg;
  for (size_t i = 1; i < ys.size(); ++i) EXPECT_GE(std::abs(ys[i] - ys[i - 1]), 14.0) << svg;
  // The legend's text sits above the panels' top (62).
  const size_t legend = svg.find(">training<");
  ASSERT_NE(legend, std::string::npos);
  const size_t y_at = svg.rfind(" y='", legend);
  EXPECT_LT(std::stod(svg.substr(y_at + 4)), 62.0);
}

// A program that uses the library logs the `train` program's lines, "[14:02:07] message", not
// spdlog's default "[2026-12-02 14:02:07.123] [info] message": the library sets the pattern before
// main() (train/log_format.h). This binary is such a program; nothing in it sets a pattern.
TEST(TrainerLog, ALibraryProgramLogsInTheTrainProgramsFormat) {
  testing::internal::CaptureStdout();
  spdlog::info("a line");
  spdlog::warn("a warning");
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(std::regex_match(out, std::regex(R"(\[\d\d:\d\d:\d\d\] a line\n\[\d\d:\d\d:\d\d\] a warning\n)")))
      << out;
}

// ---- cuda_graph -----------------------------------------------------------------------------

TEST(TrainerCudaGraph, OnTheCpuItWarnsAndRunsEagerly) {
  TempDir dir;
  Config cfg = small_config(dir);
  app::ConfigTrainer eager(cfg, kCPU);
  const train::RunSummary a = eager.run();
  TempDir dir2;
  cfg = small_config(dir2);
  cfg.cuda_graph = true;
  LogCapture log;
  app::ConfigTrainer graph(cfg, kCPU);
  const auto init = params_of(graph);
  const train::RunSummary b = graph.run();
  EXPECT_TRUE(log.contains("cuda_graph: the device is cpu, and CUDA graphs need a GPU; every step runs eagerly"));
  // It trained: all 24 updates were taken and moved every tensor, and the loss is finite.
  EXPECT_EQ(graph.optimizer().steps_taken(), 24);
  const auto trained = params_of(graph);
  for (size_t i = 0; i < init.size(); ++i) EXPECT_NE(trained[i], init[i]) << "parameter " << i;
  EXPECT_TRUE(std::isfinite(b.train_loss));
  // And like an eager run: the same weights and loss as the run with cuda_graph off.
  EXPECT_EQ(params_of(eager), trained);
  EXPECT_EQ(a.train_loss, b.train_loss);
}

// The learning rate of step s (counting from 1, as the log does) is the schedule's lr_at(s − 1):
// both what the optimizer holds when it updates and what the metrics record.
TEST(TrainerSchedule, StepSUpdatesWithTheScheduleAtSMinusOneAndLogsIt) {
  TempDir dir;
  Config cfg = small_config(dir);
  cfg.logging.every = 1;
  cfg.optim.min_lr = 1e-4;
  const optim::WarmupCosineLR schedule(cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.steps,
                                       cfg.optim.min_lr);
  app::ConfigTrainer t(cfg, kCPU);
  std::vector<std::pair<int64_t, double>> applied;  // (step, the optimizer's lr before its update)
  t.set_step_callback([&](int64_t step, train::Trainer& tr) {
    for (const auto& g : tr.optimizer().param_groups()) EXPECT_EQ(*g.lr, *tr.optimizer().param_groups()[0].lr);
    applied.emplace_back(step, *tr.optimizer().param_groups()[0].lr);
  });
  t.run();
  ASSERT_EQ(applied.size(), 24u);
  for (const auto& [step, lr] : applied) EXPECT_EQ(lr, schedule.lr_at(step - 1)) << "step " << step;
  EXPECT_EQ(applied.front().second, cfg.optim.lr / 4);  // the first warmup step: max / warmup
  int64_t logged = 0;
  std::ifstream in(train::metrics_path(app::options_from(cfg)));
  for (std::string line; std::getline(in, line);) {
    const auto r = nlohmann::json::parse(line);
    if (!r.contains("lr")) continue;
    const int64_t step = r["step"];
    EXPECT_EQ(r["lr"].get<double>(), schedule.lr_at(step - 1)) << "step " << step;
    ++logged;
  }
  EXPECT_EQ(logged, 24);
}

// The graph replays steps that are not logged or saved; logged and saved steps run eagerly in
// between. Same kernels, same data, so the run must end bit for bit where the eager run ends.
TEST(CudaTrainerGraph, GraphRunEqualsTheEagerRunBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    TempDir d1, d2;
    Config cfg = small_config(d1, dt, /*k=*/3);
    cfg.device = "cuda";
    app::ConfigTrainer eager(cfg, cuda_device(0));
    const train::RunSummary a = eager.run();
    cfg = small_config(d2, dt, 3);
    cfg.device = "cuda";
    cfg.cuda_graph = true;
    LogCapture log;
    app::ConfigTrainer graph(cfg, cuda_device(0));
    const train::RunSummary b = graph.run();
    EXPECT_TRUE(log.contains("cuda_graph: step 2 captured")) << "the step was not captured";
    EXPECT_EQ(params_of(eager), params_of(graph));
    EXPECT_EQ(a.train_loss, b.train_loss);
    EXPECT_EQ(a.val_loss, b.val_loss);
    EXPECT_EQ(eager.optimizer().steps_taken(), graph.optimizer().steps_taken());
    const auto sa = eager.optimizer().state_dict(), sb = graph.optimizer().state_dict();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) EXPECT_EQ(sa[i].second.to_vector(), sb[i].second.to_vector()) << sa[i].first;
  }
}

TEST(CudaTrainerGraph, AnOptimizerThatIsNotCapturableRunsEagerlyWithAWarning) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  TempDir dir;
  Config cfg = small_config(dir);
  cfg.device = "cuda";
  cfg.optim.name = "sgd";
  cfg.cuda_graph = true;
  LogCapture log;
  app::ConfigTrainer t(cfg, cuda_device(0));
  const train::RunSummary s = t.run();
  EXPECT_TRUE(log.contains("optimizer sgd keeps its per-step values on the host"));
  EXPECT_FALSE(log.contains("captured"));
  EXPECT_TRUE(std::isfinite(s.train_loss));
}

// ---- data parallel on CPU threads ------------------------------------------------------------

// N ranks × k microbatches over the same global batch train like one rank: the same gradients up
// to the order of the sums, so after 24 AdamW steps the weights agree to rounding (f64), and the
// gradients are all-reduced once per step, not once per microbatch.
TEST(DistTrainer, CpuRanksTrainLikeOneRankWithTheSameGlobalBatch) {
  TempDir d0;
  Config one = small_config(d0, DType::f64, /*k=*/2);
  one.optim.batch_size = 47;  // shards of 16, 16, 15 over three ranks: an uneven last shard
  app::ConfigTrainer single(one, kCPU);
  const train::RunSummary ref = single.run();
  for (int n : {2, 3}) {
    SCOPED_TRACE(testing::Message() << n << " ranks");
    TempDir d;
    Config cfg = one;
    cfg.checkpoint.dir = d / "ckpt";
    const train::LocalRun run = app::run_local_ranks(cfg, n);
    const train::RunSummary& s = run.summary;
    for (const auto& t : run.ranks) EXPECT_LT(max_rel_diff(params_of(*t), params_of(single)), 1e-10);
    for (const auto& t : run.ranks) EXPECT_EQ(params_of(*t), params_of(*run.ranks[0]));  // replicas equal
    // The logged loss is summed in f32 (per rank, then over ranks): f32 rounding, not f64's.
    EXPECT_NEAR(s.train_loss, ref.train_loss, 1e-6 * std::abs(ref.train_loss));
    EXPECT_NEAR(s.val_metrics.at("accuracy"), ref.val_metrics.at("accuracy"), 1e-12);
    // Rank 0 alone wrote the checkpoints and the metrics; one gradient all-reduce per step and
    // bucket (this model fits in one bucket), with k = 2 microbatches per rank.
    EXPECT_TRUE(fs::exists(d / "ckpt/step-000024.safetensors"));
    int64_t reduces = -1;
    std::ifstream metrics(d / "ckpt/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);)
      if (auto j = nlohmann::json::parse(line); j.contains("gradient_all_reduces"))
        reduces = j["gradient_all_reduces"].get<int64_t>();
    EXPECT_EQ(reduces, 24);
  }
}

TEST(DistTrainer, AFailingRankStopsTheOthersWithItsOwnError) {
  TempDir d;
  Config cfg = small_config(d);
  // The group's timeout is an hour: only the abort can stop ranks 0 and 2 before the shard's ctest
  // limit (10 minutes, CMakeLists.txt) fails a run in which the abort did not wake them.
  try {
    app::run_local_ranks(
        cfg, 3, "",
        [](int rank, train::Trainer& t) {
          if (rank == 1)
            t.set_step_callback([](int64_t step, train::Trainer&) {
              if (step == 5) throw std::runtime_error("rank 1 fell over at step 5");
            });
        },
        std::chrono::hours(1));
    ADD_FAILURE() << "expected the job to fail";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 fell over at step 5"), std::string::npos) << e.what();
  }
}

TEST(DistTrainer, BatchTooSmallForTheRanksIsAConfigError) {
  TempDir d;
  Config cfg = small_config(d, DType::f32, 4);
  cfg.optim.batch_size = 10;
  EXPECT_THROW(app::run_local_ranks(cfg, 3), ConfigError);
}

TEST(TrainCli, NprocRunsCpuRanks) {
  TempDir d;
  EXPECT_EQ(run_train("--config " + std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml --device cpu "
                      "--nproc 2 --set optim.steps=10 --set optim.warmup_steps=2 --set checkpoint.dir=" +
                      (d / "ckpt")),
            0);
  EXPECT_TRUE(fs::exists(d / "ckpt/step-000010.safetensors"));
  EXPECT_EQ(run_train("--config x.yaml --nproc 0"), 2);
}
