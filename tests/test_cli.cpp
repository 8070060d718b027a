// The `train` program as a user meets it: smoke runs, merged section overrides, --help,
// --print-config, --version, --device, the exit-code table, per-file CSV headers, dataset sizes
// in the log, optim.epochs and data.standardize carried from the run to eval and predict,
// data.test_fraction, the label column's hint, and the live line on a terminal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "app/config.h"
#include "app/config_trainer.h"
#include "app/inference.h"
#include "core/device.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "data/data.h"
#include "tests/expect_error.h"
#include "tests/log_capture.h"
#include "tests/run_train.h"
#include "tests/temp_dir.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace mt;
using mt::test::run_train;
namespace fs = std::filesystem;
using mt::test::TempDir;

namespace {

const std::string kMlp = std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A 3-class CSV whose features are far from mean 0, std 1: 4 features around 1000 with std ~50,
// the class in the last column (a linear function of the features, so it can be learned).
std::string csv_rows(int64_t rows, uint64_t seed, bool header) {
  Generator g(seed);
  std::ostringstream s;
  if (header) s << "a,b,c,d,label\n";
  for (int64_t r = 0; r < rows; ++r) {
    double f[4], score = 0;
    for (int k = 0; k < 4; ++k) {
      f[k] = 1000.0 + 50.0 * g.normal();
      score += (k % 2 ? 1 : -1) * (f[k] - 1000.0);
    }
    const int label = score < -30 ? 0 : score < 30 ? 1 : 2;
    char line[128];
    std::snprintf(line, sizeof line, "%.6g,%.6g,%.6g,%.6g,%d\n", f[0], f[1], f[2], f[3], label);
    s << line;
  }
  return s.str();
}

std::string csv_run(const TempDir& dir, const std::string& more = "") {
  return "--config " + kMlp + " --device cpu --set model.input=4 --set model.classes=3 "
         "--set model.hidden=[16] --set data.kind=csv --set data.path=" + (dir / "train.csv") +
         " --set data.test_path=" + (dir / "test.csv") + " --set optim.steps=20 "
         "--set optim.batch_size=32 --set optim.microbatches=2 --set eval.every=10 "
         "--set checkpoint.every=10 --set checkpoint.dir=" + (dir / "ck") + " " + more;
}

}  // namespace

// The quickest smoke run works: the default warmup (20) is longer than the run, so it is
// shortened to the run's length, with a warning.
TEST(Cli, ASmokeRunShortensTheWarmupWithAWarning) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(run_train("--config " + kMlp + " --device cpu --set optim.steps=10 --set checkpoint.dir=" +
                      (dir / "ck"), &log), 0) << log;
  EXPECT_TRUE(contains(log, "optim.warmup_steps = 20 is longer than the run's 10 steps: shortened to 10"))
      << log;
  EXPECT_TRUE(fs::exists(dir / "ck/step-000010.safetensors"));
  // The saved config is the one that ran.
  const Config saved = app::load_saved_model(dir / "ck").config;
  EXPECT_EQ(saved.optim.warmup_steps, 10);
}

TEST(Cli, HelpListsEveryFlagTheExitCodesAndTheFilesARunWrites) {
  std::string help;
  ASSERT_EQ(run_train("--help", &help), 0);
  for (const char* part : {"--nproc", "--print-config", "--resume", "--device", "--version",
                           "Exit codes", "0 success", "2 usage or config", "3 a non-finite",
                           "4 a data file", "metrics.jsonl", "curve.svg", "step-NNNNNN.safetensors",
                           "step-NNNNNN.optim.safetensors"})
    EXPECT_TRUE(contains(help, part)) << "--help lacks '" << part << "'";
}

