// Reliability of what a run writes and reads at its edges (docs/robustness.md, "Branches, shared
// files and late checks"): a resumed branch and the later checkpoints of its run, the files a run
// writes outside its folder (a lock and an owner for each), and inputs that used to be checked
// late or wrongly (a curve path that is a folder, an evaluation batch larger than the data, a
// byte order mark, a NUL in a path, a second document in a --set value, loss scales past f16's
// reach, --resume '', a folder with metrics but no checkpoint, launcher variables, CSV
// underflow, MNIST shapes, predict's --output, a thread per rank that cannot start).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/config.h"
#include "app/config_trainer.h"
#include "app/inference.h"
#include "app/memory.h"
#include "core/device.h"
#include "data/array_source.h"
#include "data/csv.h"
#include "data/data.h"
#include "parallel/launch.h"
#include "tests/bit_flip.h"
#include "tests/expect_error.h"
#include "tests/run_train.h"
#include "tests/temp_dir.h"
#include "train/checkpoint.h"
#include "train/run_dir.h"
#include "train/trainer.h"

using namespace mt;
using mt::test::TempDir;
namespace fs = std::filesystem;

namespace {

// 24 steps of 48 samples, a checkpoint every 4 steps, all kept.
Config small_config(const TempDir& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {
      "model.input=12",       "model.hidden=[16]",       "model.classes=4",
      "data.samples=600",     "optim.steps=24",          "optim.batch_size=48",
      "optim.warmup_steps=4", "logging.every=4",         "eval.every=100",
      "checkpoint.every=4",   "checkpoint.keep_last=10", "checkpoint.dir=" + (dir / "ck"),
      "device=cpu"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<int64_t> steps_in(const std::string& dir) {
  std::vector<int64_t> out;
  for (const std::string& f : train::list_checkpoints(dir)) out.push_back(train::checkpoint_name_step(f));
  return out;
}

std::vector<int64_t> logged_steps(const std::string& metrics) {
  std::vector<int64_t> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["step"].get<int64_t>());
  }
  return out;
}

// Runs `f` in a child process under `resource` = `limit` and returns its exit code: what a
// limit would do to this test process is kept out of it.
template <class F>
int in_child_under(int resource, rlim_t limit, F f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    rlimit r{limit, limit};
    if (::setrlimit(resource, &r) != 0) ::_exit(90);
    ::_exit(f());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

// ---- a resumed branch -------------------------------------------------------------------------

// A run resumed from an older checkpoint used to save into a folder holding its own later ones:
// keep_last pruned the branch's new checkpoints against the other branch's, and the next
// --resume DIR took the other branch. Now it is refused until checkpoint.overwrite deletes them.
TEST(RunFolder, AResumedBranchIsRefusedUnlessOverwriteDeletesTheLaterCheckpoints) {
  TempDir dir;
  const std::string ck = dir / "ck";
  app::ConfigTrainer(small_config(dir), kCPU).run();
  ASSERT_EQ(steps_in(ck), (std::vector<int64_t>{4, 8, 12, 16, 20, 24}));
  const std::string metrics = read_text(ck + "/metrics.jsonl");

  app::ConfigTrainer branch(small_config(dir, {"optim.steps=14", "checkpoint.keep_last=2"}), kCPU);
  branch.resume(ck + "/step-000008.safetensors");
  test::expect_error([&] { branch.run(); },
                     {"checkpoint.dir: '" + ck + "' holds 4 later checkpoint(s) of this run, the newest "
                      "step-000024.safetensors, but this run resumes from step 8",
                      "--resume " + ck, "checkpoint.overwrite=true"});
  EXPECT_EQ(steps_in(ck), (std::vector<int64_t>{4, 8, 12, 16, 20, 24}));
  EXPECT_EQ(read_text(ck + "/metrics.jsonl"), metrics);

  app::ConfigTrainer told(small_config(dir, {"optim.steps=14", "checkpoint.keep_last=2",
                                             "checkpoint.overwrite=true"}), kCPU);
  told.resume(ck + "/step-000008.safetensors");
  EXPECT_EQ(told.run().checkpoint, ck + "/step-000014.safetensors");
  // The branch is the run now: its own checkpoints pruned to two, --resume DIR takes its newest.
  EXPECT_EQ(steps_in(ck), (std::vector<int64_t>{12, 14}));
  EXPECT_EQ(train::load_checkpoint(ck).step, 14);
  EXPECT_EQ(logged_steps(ck + "/metrics.jsonl"), (std::vector<int64_t>{4, 8, 12, 14}));

  // Resuming the newest (the folder itself) is no branch.
  app::ConfigTrainer on(small_config(dir, {"optim.steps=16"}), kCPU);
  on.resume(ck);
  EXPECT_EQ(on.run().checkpoint, ck + "/step-000016.safetensors");

  // Nor is resuming the folder past a damaged newest checkpoint (a bit of its data flipped, so
  // that its header and run id still read): --resume DIR took step 14, and the run saves over 16.
  const std::string newest = ck + "/step-000016.safetensors";
  test::flip_bit(newest, (fs::file_size(newest) - 1) * 8);
  app::ConfigTrainer past(small_config(dir, {"optim.steps=18"}), kCPU);
  past.resume(ck);
  EXPECT_EQ(train::load_checkpoint(ck + "/step-000014.safetensors").step, 14);
  EXPECT_EQ(past.run().checkpoint, ck + "/step-000018.safetensors");
  EXPECT_EQ(steps_in(ck), (std::vector<int64_t>{12, 14, 16, 18}));
}

// ---- files outside the run folder -------------------------------------------------------------

// logging.metrics and logging.curve outside checkpoint.dir were nobody's: two runs both wrote
// one metrics file, a resume rewrote whatever file it was pointed at, and the curve replaced any
// file. Each is now locked like the folder, and owned: records and curve carry the run id.
TEST(RunFolder, FilesOutsideTheFolderAreLockedAndOwnedByTheirRun) {
  TempDir dir;
  const std::string metrics = dir / "logs/shared.jsonl", curve = dir / "shared.svg";  // logs/: made by the run
  const std::vector<std::string> outside = {"logging.metrics=" + metrics, "logging.curve=" + curve};
  {
    train::RunDir other(dir / "other");
    other.lock_file("logging.metrics", metrics);
    auto sets = outside;
    sets.push_back("checkpoint.dir=" + (dir / "a"));
    app::ConfigTrainer t(small_config(dir, sets), kCPU);
    test::expect_error([&] { t.run(); }, {"logging.metrics: '" + metrics + "' is in use by another run (pid " +
                                          std::to_string(::getpid()) + ")"});
    EXPECT_FALSE(fs::exists(metrics));
  }
  // Run a writes both files; every record names it.
  auto sets_a = outside;
  sets_a.push_back("checkpoint.dir=" + (dir / "a"));
  app::ConfigTrainer(small_config(dir, sets_a), kCPU).run();
  const std::string a_metrics = read_text(metrics), a_curve = read_text(curve);
  const std::string a_id = train::checkpoint_run_id(dir / "a/step-000024.safetensors");
  EXPECT_NE(a_metrics.find("\"run_id\":\"" + a_id + "\""), std::string::npos);
  EXPECT_NE(a_curve.find("data-run-id='" + a_id + "'"), std::string::npos);

  // Run b (its own folder) is refused both of a's files, fresh or resumed.
  app::ConfigTrainer(small_config(dir, {"checkpoint.dir=" + (dir / "b"), "optim.steps=8"}), kCPU).run();
  auto sets_b = outside;
  sets_b.insert(sets_b.end(), {"checkpoint.dir=" + (dir / "b"), "optim.steps=12"});
  {
    auto just_metrics = sets_b;
    just_metrics[1] = "logging.curve=\"\"";
    app::ConfigTrainer b(small_config(dir, just_metrics), kCPU);
    b.resume(dir / "b");
    test::expect_error([&] { b.run(); }, {"logging.metrics: line 1 of '" + metrics + "' is not a record of this run (run_id " + a_id});
  }
  {
    auto just_curve = sets_b;
    just_curve[0] = "logging.metrics=\"\"";
    app::ConfigTrainer b(small_config(dir, just_curve), kCPU);
    b.resume(dir / "b");
    test::expect_error([&] { b.run(); }, {"the curve " + curve + " (not this run's)"});
  }
  {
    auto fresh = outside;
    fresh.push_back("checkpoint.dir=" + (dir / "c"));
    app::ConfigTrainer c(small_config(dir, fresh), kCPU);
    test::expect_error([&] { c.run(); }, {"the metrics " + metrics, "the curve " + curve});
  }
  EXPECT_EQ(read_text(metrics), a_metrics);
  EXPECT_EQ(read_text(curve), a_curve);

  // A notes file named as the metrics of a resumed run keeps its lines.
  const std::string notes = dir / "notes.txt";
  std::ofstream(notes) << "remember the milk\nand the eggs\n";
  {
    app::ConfigTrainer b(small_config(dir, {"checkpoint.dir=" + (dir / "b"), "optim.steps=12",
                                            "logging.metrics=" + notes}), kCPU);
    b.resume(dir / "b");
    test::expect_error([&] { b.run(); }, {"line 1 of '" + notes + "' is not a record of this run (not a metrics record)"});
  }
  EXPECT_EQ(read_text(notes), "remember the milk\nand the eggs\n");
}

// ---- checked late or wrongly ------------------------------------------------------------------

// logging.curve naming a folder used to fail only when the curve was drawn, after training.
TEST(LateChecks, ACurveOrMetricsPathThatIsAFolderIsRefusedBeforeTraining) {
  TempDir dir;
  fs::create_directories(dir / "plots");
  test::expect_error([&] { app::ConfigTrainer t(small_config(dir, {"logging.curve=" + (dir / "plots")}), kCPU); },
                     {"logging.curve: '" + (dir / "plots") + "' is a directory"});
  test::expect_error([&] { app::ConfigTrainer t(small_config(dir, {"logging.metrics=" + (dir / "plots")}), kCPU); },
                     {"logging.metrics: '" + (dir / "plots") + "' is a directory"});
  fs::create_directories(dir / "ck/curve.svg");  // the default curve path
  test::expect_error([&] { app::ConfigTrainer t(small_config(dir), kCPU); },
                     {"logging.curve: '" + (dir / "ck/curve.svg") + "' is a directory"});
}

// The metrics and the curve at one path, or either named as one of checkpoint.dir's own files,
// used to train to the end with exit 0, leaving no metrics (or a checkpoint replaced).
TEST(LateChecks, OutputsThatWouldWriteOverEachOtherAreRefusedBeforeTraining) {
  TempDir dir;
  const std::string ck = dir / "ck";  // small_config's checkpoint.dir
  auto refused = [&](const std::string& set, const std::string& words) {
    test::expect_error([&] { app::ConfigTrainer t(small_config(dir, {set}), kCPU); }, {words});
  };
  refused("logging.metrics=" + ck + "/curve.svg", "logging.metrics and logging.curve: both are");
  refused("logging.curve=" + ck + "/../ck/metrics.jsonl", "logging.metrics and logging.curve: both are");
  refused("logging.metrics=" + ck + "/step-000010.safetensors",
          "logging.metrics: '" + ck + "/step-000010.safetensors' is a name of the files a run keeps");
  // Another run's checkpoint or a config, anywhere (a refused run also left a lock beside it).
  refused("logging.metrics=" + (dir / "other/step-000020.safetensors"), "is a name of the files");
  refused("logging.curve=" + (dir / "mlp.yaml"), "is a name of the files");
  EXPECT_FALSE(fs::exists(dir / "other"));
  // Nor a file the run reads: checkpoint.overwrite=true deleted the training data.
  const std::string data = dir / "train.csv";
  std::ofstream(data) << "1,2,3,4,5,6,7,8,9,10,11,12,0\n";
  for (const char* key : {"logging.metrics=", "logging.curve="})
    test::expect_error(
        [&] {
          app::ConfigTrainer t(small_config(dir, {"data.kind=csv", "data.path=" + data,
                                                  key + data, "checkpoint.overwrite=true"}),
                               kCPU);
        },
        {"'" + data + "' is data.path, which the run reads"});
  EXPECT_EQ(read_text(data), "1,2,3,4,5,6,7,8,9,10,11,12,0\n");
  refused("logging.curve=" + ck + "/.lock", "logging.curve: '" + ck + "/.lock' is a name");
  EXPECT_FALSE(fs::exists(ck));
  app::ConfigTrainer beside(small_config(dir, {"logging.metrics=" + (dir / "m.jsonl"),
                                               "logging.curve=" + (dir / "c.svg")}), kCPU);
}

// A valid eval.batch_size of 2^31 was priced as a batch of 2^31 rows; a batch holds at most the
// held-out set. And the host's memory is the smaller of the physical memory and ulimit -v.
TEST(LateChecks, TheMemoryCheckCapsEvaluationBatchesAndHonoursTheAddressSpaceLimit) {
  TempDir dir;
  const Config big_eval = small_config(dir, {"eval.batch_size=2147483648", "model.hidden=[1024]"});
  const app::MemoryEstimate e = app::estimate_memory(big_eval);
  EXPECT_LE(e.activations, 120.0 * 1024 * 4);  // the 120 test samples, 1024 wide, f32
  EXPECT_NO_THROW(app::check_memory(big_eval, kCPU));
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "an address-space limit and AddressSanitizer do not mix";
#endif
  // 16 ranks of a model of 8192² parameters with AdamW: about 16 GiB, under a 4 GiB limit.
  const Config wide = small_config(dir, {"model.input=8192", "model.hidden=[8192]"});
  ASSERT_LT(16 * app::estimate_memory(wide, 16).state, app::physical_memory_bytes()) << "a host this small is not tested";
  const int code = in_child_under(RLIMIT_AS, rlim_t(4) << 30, [&] {
    try {
      app::check_memory(wide, kCPU, 16);
      return 0;
    } catch (const ConfigError& e) {
      return std::string(e.what()).find("of address space (ulimit -v)") != std::string::npos ? 2 : 3;
    }
  });
  EXPECT_EQ(code, 2);
}

// --nproc priced every model as an MLP of model.input, model.hidden and model.classes: a GPT whose
// config still held an MLP's huge hidden widths was refused.
TEST(LateChecks, TheNprocMemoryCheckIsTheModelKindsOwn) {
  const Config gpt = parse_config("model: {kind: gpt, n_layer: 1, n_head: 2, n_embd: 16, "
                                  "block_size: 16, hidden: [16777216, 16777216]}\n"
                                  "data: {kind: text, path: " MT_SOURCE_DIR "/assets/tinyshakespeare.txt}\n"
                                  "optim: {batch_size: 8, microbatches: 1}\n", "gpt.yaml", {});
  EXPECT_NO_THROW(app::check_job_fits(gpt, kCPU, 2));
  TempDir dir;
  const Config mlp = small_config(dir, {"model.hidden=[16777216, 16777216]"});
  test::expect_error([&] { app::check_job_fits(mlp, kCPU, 2); }, {"needs at least"});
}

// A GPT is priced by a lower bound of its own (app/models/gpt.cpp). One too large for any host
// used to be killed by the system mid-allocation (exit 137, no message); GPT-2 124M at B = 64 ×
// 1024 in bf16 must be priced under the 32.14 GiB it peaked at on an H200 (docs/perf.md).
TEST(LateChecks, AGptIsPricedByALowerBoundOfItsOwn) {
  const std::string text =
      "data: {kind: text, path: " MT_SOURCE_DIR "/assets/tinyshakespeare.txt}\n";
  const std::string wide = "model: {kind: gpt, n_layer: 48, n_head: 16, n_embd: 16384}\n";
  const Config huge = parse_config(wide + text, "huge.yaml", {});
  test::expect_error([&] { app::check_job_fits(huge, kCPU, 1); },
                     {"needs at least", "make model.n_layer, model.n_embd"});
  TempDir dir;
  test::expect_error([&] {
    app::ConfigTrainer t(
        parse_config(wide + text + "checkpoint: {dir: " + (dir / "ck") + "}\n", "huge.yaml", {}),
        kCPU);
  }, {"needs at least", "on cpu"});
  EXPECT_FALSE(std::filesystem::exists(dir / "ck"));
  const Config gpt2 = parse_config("model: {kind: gpt, n_layer: 12, n_head: 12, n_embd: 768, "
                                   "block_size: 1024, vocab_size: 50257}\n" + text +
                                   "optim: {batch_size: 64, microbatches: 1}\n"
                                   "precision: {compute_dtype: bf16}\neval: {batch_size: 64}\n",
                                   "gpt2.yaml", {});
  const app::MemoryEstimate e = app::estimate_gpt_memory(gpt2);
  const double gib = 1024.0 * 1024 * 1024;
  EXPECT_LT(e.state + e.activations, 32.14 * gib);
  EXPECT_GT(e.state + e.activations, 16 * gib);
  // A rank holds its share of AdamW's moments under ZeRO-1 (8 bytes a weight over 8 ranks), and
  // an evaluation batch of 256 windows holds more logits than a training microbatch of 64.
  Config sharded = gpt2, wide_eval = gpt2;
  sharded.optim.shard_state = true;
  const double matrices = (50304.0 + 1024) * 768 + 12 * 12 * 768.0 * 768;  // wte, wpe, 12 C²s
  EXPECT_NEAR(app::estimate_gpt_memory(gpt2, 8).state - app::estimate_gpt_memory(sharded, 8).state,
              matrices * 8 * 7 / 8, 1.0);
  wide_eval.eval.batch_size = 256;
  EXPECT_DOUBLE_EQ(app::estimate_gpt_memory(wide_eval).activations, 256.0 * 1024 * 50304 * 2);
}

TEST(LateChecks, ConfigTextByteOrderMarkNulAndASecondDocumentInASet) {
  // A byte order mark glued itself to the first key.
  EXPECT_EQ(parse_config("\xef\xbb\xbfseed: 5\n", "bom.yaml", {}).seed, 5u);
  // "ck\0pt" named the folder ck.
  test::expect_error([] { parse_config("checkpoint:\n  dir: \"ck\\0pt\"\n", "nul.yaml", {}); },
                     {"checkpoint.dir", "holds a NUL byte at offset 2"});
  test::expect_error([] { load_config("", {"logging.metrics=\"m\\0.jsonl\""}); }, {"logging.metrics", "NUL byte"});
  // The first of two documents was taken silently.
  test::expect_error([] { load_config("", {"seed=1\n---\n2"}); },
                     {"--set seed=1\n---\n2: the value holds a second YAML document (line 2)"});
  EXPECT_EQ(load_config("", {"seed=7"}).seed, 7u);
}

// A scale of 1e300 skipped every step (dynamic: halving through ~980 of them) and exited 0.
TEST(LateChecks, LossScalesBeyondF16sReachAreRefused) {
  test::expect_error([] { load_config("", {"precision.loss_scale=1e300"}); },
                     {"precision.loss_scale", "at most 2^40", "1e300"});
  test::expect_error([] { load_config("", {"precision.initial_scale=1e300"}); },
                     {"precision.initial_scale", "at most 2^40"});
  EXPECT_EQ(load_config("", {"precision.loss_scale=1099511627776"}).precision.fixed_loss_scale, 1099511627776.0);
  EXPECT_EQ(load_config("", {"precision.initial_scale=1099511627776"}).precision.initial_scale, 1099511627776.0);
  test::expect_error([] { load_config("", {"precision.initial_scale=1099511627777"}); }, {"at most 2^40"});
}

// A CSV cell too small for a float (1e-50) was "out of range"; it rounds to 0 as strtof gives it.
TEST(LateChecks, CsvCellsBelowFloatRangeRoundToZeroAndAboveItAreErrors) {
  TempDir dir;
  std::ofstream(dir / "tiny.csv") << "1e-50,-1e-50,1e-40,0\n2,3,4,1\n";
  const CsvData c = read_csv(dir / "tiny.csv", -1, false);
  ASSERT_EQ(c.features.size(), 6u);
  EXPECT_EQ(c.features[0], 0.0f);
  EXPECT_EQ(c.features[1], 0.0f);
  EXPECT_TRUE(std::signbit(c.features[1]));
  EXPECT_FLOAT_EQ(c.features[2], 1e-40f);  // a subnormal
  std::ofstream(dir / "huge.csv") << "1e39,0\n";
  test::expect_error([&] { read_csv(dir / "huge.csv", -1, false); }, {"'1e39' is out of range for a 32-bit float"});
}

// 14×56 test images were taken against 28×28 training images: 784 features either way.
TEST(LateChecks, TestImagesOfAnotherShapeThanTheTrainingImagesAreADataError) {
  auto images = [](int64_t rows, int64_t cols) {
    data::Dataset d;
    d.name = "mnist";
    d.size = 64;
    d.dim = rows * cols;
    d.classes = 10;
    d.sample_shape = {rows, cols};
    d.features.assign(size_t(d.size * d.dim), 0.5f);
    for (int64_t i = 0; i < d.size; ++i) d.labels.push_back(i % 10);
    return d;
  };
  data::ArrayOptions o;
  o.batch_size = 16;
  EXPECT_NO_THROW(data::ArraySource(images(28, 28), images(28, 28), o));
  try {
    data::ArraySource s(images(28, 28), images(14, 56), o);
    ADD_FAILURE() << "expected a DataError";
  } catch (const data::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("has samples of 14×56 pixels, the training set (generated) of 28×28 pixels"),
              std::string::npos) << e.what();
  }
}

// predict --output used to replace a symlink (not its target) or a FIFO by a rename, and its own
// input or the model file it read, with exit code 0.
TEST(LateChecks, PredictOutputMustBeANewOrRegularFile) {
  TempDir dir;
  app::ConfigTrainer(small_config(dir, {"optim.steps=4"}), kCPU).run();
  std::string row;
  for (int i = 0; i < 12; ++i) row += (i ? "," : "") + std::to_string(0.1 * i);
  std::ofstream(dir / "in.csv") << row << "\n";
  const std::string model = dir / "ck/step-000004.safetensors";
  std::ofstream(dir / "target.csv") << "keep me\n";
  fs::create_symlink(dir / "target.csv", dir / "link.csv");
  ASSERT_EQ(::mkfifo((dir / "pipe.csv").c_str(), 0600), 0);
  test::expect_error([&] { app::predict_csv(model, dir / "in.csv", dir / "link.csv", {}); },
                     {"--output " + (dir / "link.csv") + " is a symbolic link"});
  test::expect_error([&] { app::predict_csv(model, dir / "in.csv", dir / "pipe.csv", {}); },
                     {"--output " + (dir / "pipe.csv") + " is a FIFO"});
  EXPECT_TRUE(fs::is_symlink(dir / "link.csv"));
  EXPECT_EQ(read_text(dir / "target.csv"), "keep me\n");
  const std::string model_bytes = read_text(model);
  test::expect_error([&] { app::predict_csv(model, dir / "in.csv", dir / "in.csv", {}); },
                     {"--output " + (dir / "in.csv") + " is " + (dir / "in.csv") + ", which this command reads"});
  test::expect_error([&] { app::predict_csv(dir / "ck", dir / "in.csv", model, {}); },
                     {"--output " + model + " exists, and a .safetensors file is one a training"});
  const std::string renamed = dir / "model.st";  // a model file under a name of the user's
  fs::copy_file(model, renamed);
  test::expect_error([&] { app::predict_csv(renamed, dir / "in.csv", renamed, {}); },
                     {"--output " + renamed + " is " + renamed + ", which this command reads"});
  EXPECT_EQ(read_text(renamed), model_bytes);
  EXPECT_EQ(read_text(dir / "in.csv"), row + "\n");
  EXPECT_EQ(read_text(model), model_bytes);
  EXPECT_EQ(app::predict_csv(model, dir / "in.csv", dir / "out.csv", {}), 1);
}

// The launcher's variables are the job's configuration: a bad one is exit code 2, like a bad
// config, not 1.
TEST(LateChecks, DistributedEnvironmentErrorsAreConfigErrors) {
  const std::vector<std::pair<const char*, const char*>> env = {{"RANK", "1x"}, {"WORLD_SIZE", "2"}};
  auto lookup = [&](const char* name) -> const char* {
    for (const auto& [k, v] : env)
      if (std::string(k) == name) return v;
    return nullptr;
  };
  EXPECT_THROW(parallel::world_from_env(lookup), ConfigError);
  TempDir dir;
  std::string out;
  const std::string train = std::string(MT_BINARY_DIR) + "/train --config " + MT_SOURCE_DIR +
                            "/configs/mlp.yaml --device cpu --set checkpoint.dir=" + (dir / "ck") + " 2>&1";
  EXPECT_EQ(test::run_shell("RANK=1x WORLD_SIZE=2 timeout 60 " + train, &out), 2) << out;
  EXPECT_NE(out.find("RANK='1x' is not an integer"), std::string::npos) << out;
  EXPECT_EQ(test::run_shell("RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MT_DIST_SECRET=short timeout 60 " + train, &out), 2) << out;
  EXPECT_NE(out.find("MT_DIST_SECRET"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "ck"));
}

// --resume '' (a variable that expanded to nothing) started a fresh run.
TEST(LateChecks, AnEmptyResumeIsAUsageError) {
  TempDir dir;
  std::string out;
  EXPECT_EQ(test::run_train_within(60, "--config " + std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml --device cpu "
                                   "--set checkpoint.dir=" + (dir / "ck") + " --resume ''", &out), 2) << out;
  EXPECT_NE(out.find("--resume needs a checkpoint file or folder, got ''"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "ck"));
}

// A run stopped before its first save leaves metrics and no checkpoint: the refusal used to
// suggest --resume, which then found nothing. It now says so, and overwrite starts afresh.
TEST(LateChecks, MetricsWithoutACheckpointPointToOverwriteNotResume) {
  TempDir dir;
  fs::create_directories(dir / "ck");
  std::ofstream(dir / "ck/metrics.jsonl") << "{\"step\":1,\"loss\":1.5}\n";
  app::ConfigTrainer fresh(small_config(dir, {"optim.steps=4"}), kCPU);
  try {
    fresh.run();
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("there is no checkpoint to resume from"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checkpoint.overwrite=true"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("--resume"), std::string::npos) << msg;
  }
  app::ConfigTrainer over(small_config(dir, {"optim.steps=4", "checkpoint.overwrite=true"}), kCPU);
  EXPECT_EQ(over.run().checkpoint, dir / "ck/step-000004.safetensors");
}

// train --nproc 30 as threads (a build without Gloo) under `ulimit -n 80` ended in "terminate
// called without an active exception": a rank's thread that cannot start threw out of the loop
// that started them, past the joinable threads already running. Both cases run in a child
// process: 30 ranks under the audit's open-file limit, and 30 ranks under an address-space limit
// that leaves room for only a few 8 MiB thread stacks (this works for root too, whom the
// process limit does not bind). Each must end (not hang, not abort) with an error or success.
TEST(LateChecks, ARankThreadThatCannotStartIsAnErrorNotATerminate) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "an address-space limit and AddressSanitizer do not mix";
#endif
  TempDir dir;
  const Config cfg = small_config(dir, {"optim.batch_size=240", "optim.microbatches=1",
                                        "data.samples=1500", "optim.steps=2"});
  auto job = [&] {
    try {
      app::run_local_ranks(cfg, 30);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "run_local_ranks: %s\n", e.what());
      return std::string(e.what()).find("cannot start its thread") != std::string::npos ? 2 : 3;
    }
  };
  // The audit's command: train --nproc 30 with configs/mlp.yaml, under ulimit -n 80.
  const Config mlp = load_config(std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml",
                                 {"device=cpu", "optim.steps=2", "data.samples=4000", "checkpoint.dir=" + (dir / "mlp")});
  const int nofile = in_child_under(RLIMIT_NOFILE, 80, [&] {
    try {
      app::run_local_ranks(mlp, 30);
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "run_local_ranks under ulimit -n 80: %s\n", e.what());
      return 3;
    }
  });
  EXPECT_TRUE(nofile == 0 || nofile == 3) << "exit " << nofile;
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  const rlim_t headroom = rlim_t(pages) * rlim_t(::sysconf(_SC_PAGESIZE)) + (rlim_t(48) << 20);
  EXPECT_EQ(in_child_under(RLIMIT_AS, headroom, job), 2);
}
