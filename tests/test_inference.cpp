// `train eval` and `train predict` (app/inference.h): a saved model reproduces its run's test
// numbers exactly, predictions agree with them, and bad checkpoints or inputs are named, exit 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "app/config.h"
#include "app/config_trainer.h"
#include "app/inference.h"
#include "core/safetensors.h"
#include "data/data.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "tests/expect_error.h"
#include "tests/log_capture.h"
#include "tests/run_train.h"
#include "tests/temp_dir.h"
#include "train/trainer.h"

namespace mt {
namespace {

using test::run_train;
using test::TempDir;
namespace fs = std::filesystem;

// A run of seconds: 12 steps, evaluated and saved at steps 6 and 12.
Config tiny_config(const TempDir& dir, std::vector<std::string> more = {}) {
  std::vector<std::string> o = {"device=cpu",          "model.input=8",      "model.hidden=[16]",
                                "model.classes=4",     "data.samples=600",   "data.noise=1.0",
                                "optim.steps=12",      "optim.warmup_steps=2", "optim.batch_size=32", "optim.microbatches=2",
                                "eval.every=6",        "eval.batch_size=50", "checkpoint.every=6",
                                "checkpoint.dir=" + (dir / "ck")};
  o.insert(o.end(), more.begin(), more.end());
  return load_config("", o);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The test set's features as a CSV without labels; returns the labels.
std::vector<int64_t> write_features(const Config& c, const std::string& path) {
  const data::Dataset test = data::load_dataset(c.data, c.model, true);
  std::ofstream out(path);
  char cell[32];
  for (int64_t r = 0; r < test.size; ++r)
    for (int64_t k = 0; k < test.dim; ++k) {
      std::snprintf(cell, sizeof cell, "%.9g", test.features[size_t(r * test.dim + k)]);
      out << cell << (k + 1 < test.dim ? "," : "\n");
    }
  return test.labels;
}

TEST(Inference, EvaluateReproducesTheRunsTestAndValidationNumbers) {
  for (const char* dtype : {"f32", "bf16", "f64"}) {
    SCOPED_TRACE(dtype);
    TempDir dir;
    const Config cfg = tiny_config(dir, {std::string("precision.compute_dtype=") + dtype});
    train::RunSummary s = app::ConfigTrainer(cfg, kCPU).run();
    const app::CheckpointEvaluation test = app::evaluate_checkpoint(s.checkpoint);
    EXPECT_EQ(test.loss, s.test_loss);  // exactly: the same arithmetic on the same data
    EXPECT_EQ(test.metrics.at("accuracy"), s.test_metrics.at("accuracy"));
    EXPECT_EQ(test.samples, 120);
    const app::CheckpointEvaluation val = app::evaluate_checkpoint(dir / "ck", {}, "val");  // the newest
    EXPECT_EQ(val.loss, s.val_loss);
    EXPECT_EQ(val.metrics.at("accuracy"), s.val_metrics.at("accuracy"));
    EXPECT_EQ(val.samples, 60);
    EXPECT_GT(test.metrics.at("accuracy"), 0.25);  // learned something: not a fresh model
  }
}

TEST(Inference, EvaluateTakesOtherDataAndRefusesWhatDoesNotFit) {
  TempDir dir;
  const Config cfg = tiny_config(dir);
  const std::string ckpt = app::ConfigTrainer(cfg, kCPU).run().checkpoint;
  // A larger test draw of the same task (a fifth of data.samples).
  const app::CheckpointEvaluation other = app::evaluate_checkpoint(ckpt, {"data.samples=1000"});
  EXPECT_EQ(other.samples, 200);
  app::CheckpointEvaluation e;
  e.loss = 0.123449, e.metrics = {{"accuracy", 0.5}}, e.split = "test", e.samples = 7;
  EXPECT_EQ(app::format_evaluation(e),
            "test: loss 0.1234 | accuracy 0.5000 (7 samples)");
  e.loss = 1.23456e-5;  // a small loss keeps its digits (four fixed decimals printed 0.0000)
  EXPECT_EQ(app::format_evaluation(e), "test: loss 1.235e-05 | accuracy 0.5000 (7 samples)");

  const std::string csv = dir / "d.csv";
  std::ofstream(csv) << "1,2,0\n3,4,1\n";
  test::expect_error([&] { app::evaluate_checkpoint(ckpt, {"data.kind=csv", "data.path=" + csv}); },
                     {"data.test_path: the run has no test set", "--split val"});
  // What does not fit is refused as the trainer refuses it (the model kind's check_data).
  test::expect_error([&] { app::evaluate_checkpoint(ckpt, {"data.kind=csv", "data.path=" + csv, "data.test_path=" + csv}); },
                     {"model.input: is 8 but the", "has 2 features per sample"});
  const std::string wide = dir / "wide.csv";  // 8 features and a label past model.classes = 4
  std::ofstream(wide) << "1,2,3,4,5,6,7,8,0\n1,2,3,4,5,6,7,8,9\n";
  test::expect_error(
      [&] {
        app::evaluate_checkpoint(ckpt,
                                 {"data.kind=csv", "data.path=" + wide, "data.test_path=" + wide});
      },
      {"model.classes: is 4 but the", "has label 9 (sample 1)"});
  test::expect_error([&] { app::evaluate_checkpoint(ckpt, {"model.hidden=[8]"}); },
                     {"--set model.hidden=[8]", "data.*, eval.* and device only"});
  test::expect_error([&] { app::evaluate_checkpoint(ckpt, {}, "train"); }, {"--split", "'train'"});
}

// Each damage is an InferenceError naming the file.
TEST(Inference, BadCheckpointsAreNamed) {
  TempDir dir;
  const std::string ckpt = app::ConfigTrainer(tiny_config(dir), kCPU).run().checkpoint;
  const std::string missing = dir / "nope.safetensors";
  auto expect_inference_error = [](const std::function<void()>& f, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "expected InferenceError or DataError";
    } catch (const Error& e) {  // InferenceError: the wrong width; DataError: not a numeric CSV
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_inference_error([&] { app::evaluate_checkpoint(missing); }, "nope.safetensors: cannot open");
  const std::string optim = ckpt.substr(0, ckpt.size() - 12) + ".optim.safetensors";
  expect_inference_error([&] { app::evaluate_checkpoint(optim); },
                         "has no 'config' in its metadata: not a model file");
  const std::string flipped = dir / "flipped.safetensors";
  fs::copy_file(ckpt, flipped);
  {
    std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(-5, std::ios::end);
    f.write(&c, 1);
  }
  expect_inference_error([&] { app::evaluate_checkpoint(flipped); },
                         "flipped.safetensors: damaged: tensor 'layers.3.bias' fails its checksum");
  expect_inference_error([&] { app::evaluate_checkpoint(dir.path.string()); },
                         "no step-*.safetensors checkpoint");
}

// A directory's newest model file serves though its optimizer file is gone (inference needs none;
// eval used to report the step before without saying so); a damaged one is skipped, and the
// one used instead is named.
TEST(Inference, ADirectoryGivesItsNewestModelFileThatReads) {
  TempDir dir;
  app::ConfigTrainer(tiny_config(dir), kCPU).run();
  const std::string ck = dir / "ck", newest = ck + "/step-000012.safetensors",
                    older = ck + "/step-000006.safetensors";
  const double newest_loss = app::evaluate_checkpoint(newest).loss;
  ASSERT_NE(newest_loss, app::evaluate_checkpoint(older).loss);
  fs::remove(ck + "/step-000012.optim.safetensors");
  EXPECT_EQ(app::evaluate_checkpoint(ck).loss, newest_loss);
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  LogCapture log;
  EXPECT_EQ(app::evaluate_checkpoint(ck).loss, app::evaluate_checkpoint(older).loss);
  EXPECT_TRUE(log.contains("checkpoint " + newest + " is unusable"));
  EXPECT_TRUE(log.contains("checkpoint: using " + older + " (step 6)"));
}

// The predicted classes are the ones accuracy counts; each row's probabilities sum to 1.
TEST(Inference, PredictAgreesWithEvaluate) {
  TempDir dir;
  const Config cfg = tiny_config(dir);
  const train::RunSummary s = app::ConfigTrainer(cfg, kCPU).run();
  const std::string in = dir / "x.csv", out = dir / "p.csv";
  const std::vector<int64_t> labels = write_features(cfg, in);
  EXPECT_EQ(app::predict_csv(s.checkpoint, in, out), 120);

  std::istringstream text(read_text(out));
  std::string line;
  std::getline(text, line);
  EXPECT_EQ(line, "class,p0,p1,p2,p3");
  int64_t rows = 0, correct = 0;
  while (std::getline(text, line)) {
    std::vector<double> v;
    std::stringstream cells(line);
    for (std::string cell; std::getline(cells, cell, ',');) v.push_back(std::stod(cell));
    ASSERT_EQ(v.size(), 5u) << line;
    double sum = 0;
    size_t best = 1;
    for (size_t k = 1; k < 5; ++k) {
      EXPECT_GT(v[k], 0.0);
      sum += v[k];
      if (v[k] > v[best]) best = k;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << line;
    EXPECT_EQ(v[0], double(best - 1)) << line;  // the class is the most probable one
    correct += int64_t(v[0]) == labels[size_t(rows)];
    ++rows;
  }
  EXPECT_EQ(rows, 120);
  EXPECT_EQ(double(correct) / 120.0, s.test_metrics.at("accuracy"));
}

// A row of the wrong width stops predict before anything is written, naming the file and line.
TEST(Inference, PredictRefusesTheWrongWidthAndKeepsTheOldOutput) {
  TempDir dir;
  const std::string ckpt = app::ConfigTrainer(tiny_config(dir), kCPU).run().checkpoint;
  const std::string in = dir / "x.csv", out = dir / "p.csv";
  std::ofstream(out) << "old\n";
  auto expect_refused = [&](const std::string& csv, const std::string& part) {
    std::ofstream(in, std::ios::trunc) << csv;
    try {
      app::predict_csv(ckpt, in, out);
      ADD_FAILURE() << "expected InferenceError or DataError";
    } catch (const Error& e) {  // InferenceError: the wrong width; DataError: not a numeric CSV
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
    EXPECT_EQ(read_text(out), "old\n");
  };
  expect_refused("\n1,2,3\n", "x.csv:2: the row has 3 features, but the model takes 8");
  expect_refused("1,2,3,4,5,6,7,8\n1,2,3,4,5,6,7\n", "x.csv:2:14: row has 7 cells, expected 8");
  expect_refused("1,2,3,4,5,6,7,x\n", "x.csv:1:15: cell 8: expected a finite number, got 'x'");
  expect_refused("", "x.csv:1:1: no data rows");
  // With data.header a first line is skipped; the rest is read.
  std::ofstream(in, std::ios::trunc) << "a,b,c,d,e,f,g,h\n1,2,3,4,5,6,7,8\n";
  EXPECT_EQ(app::predict_csv(ckpt, in, out, {"data.header=true"}), 1);
  const std::string p = read_text(out);
  EXPECT_EQ(std::count(p.begin(), p.end(), '\n'), 2);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), {}), 3);  // ck, x.csv, p.csv: no temp
}

// Non-finite outputs and weights are errors: predict on inputs of 3e38 used to write -nan
// probabilities and eval to print `loss -nan`, and a NaN weight (checksums recomputed) was used.
TEST(Inference, NonFiniteOutputsAndWeightsAreErrors) {
  TempDir dir;
  const Config cfg = tiny_config(dir);
  const std::string ckpt = app::ConfigTrainer(cfg, kCPU).run().checkpoint;
  // The checkpoint again with parameter `name` changed by `edit`, saved with valid checksums
  // in the folder `folder`.
  const auto edited = [&](const std::string& folder, const std::string& name,
                          const std::function<void(Tensor&)>& edit) {
    train::Checkpoint c = train::load_checkpoint(ckpt);
    const auto it =
        std::find_if(c.model.begin(), c.model.end(), [&](auto& p) { return p.first == name; });
    EXPECT_NE(it, c.model.end()) << name;
    if (it != c.model.end()) edit(it->second);
    std::map<std::string, std::string> meta;
    for (const char* key : {"config", "standardization"})
      if (c.metadata.contains(key)) meta[key] = c.metadata.at(key);
    return train::save_checkpoint(dir / folder, c.run_id, c.step, c.model, c.optimizer, meta, 1);
  };
  // Every first-layer weight 1: a row of 3e38s sums past the largest float in any order, so its
  // logits are non-finite whatever kernel the BLAS picks. With the trained weights, whether the
  // sum overflowed hung on the BLAS's order: on an AVX-512 CPU it stayed finite, and eval of the
  // one row gave a loss.
  const std::string ones = edited("ones", "layers.0.weight", [](Tensor& w) {
    std::fill_n(w.data<float>(), w.numel(), 1.0f);
  });
  const std::string in = dir / "x.csv", out = dir / "p.csv";
  std::ofstream(out) << "old\n";
  std::ofstream(in) << "1,2,3,4,5,6,7,8\n3e38,3e38,3e38,3e38,3e38,3e38,3e38,3e38\n";
  try {
    app::predict_csv(ones, in, out);
    ADD_FAILURE() << "predicted";
  } catch (const train::NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("x.csv: data row 2 gives non-finite logits"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_text(out), "old\n");
  const std::string test_csv = dir / "test.csv";
  std::ofstream(test_csv) << "3e38,3e38,3e38,3e38,3e38,3e38,3e38,3e38,1\n";
  try {
    app::evaluate_checkpoint(ones, {"data.kind=csv", "data.path=" + test_csv,
                                    "data.test_path=" + test_csv, "data.standardize=false"},
                             "test");
    ADD_FAILURE() << "evaluated";
  } catch (const train::NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("test: the loss is"), std::string::npos) << e.what();
  }
  // A NaN weight.
  const std::string bad =
      edited("nan", "layers.0.weight", [](Tensor& w) { w.data<float>()[3] = NAN; });
  for (auto run : {std::function<void()>([&] { app::evaluate_checkpoint(bad, {}, "test"); }),
                   std::function<void()>([&] { app::predict_csv(bad, in, out); })}) {
    try {
      run();
      ADD_FAILURE() << "used the NaN weight";
    } catch (const app::InferenceError& e) {
      EXPECT_NE(std::string(e.what()).find("parameter 'layers.0.weight' holds nan"),
                std::string::npos) << e.what();
    }
  }
}

// Through the binary: `train eval` on the default run's final checkpoint prints exactly the
// line the run printed; `train predict` writes its CSV; bad input exits 2.
TEST(InferenceCli, EvalPrintsTheRunsTestLineAndPredictWritesItsCsv) {
  TempDir dir;
  const std::string run = "--config " + std::string(MT_SOURCE_DIR) +
                          "/configs/mlp.yaml --device cpu --set data.samples=1000 "
                          "--set optim.steps=10 --set optim.warmup_steps=2 --set optim.batch_size=64 --set eval.every=5 "
                          "--set checkpoint.every=5 --set checkpoint.dir=" + (dir / "ck");
  std::string log, eval;
  ASSERT_EQ(run_train(run, &log, false), 0);
  const size_t at = log.find("test: loss ");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string test_line = log.substr(at, log.find('\n', at) - at);
  ASSERT_EQ(run_train("eval --checkpoint " + (dir / "ck/step-000010.safetensors"), &eval, false), 0);
  EXPECT_EQ(eval, test_line + "\n");
  ASSERT_EQ(run_train("eval --checkpoint " + (dir / "ck"), &eval, false), 0);  // its newest: the same
  EXPECT_EQ(eval, test_line + "\n");

  const std::string in = dir / "x.csv", out = dir / "p.csv";
  write_features(load_config(std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml", {"data.samples=1000"}), in);
  EXPECT_EQ(run_train("predict --checkpoint " + (dir / "ck") + " --input " + in + " --output " + out), 0);
  const std::string p = read_text(out);
  EXPECT_TRUE(p.starts_with("class,p0,p1,p2,p3,p4,p5,p6,p7\n")) << p.substr(0, 80);
  EXPECT_EQ(std::count(p.begin(), p.end(), '\n'), 201);

  // A run's own files are never an output: the checkpoint and the metrics stay as they were.
  for (const std::string own : {"metrics.jsonl", "step-000010.optim.safetensors",
                                "step-000010.safetensors"}) {
    const std::string path = dir / ("ck/" + own), before = read_text(path);
    EXPECT_EQ(run_train("predict --checkpoint " + (dir / "ck") + " --input " + in + " --output " +
                        path), 2) << own;
    EXPECT_EQ(read_text(path), before) << own;
  }
  std::ofstream(in, std::ios::trunc) << "1,2\n";
  EXPECT_EQ(run_train("predict --checkpoint " + (dir / "ck") + " --input " + in + " --output " + (dir / "q.csv")), 2);
  EXPECT_FALSE(fs::exists(dir / "q.csv"));
  EXPECT_EQ(run_train("eval --checkpoint " + (dir / "missing.safetensors")), 2);
  EXPECT_EQ(run_train("eval --checkpoint " + (dir / "ck") + " --set optim.lr=1"), 2);
  EXPECT_EQ(run_train("eval"), 2);
  EXPECT_EQ(run_train("predict --checkpoint " + (dir / "ck")), 2);  // no --input / --output
  EXPECT_EQ(run_train("eval --checkpoint " + (dir / "ck") + " --input x"), 2);  // predict's flag
#if !defined(__SANITIZE_ADDRESS__)  // an address-space limit and AddressSanitizer do not mix
  // Data larger than the machine, which nothing prices before eval loads it: a message, not
  // "std::bad_alloc" alone.
  std::string oom;
  EXPECT_EQ(mt::test::run_shell("ulimit -v 4000000; " + std::string(MT_BINARY_DIR) +
                                "/train eval --checkpoint " + (dir / "ck") +
                                " --set data.samples=4294967296 2>&1", &oom), 1);
  EXPECT_NE(oom.find("out of host memory (std::bad_alloc)"), std::string::npos) << oom;
#endif
  std::string help;
  EXPECT_EQ(run_train("--help", &help, false), 0);
  EXPECT_NE(help.find("train eval --checkpoint"), std::string::npos);
  EXPECT_NE(help.find("train predict --checkpoint"), std::string::npos);
}

}  // namespace
}  // namespace mt