// A mistyped value or key gets one line that names the fix, with the names users of other
// frameworks reach for (gpu, optimizer, learning_rate) pointed at ours, and not the whole usage.
TEST(Cli, OtherFrameworksNamesGetADidYouMeanAndNoWallOfHelp) {
  const std::string config = "--config " + std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml ";
  const std::pair<std::string, std::string> cases[] = {
      {"--device gpu", "did you mean 'cuda'?"},
      {"--set device=gpu", "did you mean 'cuda'?"},
      {"--set optimizer.lr=1", "did you mean 'optim'?"},
      {"--set optim.learning_rate=1", "did you mean 'optim.lr'?"},
  };
  for (const auto& [args, says] : cases) {
    std::string out;
    EXPECT_EQ(run_train(config + args, &out), 2) << args;
    EXPECT_TRUE(contains(out, says)) << args << ": " << out;
    EXPECT_FALSE(contains(out, "Exit codes")) << args << ": the whole usage was printed\n" << out;
  }
}

// Into a pipe an error is one line, with no blank line before it (that one is for a terminal's
// live progress line); data errors exit 4.
TEST(Cli, ADataErrorIsOneLineWithNoBlankLineBefore) {
  TempDir dir;
  std::string out;
  EXPECT_EQ(run_train("--config " + std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml --set data.noise=1e39 "
                      "--set checkpoint.dir=" + (dir / "ck"), &out), 4);
  EXPECT_TRUE(contains(out, "train: data error: the synthetic data: sample 0, feature 1 is inf")) << out;
  EXPECT_FALSE(contains(out, "\n\ntrain:")) << out;
  EXPECT_FALSE(out.starts_with("\n")) << out;
}

TEST(Cli, VersionNamesCommitBuildTypeAndCuda) {
  std::string v;
  ASSERT_EQ(run_train("--version", &v), 0);
  EXPECT_TRUE(contains(v, std::string("minitrain ") + MT_VERSION)) << v;
  for (const char* part : {"\ncommit ", "\nbuild type ", "\nCUDA "})
    EXPECT_TRUE(contains(v, part)) << v;
  // A copy of the sources without git (an unpacked archive, the mutation audit's scratch tree)
  // has no commit to name; a checkout (a .git directory, or a worktree's .git file) has one.
  if (fs::exists(fs::path(MT_SOURCE_DIR) / ".git"))
    EXPECT_FALSE(contains(v, "commit unknown\n")) << "the build has a git checkout: " << v;
}

// --print-config prints the resolved config, which reads back as exactly the same config, and
// writes nothing.
TEST(Cli, PrintConfigPrintsTheResolvedYamlAndExits) {
  TempDir dir;
  std::string yaml;
  ASSERT_EQ(run_train("--config " + kMlp + " --set 'optim={lr: 0.01}' --device cpu --set checkpoint.dir=" +
                      (dir / "ck") + " --print-config 2>/dev/null", &yaml), 0) << yaml;
  const Config expected = load_config(kMlp, {"optim={lr: 0.01}", "device=cpu", "checkpoint.dir=" + (dir / "ck")});
  EXPECT_EQ(parse_config(yaml, "printed"), expected) << yaml;
  EXPECT_EQ(expected.optim.lr, 0.01);
  EXPECT_FALSE(fs::exists(dir / "ck"));
}

// --device is named as itself in its error, and a GPU that is not there is a usage error (2).
TEST(Cli, DeviceErrorsAreUsageErrors) {
  std::string log;
  EXPECT_EQ(run_train("--config " + kMlp + " --device gpu", &log), 2);
  EXPECT_TRUE(contains(log, "--device: expected auto, cpu, cuda or cuda:N, got 'gpu'; did you mean 'cuda'?")) << log;
  EXPECT_FALSE(contains(log.substr(0, log.find('\n')), "--set")) << log;
  EXPECT_EQ(run_train("eval --checkpoint x --device gpu:1", &log), 2);
  EXPECT_TRUE(contains(log, "did you mean 'cuda:1'?")) << log;
  if (cuda_available()) GTEST_SKIP() << "a GPU is visible: --device cuda would train";
  TempDir dir;
  EXPECT_EQ(run_train("--config " + kMlp + " --device cuda --set checkpoint.dir=" + (dir / "ck"), &log), 2);
  EXPECT_TRUE(contains(log, "device: cuda:0 requested, but no CUDA device is available")) << log;
  EXPECT_FALSE(fs::exists(dir / "ck"));
}

// One table: 2 for usage and config, 4 for a data file that cannot be parsed (train and predict
// alike), each message naming the file and line.
TEST(Cli, ExitCodesFollowTheTable) {
  TempDir dir;
  dir.write("train.csv", csv_rows(200, 1, false));
  dir.write("test.csv", csv_rows(50, 2, false) + "1,2,x,4,0\n");
  std::string log;
  EXPECT_EQ(run_train(csv_run(dir), &log), 4) << log;
  EXPECT_TRUE(contains(log, "data error: " + (dir / "test.csv") + ":51:5: cell 3: expected a finite number, got 'x'"))
      << log;
  dir.write("test.csv", csv_rows(50, 2, false) + "1,2,3,4\n");  // one cell short
  EXPECT_EQ(run_train(csv_run(dir), &log), 4) << log;
  EXPECT_TRUE(contains(log, (dir / "test.csv") + ":51:8: row has 4 cells, expected 5")) << log;
  EXPECT_FALSE(fs::exists(dir / "ck"));
  EXPECT_EQ(run_train("--config " + kMlp + " --set optim.lr=fast"), 2);
  EXPECT_EQ(run_train("--nosuchflag"), 2);
  // A flag of one value given twice is a slip, not "the last one wins" (eval of two checkpoints
  // evaluated the second); --set is the one that repeats.
  const std::vector<std::string> flags_twice = {
      "--config " + kMlp + " --device cpu --device cpu", "--config " + kMlp + " --config " + kMlp,
      "eval --checkpoint a --checkpoint b", "sample --checkpoint a --tokens 3 --tokens 4"};
  for (const std::string& twice : flags_twice) {
    EXPECT_EQ(run_train(twice, &log), 2) << twice;
    EXPECT_TRUE(contains(log, " is given twice")) << twice << ": " << log;
  }

  dir.write("test.csv", csv_rows(50, 2, false));
  ASSERT_EQ(run_train(csv_run(dir), &log), 0) << log;
  dir.write("x.csv", "1,2,3,4\n5,6,x,8\n");
  EXPECT_EQ(run_train("predict --checkpoint " + (dir / "ck") + " --input " + (dir / "x.csv") +
                      " --output " + (dir / "p.csv"), &log), 4) << log;
  EXPECT_TRUE(contains(log, "x.csv:2:5: cell 3: expected a finite number")) << log;
}

// A wrong label_column names the key; the test file's width mismatch names the test file.
TEST(Cli, DataErrorsNameTheKeyAndTheFile) {
  TempDir dir;
  std::string rows;
  for (int i = 0; i < 100; ++i) rows += "0," + std::to_string(i % 3) + ".5," + std::to_string(i % 2) + "\n";
  dir.write("train.csv", rows);
  dir.write("test.csv", rows);
  std::string log;
  EXPECT_EQ(run_train(csv_run(dir, "--set model.input=2 --set data.label_column=0"), &log), 4) << log;
  EXPECT_TRUE(contains(log, "column 0, the label column (data.label_column = 0), holds only label 0")) << log;

  dir.write("train.csv", csv_rows(200, 1, false));
  std::string wide;
  for (int i = 0; i < 20; ++i) wide += "1,2,3,4,5,1\n";
  dir.write("test.csv", wide);
  EXPECT_EQ(run_train(csv_run(dir), &log), 2) << log;
  EXPECT_TRUE(contains(log, "model.input: is 4 but the csv file " + (dir / "test.csv") +
                                " has 5 features per sample")) << log;
}

// data.header: auto decides for each file: a headered training file beside a headerless test
// file loses no test row; an explicit false on a headered file is a data error naming line 1.
TEST(Cli, CsvHeadersAreDetectedForEachFile) {
  TempDir dir;
  dir.write("train.csv", csv_rows(200, 1, true));
  dir.write("test.csv", csv_rows(50, 2, false));
  std::string log;
  ASSERT_EQ(run_train(csv_run(dir), &log), 0) << log;
  EXPECT_TRUE(contains(log, "(50 samples)")) << log;  // the test line: every row
  EXPECT_TRUE(contains(log, "180 training, 20 validation samples (" + (dir / "train.csv") +
                                ", header line skipped); test: 50 samples (" + (dir / "test.csv") + ")"))
      << log;
  fs::remove_all(dir / "ck");
  EXPECT_EQ(run_train(csv_run(dir, "--set data.header=false"), &log), 4) << log;
  EXPECT_TRUE(contains(log, "train.csv:1:1: cell 1: expected a finite number, got 'a'")) << log;
  const Config c = load_config("", {"data.kind=csv", "data.path=" + (dir / "test.csv")});
  EXPECT_FALSE(data::load_dataset(c.data, c.model, false).had_header);
  const Config h = load_config("", {"data.kind=csv", "data.path=" + (dir / "train.csv")});
  EXPECT_EQ(data::load_dataset(h.data, h.model, false).size, 200);
}

TEST(Cli, TheDefaultRunLogsItsDatasetSizes) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(run_train("--config " + kMlp + " --device cpu --set optim.steps=2 --set checkpoint.dir=" +
                      (dir / "ck"), &log), 0);
  EXPECT_TRUE(contains(log, "data: synthetic 32 features, 8 classes: 18000 training, 2000 validation "
                            "samples (generated); test: 4000 samples (generated)")) << log;
}

// optim.epochs: the run's length in whole passes over the training split.
TEST(Cli, EpochsSetTheNumberOfSteps) {
  TempDir dir;
  Config c = load_config("", {"device=cpu", "data.samples=500", "optim.epochs=3", "optim.steps=7",
                              "optim.batch_size=64", "model.hidden=[8]", "eval.every=1000",
                              "checkpoint.every=1000", "checkpoint.dir=" + (dir / "ck")});
  LogCapture logs;
  app::ConfigTrainer t(c, kCPU);
  // 500 - 50 validation = 450 training samples: 7 whole batches of 64 per epoch.
  EXPECT_EQ(t.run().steps, 21);
  EXPECT_TRUE(logs.contains("optim.epochs = 3: 21 steps (7 per epoch of 450 training samples)"));
  // Whole batches per epoch, not the run's samples over the batch: 3 · floor(450 / 100) = 12
  // steps, where floor(3 · 450 / 100) would be 13 (with 64, both are 21).
  c.optim.batch_size = 100;
  c.checkpoint.dir = dir / "ck100";
  app::ConfigTrainer t100(c, kCPU);
  EXPECT_EQ(t100.run().steps, 12);
  test::expect_error([] { load_config("", {"optim.epochs=-1"}); },
                     {"optim.epochs: must be >= 0", "(from --set optim.epochs=-1)"});
}

// data.standardize: the training split's mean and std, saved with the checkpoint, and applied by
// `train eval` and `train predict` exactly as in the run: eval reproduces the run's test line.
TEST(Cli, StandardizationIsStoredAndReappliedByEvalAndPredict) {
  TempDir dir;
  dir.write("train.csv", csv_rows(300, 1, false));
  dir.write("test.csv", csv_rows(60, 2, false));
  std::string log, eval;
  ASSERT_EQ(run_train(csv_run(dir, "--set data.standardize=true"), &log), 0) << log;
  const size_t at = log.find("test: loss ");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string test_line = log.substr(at, log.find('\n', at) - at);

  const std::string model = dir / "ck/step-000020.safetensors";
  const app::SavedModel m = app::load_saved_model(model);
  ASSERT_EQ(m.standardization.mean.size(), 4u);
  // The statistics are the training split's (not the validation rows', not the test file's).
  const Config c = m.config;
  data::Dataset raw = data::load_dataset(c.data, c.model, false);
  const data::Split split = data::split_indices(raw.size, c.data.val_fraction, c.data.seed);
  const data::Standardization expected = data::standardization_of(raw, split.train);
  EXPECT_EQ(m.standardization.mean, expected.mean);
  EXPECT_EQ(m.standardization.std, expected.std);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_NEAR(expected.mean[k], 1000.0, 10.0);
    EXPECT_NEAR(expected.std[k], 50.0, 10.0);
  }
  ASSERT_EQ(run_train("eval --checkpoint " + model + " 2>/dev/null", &eval), 0);
  EXPECT_EQ(eval, test_line + "\n");

  // predict: the same probabilities as the model applied to the standardized test features.
  std::string features;
  for (const std::string& line : {std::string("1000,1010,990,1000"), std::string("1100,900,1050,950")})
    features += line + "\n";
  dir.write("x.csv", features);
  ASSERT_EQ(app::predict_csv(model, dir / "x.csv", dir / "p.csv"), 2);
  std::vector<float> x = {1000, 1010, 990, 1000, 1100, 900, 1050, 950};
  data::standardize(x, m.standardization);
  const Tensor logits = (*m.model)(from_vector(x, {2, 4}, DType::f32));
  const std::vector<double> l = logits.to_vector();
  std::ifstream p(dir / "p.csv");
  std::string row;
  std::getline(p, row);  // class,p0,p1,p2
  for (size_t r = 0; r < 2; ++r) {
    std::getline(p, row);
    std::vector<double> cells;
    std::stringstream cs(row);
    for (std::string cell; std::getline(cs, cell, ',');) cells.push_back(std::stod(cell));
    ASSERT_EQ(cells.size(), 4u) << row;
    const double* z = &l[r * 3];
    const double top = *std::max_element(z, z + 3);
    double sum = 0;
    for (size_t k = 0; k < 3; ++k) sum += std::exp(z[k] - top);
    for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(cells[1 + k], std::exp(z[k] - top) / sum, 1e-6) << row;
  }
  // A damaged statistic is refused, not applied.
  test::expect_error([] { data::standardization_from_text("{\"mean\": [1], \"std\": [0]}", "f"); },
                     {"f: the feature standardization is damaged"});
}

// Numbers keep four significant digits at any scale; durations read as a person writes them.
TEST(Progress, NumbersAndDurationsStayReadable) {
  EXPECT_EQ(train::format_value(1.234567e-5), "1.235e-05");  // fixed decimals printed 0.0000
  EXPECT_EQ(train::format_value(0.06843), "0.06843");
  EXPECT_EQ(train::format_value(2.5), "2.5");
  EXPECT_EQ(train::format_duration(4.4), "4s");
  EXPECT_EQ(train::format_duration(187), "3m07s");
  EXPECT_EQ(train::format_duration(7500), "2h05m");
  EXPECT_EQ(train::progress_line(437, 3000, 0.41234, 31234, 26, 62),
            "[##------------------]  437/3000  loss 0.4123  31.2k samples/s  26s elapsed  1m02s left");
  EXPECT_EQ(train::progress_line(3000, 3000, NAN, NAN, 90, 0),
            "[####################] 3000/3000  1m30s elapsed  0s left");
}

// Piped to a file, every step line has the elapsed time and the time left, and pairs the
// batch's loss with its accuracy; every metrics record has a timestamp and elapsed seconds.
TEST(Progress, PlainLogLinesAndMetricsRecordsCarryTheTime) {
  TempDir dir;
  std::string log;
  ASSERT_EQ(run_train("--config " + kMlp + " --device cpu --set optim.steps=20 --set logging.every=5 "
                      "--set eval.every=10 --set checkpoint.dir=" + (dir / "ck"), &log), 0) << log;
  int step_lines = 0;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (!contains(line, "| loss ")) continue;
    ++step_lines;
    EXPECT_TRUE(contains(line, " elapsed, ") && contains(line, " left")) << line;
    EXPECT_TRUE(contains(line, "| batch: loss ") && contains(line, " accuracy ")) << line;
    EXPECT_FALSE(contains(line, "\r")) << "a live-line redraw in a plain log";
  }
  EXPECT_EQ(step_lines, 4) << log;
  std::ifstream metrics(dir / "ck/metrics.jsonl");
  int records = 0;
  double last_elapsed = -1;
  for (std::string line; std::getline(metrics, line); ++records) {
    const auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("time") && j.contains("elapsed_s")) << line;
    const std::string t = j["time"];
    EXPECT_EQ(t.size(), 24u) << t;  // 2026-01-02T03:04:05.678Z
    EXPECT_EQ(t.back(), 'Z');
    EXPECT_GE(j["elapsed_s"].get<double>(), last_elapsed);
    last_elapsed = j["elapsed_s"];
    if (j.contains("loss")) EXPECT_TRUE(j.contains("batch_loss")) << line;
  }
  EXPECT_EQ(records, 4 + 2 + 1);  // 4 logged steps, 2 evaluations, the test
}

// data.test_fraction: one file gives the test set, a seeded draw of that share of its rows (in
// file order), and the training set, the rest; every caller gets the same rows, so `train eval`
// prints the run's own test line. It is refused beside data.test_path and for synthetic data.
TEST(Cli, TestFractionHoldsATestSetOutOfOneFile) {
  TempDir dir;
  dir.write("all.csv", csv_rows(250, 3, true));
  const std::vector<std::string> sets = {"data.kind=csv", "data.path=" + (dir / "all.csv"),
                                         "model.input=4", "model.classes=3"};
  auto with = [&](const std::string& more) {
    std::vector<std::string> s = sets;
    s.push_back(more);
    return load_config("", s);
  };
  const Config c = with("data.test_fraction=0.2");
  ASSERT_TRUE(data::has_test_set(c.data));
  const data::Dataset all = data::load_dataset(with("data.test_fraction=0").data, c.model, false);
  const data::Dataset train = data::load_dataset(c.data, c.model, false);
  const data::Dataset test = data::load_dataset(c.data, c.model, true);
  EXPECT_EQ(test.size, 50);
  EXPECT_EQ(train.size, 200);
  // Each row of the file is in exactly one of the two, each part in file order.
  auto rows_of = [](const data::Dataset& d) {
    std::vector<std::vector<float>> rows;
    for (int64_t r = 0; r < d.size; ++r)
      rows.emplace_back(d.features.begin() + r * d.dim, d.features.begin() + (r + 1) * d.dim);
    return rows;
  };
  const auto every = rows_of(all), held = rows_of(test), rest = rows_of(train);
  std::set<size_t> seen;
  for (const auto* part : {&held, &rest}) {
    std::vector<size_t> at;
    for (const auto& row : *part) {
      at.push_back(size_t(std::find(every.begin(), every.end(), row) - every.begin()));
      ASSERT_LT(at.back(), every.size());
    }
    EXPECT_TRUE(std::is_sorted(at.begin(), at.end()));
    seen.insert(at.begin(), at.end());
  }
  EXPECT_EQ(seen.size(), 250u);
  EXPECT_EQ(data::load_dataset(c.data, c.model, true).features, test.features);  // the same draw

  // The run's test line, and `train eval` on its checkpoint: the same rows, the same line.
  std::string log, eval;
  ASSERT_EQ(run_train("--config " + kMlp + " --device cpu --set model.input=4 --set model.classes=3 "
                      "--set model.hidden=[16] --set data.kind=csv --set data.path=" + (dir / "all.csv") +
                      " --set data.test_fraction=0.2 --set data.standardize=true --set optim.steps=20 "
                      "--set optim.batch_size=32 --set optim.microbatches=2 --set checkpoint.dir=" +
                      (dir / "ck"), &log), 0) << log;
  EXPECT_TRUE(contains(log, "180 training, 20 validation samples")) << log;
  const size_t line = log.find("test: loss");
  ASSERT_NE(line, std::string::npos) << log;
  const std::string test_line = log.substr(line, log.find('\n', line) - line);
  EXPECT_TRUE(contains(test_line, "(50 samples)")) << test_line;
  ASSERT_EQ(run_train("eval --checkpoint " + (dir / "ck"), &eval, false), 0);
  EXPECT_EQ(eval, test_line + "\n");

  test::expect_error([&] { with("data.test_fraction=1"); }, {"data.test_fraction: must be in [0, 1), got 1"});
  dir.write("t.csv", csv_rows(20, 4, false));
  test::expect_error([&] {
    load_config("", {"data.kind=csv", "data.path=" + (dir / "all.csv"), "data.test_path=" + (dir / "t.csv"),
                     "data.test_fraction=0.2"});
  }, {"data.test_fraction: data.test_path already gives the test set; set one of the two, got 0.2"});
  test::expect_error([&] { load_config("", {"data.test_fraction=0.2"}); },
                     {"data.test_fraction: data.kind synthetic has a test set of its own (a fifth of "
                      "data.samples, drawn apart), got 0.2"});
  test::expect_error([&] { data::load_dataset(with("data.test_fraction=0.001").data, c.model, true); },
                     {"data.test_fraction: 0.001 holds out none of the 250 samples of " + (dir / "all.csv")});
}

// A label outside model.classes from a CSV names the column the labels were read from, and a
// column that holds labels (whole numbers below model.classes) as the data.label_column meant.
TEST(Cli, AWrongLabelColumnGetsAHint) {
  TempDir dir;
  std::string rows;
  for (int i = 0; i < 120; ++i)  // the label first, then three features, the last of them whole
    rows += std::to_string(i % 3) + "," + std::to_string(i % 7) + ".25," +
            std::to_string(i % 5) + ".5," + std::to_string(10 + i % 4) + "\n";
  dir.write("data.csv", rows);
  const std::vector<std::string> sets = {"device=cpu", "data.kind=csv", "data.path=" + (dir / "data.csv"),
                                         "model.input=3", "model.classes=3", "optim.batch_size=16",
                                         "optim.microbatches=1", "checkpoint.dir=" + (dir / "ck")};
  test::expect_error([&] { app::ConfigTrainer t(load_config("", sets), kCPU); },
                     {"model.classes: is 3 but the csv file " + (dir / "data.csv") + " has label 10 "
                      "(sample 0); the labels are read from column 3 (data.label_column = -1, the "
                      "last); column 0 holds whole numbers 0 to 2: did you mean data.label_column=0?"});
  // No column looks like labels: the message says what model.classes would have to be.
  std::vector<std::string> more = sets;
  more.push_back("model.classes=2");
  test::expect_error([&] { app::ConfigTrainer t(load_config("", more), kCPU); },
                     {"the labels are read from column 3 (data.label_column = -1, the last): if that is "
                      "the label column, model.classes must be at least 14"});
  more.back() = "data.label_column=0";
  more.push_back("model.input=2");
  test::expect_error([&] { app::ConfigTrainer t(load_config("", more), kCPU); },
                     {"model.input: is 2 but the csv file " + (dir / "data.csv") + " has 3 features per "
                      "sample; every column but the label column, column 0 (data.label_column = 0), is a feature"});
}

namespace {

// The number after `prefix` in `text`'s last occurrence of it, as printed ("" when absent).
std::string value_after(const std::string& text, const std::string& prefix) {
  const size_t at = text.rfind(prefix);
  if (at == std::string::npos) return "";
  const size_t from = at + prefix.size();
  return text.substr(from, text.find_first_of(" |\r\n", from) - from);
}

}  // namespace

// On a terminal the live line's loss is the logging window's so far: drawn on the first step
// (always) it shows that step's loss, and drawn on the last step (always), just before the log
// line of a window of one step, the loss that line prints: never the previous line's value.
TEST(Cli, TheLiveLineShowsTheLatestLoss) {
  TempDir dir;
  const std::string out = test::run_on_terminal(
      "--config " + kMlp + " --device cpu --set data.samples=2000 --set optim.steps=4 "
      "--set logging.every=1 --set checkpoint.dir=" + (dir / "ck"));
  const std::string last_logged = value_after(out, "step 4/4 | loss ");
  const std::string before_it = value_after(out, "step 3/4 | loss ");
  ASSERT_FALSE(last_logged.empty()) << out;
  ASSERT_NE(last_logged, before_it) << out;  // otherwise the check below could not tell them apart
  EXPECT_EQ(value_after(out, "] 4/4  loss "), last_logged) << out;
  EXPECT_FALSE(value_after(out, "] 1/4  loss ").empty()) << out;
}
