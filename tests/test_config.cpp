// The trainer's config: defaults, overrides, the to_yaml round trip, and a table of bad configs,
// each with the message it must produce (key path, what is wrong, and where it came from).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "app/config.h"
#include "tests/expect_error.h"
#include "tests/temp_dir.h"

namespace fs = std::filesystem;
using namespace mt;
using mt::test::TempDir;

namespace {

// The message of the ConfigError that loading throws, with `dir`'s path cut out of it so that the
// expected messages can say "mlp.yaml:2:7".
std::string config_error(const std::string& path, const std::vector<std::string>& overrides,
                         const fs::path& dir = {}) {
  try {
    load_config(path, overrides);
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    const std::string prefix = dir.string() + "/";
    for (size_t at; !dir.empty() && (at = msg.find(prefix)) != std::string::npos;)
      msg.erase(at, prefix.size());
    return msg;
  }
  return "(no error)";
}

TEST(Config, DefaultsNeedNoFile) {
  const Config c = load_config("");
  EXPECT_EQ(c, Config{});
  EXPECT_EQ(c.seed, 0u);
  EXPECT_EQ(c.device, "auto");
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(c.model.norm, "rms_norm");
  EXPECT_EQ(c.data.kind, "synthetic");
  EXPECT_EQ(c.data.label_column, -1);
  EXPECT_EQ(c.optim.lr, 0.003);
  EXPECT_EQ(c.optim.betas, (std::array<double, 2>{0.9, 0.999}));
  EXPECT_EQ(c.optim.eps, 1e-8);
  EXPECT_EQ(c.optim.microbatches, 4);
  EXPECT_EQ(c.precision.compute_dtype, DType::f32);
  EXPECT_EQ(c.precision.loss_scale, "dynamic");
  EXPECT_EQ(c.checkpoint.keep_last, 2);
  EXPECT_FALSE(c.cuda_graph);
  EXPECT_EQ(train::metrics_path(app::options_from(c)), "runs/mlp/metrics.jsonl");
  EXPECT_EQ(train::curve_path(app::options_from(c)), "runs/mlp/curve.svg");

  TempDir dir;
  EXPECT_EQ(load_config(dir.write("empty.yaml", "")), Config{});
  EXPECT_EQ(load_config(dir.write("comment.yaml", "# nothing set\n")), Config{});
  EXPECT_EQ(load_config(dir.write("sections.yaml", "model:\noptim: {}\n")), Config{});
}

TEST(Config, ReadsEveryKey) {
  TempDir dir;
  const std::string csv = dir.write("train.csv", "1,2,0\n");
  const std::string path = dir.write("full.yaml", R"(seed: 7
device: cuda:1
model: {input: 4, hidden: [16], classes: 3, norm: none, activation: relu, bias: false}
data:
  kind: csv
  samples: 10
  noise: 0.5
  path: )" + csv + R"(
  test_path: ""
  label_column: 0
  header: true
  val_fraction: 0.25
  shuffle: false
  seed: 9
optim:
  name: sgd
  lr: 1.0e-2
  weight_decay: 0
  betas: [0.5, 0.75]
  eps: 1e-6
  momentum: 0.8
  nesterov: true
  schedule: constant
  warmup_steps: 0
  min_lr: 0.001
  steps: 50
  batch_size: 32
  microbatches: 3
  clip_norm: 0
precision: {compute_dtype: bf16, deterministic: false, gemm_autotune: true, loss_scale: 128,
            initial_scale: 1024, growth_interval: 10}
eval: {every: 5, batch_size: 64}
checkpoint: {dir: out, every: 10, keep_last: 1}
logging: {every: 1, metrics: m.jsonl, curve: c.svg}
cuda_graph: true
)");
  const Config c = load_config(path);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.device, "cuda:1");
  EXPECT_EQ(c.model.input, 4);
  EXPECT_EQ(c.model.hidden, std::vector<int64_t>{16});
  EXPECT_EQ(c.model.classes, 3);
  EXPECT_EQ(c.model.norm, "none");
  EXPECT_EQ(c.model.activation, "relu");
  EXPECT_FALSE(c.model.bias);
  EXPECT_EQ(c.data.kind, "csv");
  EXPECT_EQ(c.data.path, csv);
  EXPECT_EQ(c.data.label_column, 0);
  EXPECT_EQ(c.data.header, "true");
  EXPECT_EQ(c.data.val_fraction, 0.25);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.data.seed, 9u);
  EXPECT_EQ(c.optim.name, "sgd");
  EXPECT_EQ(c.optim.lr, 0.01);
  EXPECT_EQ(c.optim.betas, (std::array<double, 2>{0.5, 0.75}));
  EXPECT_EQ(c.optim.eps, 1e-6);
  EXPECT_TRUE(c.optim.nesterov);
  EXPECT_EQ(c.optim.schedule, "constant");
  EXPECT_EQ(c.optim.microbatches, 3);
  EXPECT_EQ(c.optim.clip_norm, 0.0);
  EXPECT_EQ(c.precision.compute_dtype, DType::bf16);
  EXPECT_FALSE(c.precision.deterministic);
  EXPECT_TRUE(c.precision.gemm_autotune);
  EXPECT_EQ(c.precision.loss_scale, "fixed");
  EXPECT_EQ(c.precision.fixed_loss_scale, 128.0);
  EXPECT_EQ(c.precision.initial_scale, 1024.0);
  EXPECT_EQ(c.precision.growth_interval, 10);
  EXPECT_EQ(c.eval.every, 5);
  EXPECT_EQ(c.checkpoint.dir, "out");
  EXPECT_EQ(c.logging.metrics, "m.jsonl");
  EXPECT_EQ(train::metrics_path(app::options_from(c)), "m.jsonl");
  EXPECT_EQ(train::curve_path(app::options_from(c)), "c.svg");
  EXPECT_TRUE(c.cuda_graph);
}

TEST(Config, OverridesApplyInOrderOnTopOfTheFile) {
  TempDir dir;
  const std::string path =
      dir.write("mlp.yaml", "optim:\n  lr: 0.1\n  steps: 1000\nmodel:\n  classes: 4\n");
  const Config c = load_config(
      path, {"optim.lr=1e-3", "model.hidden=[64,64]", "model.hidden=[32]",
             "precision.loss_scale=none", "eval={every: 7}", "seed=3", "checkpoint.dir=runs/a=b"});
  EXPECT_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.optim.steps, 1000);  // from the file, untouched
  EXPECT_EQ(c.model.classes, 4);
  EXPECT_EQ(c.model.hidden, std::vector<int64_t>{32});  // the last one wins
  EXPECT_EQ(c.precision.loss_scale, "none");
  EXPECT_EQ(c.eval.every, 7);
  EXPECT_EQ(c.eval.batch_size, 1024);  // a section set whole: the keys it leaves out keep defaults
  EXPECT_EQ(c.seed, 3u);
  EXPECT_EQ(c.checkpoint.dir, "runs/a=b");  // only the first '=' separates key and value

  const Config d = load_config("", {"model.hidden=[]", "precision.loss_scale=65536"});
  EXPECT_TRUE(d.model.hidden.empty());
  EXPECT_EQ(d.precision.loss_scale, "fixed");
  EXPECT_EQ(d.precision.fixed_loss_scale, 65536.0);
}

// A mapping given for a section merges into it, key by key and level by level (as in Hydra and
// OmegaConf): the file's other keys stay. A list or a scalar replaces.
TEST(Config, ASectionOverrideMergesIntoTheSection) {
  TempDir dir;
  const std::string path = dir.write(
      "mlp.yaml", "optim:\n  lr: 0.1\n  steps: 1000\n  betas: [0.8, 0.9]\nmodel:\n  classes: 4\n");
  const Config c = load_config(path, {"optim={lr: 0.01, betas: [0.5, 0.6]}", "model={hidden: [8]}",
                                      "eval={}"});
  EXPECT_EQ(c.optim.lr, 0.01);
  EXPECT_EQ(c.optim.steps, 1000);  // the file's, kept
  EXPECT_EQ(c.optim.betas, (std::array<double, 2>{0.5, 0.6}));  // a list replaces
  EXPECT_EQ(c.model.classes, 4);
  EXPECT_EQ(c.model.hidden, std::vector<int64_t>{8});
  // Messages name where each value came from: the --set for what it gave, the file for the rest.
  test::expect_error([&] { load_config(path, {"optim={lr: fast}"}); },
                     {"optim.lr: expected a number, got 'fast' (from --set optim={lr: fast})"});
  const std::string bad = dir.write("bad.yaml", "optim:\n  steps: -1\n");
  test::expect_error([&] { load_config(bad, {"optim={lr: 0.01}"}); },
                     {"optim.steps: must be at least 1, got -1 at " + bad + ":2:10"});
  test::expect_error([&] { load_config(path, {"optim={lrr: 0.01}"}); },
                     {"optim.lrr: unknown key (from --set optim={lrr: 0.01}); did you mean 'optim.lr'?"});
}

TEST(Config, ToYamlRoundTrips) {
  Config c;
  c.seed = 18446744073709551615u;
  c.device = "cuda:3";
  c.model.hidden = {};
  c.model.norm = "none";
  c.data.noise = 0.1 + 0.2;  // not the shortest decimal: needs all 17 digits
  c.data.path = "odd \"name\"\\ with: colons, # hash\nnewline\ttab λ";
  c.data.label_column = 2;
  c.optim.lr = 1e-300;
  c.optim.eps = 3.0000000000000004e-8;
  c.optim.betas = {0.0, 0.9999999999999999};
  c.optim.min_lr = 1e-301;
  c.precision.compute_dtype = DType::f16;
  c.precision.loss_scale = "fixed";
  c.precision.fixed_loss_scale = 1.5;
  c.precision.initial_scale = 1099511627776.0;  // 2^40, the largest
  c.logging.metrics = "";
  c.logging.curve = "true";  // a string that looks like a bool
  c.checkpoint.dir = "123";  // and one that looks like a number
  c.cuda_graph = true;

  for (const Config& original : {Config{}, c}) {
    const std::string yaml = to_yaml(original);
    SCOPED_TRACE(yaml);
    EXPECT_EQ(parse_config(yaml, "saved"), original);
    TempDir dir;
    EXPECT_EQ(load_config(dir.write("saved.yaml", yaml)), original);
  }
}

struct BadConfig {
  std::string yaml;
  std::vector<std::string> overrides;
  std::string expected;  // a substring of the message
};

// Each case's file (as mlp.yaml) and overrides must fail with its message.
void expect_bad_configs(const std::vector<BadConfig>& cases) {
  TempDir dir;
  for (const BadConfig& c : cases) {
    SCOPED_TRACE(c.yaml);
    const std::string msg = config_error(dir.write("mlp.yaml", c.yaml), c.overrides, dir.path);
    EXPECT_NE(msg.find(c.expected), std::string::npos)
        << "expected an error containing \"" << c.expected << "\", got: " << msg;
  }
}

TEST(Config, BadConfigsNameTheKeyAndThePlace) {
  const std::vector<BadConfig> cases = {
      // wrong types
      {"optim:\n  lr: fast\n", {}, "optim.lr: expected a number, got 'fast' at mlp.yaml:2:7"},
      {"optim:\n  steps: 1.5\n",
       {},
       "optim.steps: expected an integer, got '1.5' at mlp.yaml:2:10"},
      {"seed: -1\n", {}, "seed: expected a non-negative integer, got '-1' at mlp.yaml:1:7"},
      {"model:\n  kind: transformer\n",
       {},
       "model.kind: expected one of gpt, mlp, got 'transformer' at mlp.yaml:2:9"},
      {"model:\n  bias: maybe\n",
       {},
       "model.bias: expected true or false, got 'maybe' at mlp.yaml:2:9"},
      {"model:\n  hidden: 64\n",
       {},
       "model.hidden: expected a list of integers, got '64' at mlp.yaml:2:11"},
      {"model:\n  hidden: [64, x]\n",
       {},
       "model.hidden[1]: expected an integer, got 'x' at mlp.yaml:2:16"},
      {"optim:\n  betas: [0.9]\n",
       {},
       "optim.betas: expected a list of 2 numbers, got a list at mlp.yaml:2:10"},
      {"optim:\n  lr:\n  steps: 3\n",
       {},
       "optim.lr: expected a number, got an empty value at mlp.yaml:2:3"},
      {"optim:\n  lr: .inf\n", {}, "optim.lr: expected a number, got '.inf'"},
      {"model: 5\n", {}, "model: expected a mapping of keys, got '5' at mlp.yaml:1:8"},
      {"- seed\n", {}, "mlp.yaml: the config must be a mapping of keys, got a list"},
      // unknown and repeated keys
      {"optim:\n  lrr: 0.1\n",
       {},
       "optim.lrr: unknown key at mlp.yaml:2:3; did you mean 'optim.lr'?"},
      {"optm:\n  lr: 0.1\n", {}, "optm: unknown key at mlp.yaml:1:1; did you mean 'optim'?"},
      {"model:\n  widths: [8]\n", {}, "model.widths: unknown key at mlp.yaml:2:3"},
      {"seed: 1\nseed: 2\n", {}, "seed: duplicate key at mlp.yaml:2:1"},
      {"? [a]\n: 1\n", {}, "top level: keys must be plain names, got a list at mlp.yaml:1:3"},
      // a typo is reported as such, not as the conflict its default then causes
      {"optim:\n  batch_size: 2\n  microbatchs: 2\n",
       {},
       "optim.microbatchs: unknown key at mlp.yaml:3:3; did you mean 'optim.microbatches'?"},
      // impossible values
      {"optim:\n  batch_size: 8\n  microbatches: 16\n",
       {},
       "optim.microbatches: must not exceed optim.batch_size = 8, got 16 at mlp.yaml:3:17"},
      {"optim:\n  batch_size: 2\n",
       {},
       "optim.microbatches: must not exceed optim.batch_size = 2, got 4 (the default)"},
      {"optim:\n  microbatches: 0\n",
       {},
       "optim.microbatches: must be at least 1, got 0 at mlp.yaml:2:17"},
      {"optim:\n  batch_size: -1\n",
       {},
       "optim.batch_size: must be at least 1, got -1 at mlp.yaml:2:15"},
      {"optim:\n  lr: 0\n", {}, "optim.lr: must be > 0, got 0 at mlp.yaml:2:7"},
      {"optim:\n  lr: -1e-3\n", {}, "optim.lr: must be > 0, got -0.001 at mlp.yaml:2:7"},
      {"optim:\n  betas: [0.9, 1.0]\n",
       {},
       "optim.betas[1]: must be in [0, 1), got 1 at mlp.yaml:2:16"},
      {"optim:\n  eps: 0\n", {}, "optim.eps: must be > 0, got 0"},
      {"optim:\n  min_lr: 0.1\n",
       {},
       "optim.min_lr: must not exceed optim.lr = 0.003, got 0.1 at mlp.yaml:2:11"},
      {"optim: {name: sgd, momentum: 0, nesterov: true}\n",
       {},
       "optim.nesterov: needs optim.momentum > 0 at mlp.yaml:1:43"},
      {"optim:\n  name: lamb\n",
       {},
       "optim.name: expected one of adamw, sgd, got 'lamb' at mlp.yaml:2:9"},
      {"optim:\n  schedule: cosin\n",
       {},
       "optim.schedule: expected one of constant, cosine, got 'cosin' at mlp.yaml:2:13; did you "
       "mean 'cosine'?"},
      {"data:\n  val_fraction: 1\n",
       {},
       "data.val_fraction: must be in [0, 1), got 1 at mlp.yaml:2:17"},
      {"data:\n  samples: 0\n", {}, "data.samples: must be at least 1, got 0"},
      {"data:\n  label_column: -2\n",
       {},
       "data.label_column: must be -1 (the last column) or a column index from 0, got -2"},
      {"checkpoint:\n  keep_last: 0\n",
       {},
       "checkpoint.keep_last: must be at least 1, got 0 at mlp.yaml:2:14"},
      {"checkpoint:\n  dir: ''\n", {}, "checkpoint.dir: must not be empty, got ''"},
      {"eval:\n  every: 0\n", {}, "eval.every: must be at least 1, got 0"},
      {"model:\n  hidden: [64, 0]\n",
       {},
       "model.hidden[1]: layer widths must be at least 1, got 0 at mlp.yaml:2:16"},
      {"model:\n  classes: 1\n", {}, "model.classes: must be at least 2, got 1 at mlp.yaml:2:12"},
      {"model:\n  input: 0\n", {}, "model.input: must be at least 1, got 0"},
      {"model:\n  norm: rmsnorm\n",
       {},
       "model.norm: expected one of rms_norm, none, got 'rmsnorm' at mlp.yaml:2:9; did you mean "
       "'rms_norm'?"},
      {"device: gpu\n",
       {},
       "device: expected auto, cpu, cuda or cuda:N, got 'gpu' at mlp.yaml:1:9"},
      {"device: cuda:x\n", {}, "device: expected auto, cpu, cuda or cuda:N, got 'cuda:x'"},
      {"precision:\n  loss_scale: -1\n",
       {},
       "precision.loss_scale: expected dynamic, none or a positive number, got '-1' at "
       "mlp.yaml:2:15"},
      {"precision:\n  compute_dtype: f8\n",
       {},
       "precision.compute_dtype: expected one of f64, f32, bf16, f16, got 'f8'"},
      {"device: cuda\nprecision:\n  compute_dtype: f64\n",
       {},
       "precision.compute_dtype: f64 runs on the CPU only, but device is cuda at mlp.yaml:3:18"},
      {"precision:\n  initial_scale: 0.5\n",
       {},
       "precision.initial_scale: must be at least 1, got 0.5 at mlp.yaml:2:18"},
      {"precision:\n  growth_interval: 0\n",
       {},
       "precision.growth_interval: must be at least 1, got 0"},
      {"logging:\n  every: 0\n", {}, "logging.every: must be at least 1, got 0"},
      // data files that are not there
      {"data:\n  kind: csv\n",
       {},
       "data.path: is required for data.kind csv, got '' (the default)"},
      {"data:\n  kind: mnist\n  path: no/such/mnist\n",
       {},
       "data.path: no such file or directory (needed for data.kind mnist), got 'no/such/mnist' at "
       "mlp.yaml:3:9"},
      // YAML syntax
      {"optim:\n  lr: [1, 2\n",
       {},
       "mlp.yaml:3:1: YAML syntax error: end of sequence flow not found"},
      {"optim:\n lr: 1\n  steps: 2\n", {}, "mlp.yaml:3:8: YAML syntax error"},
      // overrides
      {"", {"optim.lr"}, "--set optim.lr: expected key.path=value, e.g. optim.lr=1e-3"},
      {"",
       {"optim.lrr=1"},
       "optim.lrr: unknown key (from --set optim.lrr=1); did you mean 'optim.lr'?"},
      {"", {"optimm.lr=1"}, "optimm: unknown key (from --set optimm.lr=1); did you mean 'optim'?"},
      {"optim:\n  lr: 1\n",
       {"optim.lr=fast"},
       "optim.lr: expected a number, got 'fast' (from --set optim.lr=fast)"},
      {"", {"model.hidden=[64,"}, "--set model.hidden=[64,: the value is not valid YAML"},
      {"", {"optim..lr=1"}, "--set optim..lr=1: 'optim..lr' is not a key path like optim.lr"},
      {"", {"=1"}, "--set =1: '' is not a key path"},
      {"",
       {"eval={every: 0}"},
       "eval.every: must be at least 1, got 0 (from --set eval={every: 0})"},
      {"seed: 1\n",
       {"seed.x=1"},
       "seed: expected a mapping, got '1' at mlp.yaml:1:7 (while applying --set seed.x=1)"},
      {"",
       {"device=cuda", "precision.compute_dtype=f64"},
       "precision.compute_dtype: f64 runs on the CPU only, but device is cuda (from --set "
       "precision.compute_dtype=f64)"},
  };
  expect_bad_configs(cases);
}

// Sizes near 2^62 used to overflow the data's index arithmetic (a segfault), 2^40-wide layers
// asked the allocator for terabytes, and a label column of 2^32 became column 0 on its way to an
// int. Every size has a bound now, checked before anything narrows or multiplies it.
TEST(Config, SizesHaveUpperBounds) {
  std::string too_deep = "model.hidden=[1";
  for (int i = 1; i < 1025; ++i) too_deep += ",1";
  too_deep += "]";
  expect_bad_configs({
      {"model:\n  classes: 4611686018427387904\n",
       {},
       "model.classes: must be at most 16777216, got 4611686018427387904 at mlp.yaml:2:12"},
      {"model:\n  input: 4611686018427387904\n",
       {},
       "model.input: must be at most 16777216, got 4611686018427387904 at mlp.yaml:2:10"},
      {"model:\n  hidden: [64, 1000000000000]\n",
       {},
       "model.hidden[1]: layer widths must be at most 16777216, got 1000000000000 at "
       "mlp.yaml:2:16"},
      {"", {too_deep}, "model.hidden: at most 1024 hidden layers, got 1025 (from --set"},
      {"data:\n  samples: 576460752303423488\n",
       {},
       "data.samples: must be at most 4294967296, got 576460752303423488 at mlp.yaml:2:12"},
      {"data:\n  label_column: 4294967296\n",
       {},
       "data.label_column: must be at most 16777216, got 4294967296 at mlp.yaml:2:17"},
      {"optim:\n  batch_size: 9223372036854775807\n",
       {},
       "optim.batch_size: must be at most 4294967296"},
      {"eval:\n  batch_size: 4294967297\n", {}, "eval.batch_size: must be at most 4294967296"},
  });
  // The bounds themselves are allowed (whether such a model fits in memory is the trainer's check).
  const Config c = load_config("", {"model.input=16777216", "model.classes=16777216"});
  EXPECT_EQ(c.model.input, kMaxWidth);
}

// What follows from the values alone is a config error (exit 2) naming the key, not a failure
// once the run has started: data.samples = 3 used to fail in make_synthetic with exit code 1.
TEST(Config, TooFewSyntheticSamplesAreAConfigError) {
  expect_bad_configs({
      {"data:\n  samples: 3\n",
       {},
       "data.samples: must be at least 5 for synthetic data, which draws a fifth as many for "
       "the test set, got 3 at mlp.yaml:2:12"},
      {"data:\n  samples: 280\noptim:\n  batch_size: 256\n",
       {},
       "data.samples: must leave optim.batch_size = 256 samples for training after "
       "data.val_fraction holds out 28, got 280 at mlp.yaml:2:12"},
      {"data:\n  samples: 20\n  val_fraction: 0.01\noptim: {batch_size: 8}\n",
       {},
       "data.val_fraction: must hold out at least one of data.samples = 20 (or be 0 for no "
       "validation), got 0.01 at mlp.yaml:3:17"},
  });
  // Exactly enough: 285 - round(28.5) = 256 training samples; and no validation at all.
  EXPECT_NO_THROW(load_config("", {"data.samples=285", "optim.batch_size=256"}));
  EXPECT_NO_THROW(load_config("", {"data.samples=20", "data.val_fraction=0", "optim.batch_size=20"}));
}

// yaml-cpp's Load() reads the first document of a stream and drops the rest without a word.
TEST(Config, ASecondYamlDocumentIsAnError) {
  expect_bad_configs({
      {"seed: 1\n---\nseed: 2\n", {}, "mlp.yaml:2: a second YAML document starts here"},
      {"---\nseed: 1\n# more\n--- # the rest\noptim: {lr: 1}\n", {}, "mlp.yaml:4: a second"},
      {"seed: 1\n---\n", {}, "mlp.yaml:2: a second YAML document starts here"},
      {"seed: 1\n...\n---\nseed: 2\n", {}, "mlp.yaml:3: a second YAML document"},
      // yaml-cpp 0.7 reads these as an endless stream of empty documents (or, with Load(), as
      // one empty config: all defaults).
      {",\n", {}, "mlp.yaml:1:1: YAML syntax error: unexpected ','"},
      {"seed: 1\n, 0.99]\n", {}, "mlp.yaml:2:1: YAML syntax error"},
  });
  // One document, with its optional markers, is fine.
  TempDir dir;
  EXPECT_EQ(load_config(dir.write("one.yaml", "---\nseed: 4\n...\n")).seed, 4u);
}

// An unclosed quote used to swallow the keys after it: `dir: "ck` trained into a folder named
// "ck every: 1 ". Every string key is a path or a name, so a string value that spans lines is an
// error; so is one that is not UTF-8 (the config is saved as JSON text in each checkpoint).
TEST(Config, StringsAreOneLineOfValidUtf8) {
  expect_bad_configs({
      {"checkpoint:\n  dir: \"ck\n  every: 1\n\"\n",
       {},
       "checkpoint.dir: a string must be on one line, but this one runs on past line 2 (an "
       "unclosed quote?), got 'ck every: 1 ' at mlp.yaml:2:8"},
      {"checkpoint:\n  dir: 'ck\n  every: 1'\n", {}, "checkpoint.dir: a string must be on one line"},
      {"logging:\n  metrics: runs/\n    m.jsonl\n", {}, "logging.metrics: a string must be on one line"},
      {"data:\n  path: |\n    a.csv\n", {}, "data.path: a string must be on one line"},
      {"checkpoint: {dir: \"a\n  b\"}\n", {}, "checkpoint.dir: a string must be on one line, but "
       "this one runs on past line 1"},
      {"device: \"cpu\n\"\n", {}, "device: a string must be on one line"},
      {"checkpoint:\n  dir: \"ck\xff\"\n",
       {},
       "checkpoint.dir: is not valid UTF-8: byte 0xff at offset 2 of the string at mlp.yaml:2:8"},
      {"", {"checkpoint.dir=a\xc0\xaf"}, "checkpoint.dir: is not valid UTF-8: byte 0xc0 at offset 1"},
      {"", {"logging.curve=\xed\xa0\x80.svg"}, "logging.curve: is not valid UTF-8: byte 0xed"},
      {"", {"data.test_path=\xf4\x90\x80\x80"}, "data.test_path: is not valid UTF-8"},
      {"", {"checkpoint.dir=ab\xe2\x82"}, "checkpoint.dir: is not valid UTF-8: byte 0xe2 at offset 2"},
  });
  // Quotes closed on their line, escapes, comments and multi-byte UTF-8 are all fine.
  TempDir dir;
  const Config c = load_config(dir.write("ok.yaml",
                                         "checkpoint: {dir: \"r\\\"u\\\\n\"}  # quoted\n"
                                         "logging:\n  metrics: 'it''s.jsonl'\n"
                                         "  curve: r\xc3\xa9sum\xc3\xa9-\xe2\x82\xac-\xf0\x9f\x98\x80.svg # c\n"));
  EXPECT_EQ(c.checkpoint.dir, "r\"u\\n");
  EXPECT_EQ(c.logging.metrics, "it's.jsonl");
  EXPECT_EQ(c.logging.curve, "r\xc3\xa9sum\xc3\xa9-\xe2\x82\xac-\xf0\x9f\x98\x80.svg");
  EXPECT_EQ(parse_config(to_yaml(c), "saved"), c);
  // A --set value is one argument: its line structure is the shell's business.
  EXPECT_EQ(load_config("", {"checkpoint.dir=\"a\n b\""}).checkpoint.dir, "a b");
}

// /dev/zero as a config (or a CSV) used to be read until memory ran out.
// The messages say what was read: at most the 16 MiB bound, or nothing.
TEST(Config, UnboundedFilesAreRefusedBeforeTheyAreRead) {
  EXPECT_EQ(config_error("/dev/zero", {}),
            "config file /dev/zero gives more than 1048576 bytes (1 MiB), the most a config may "
            "have (it is not a regular file)");
  EXPECT_EQ(config_error("", {"data.kind=csv", "data.path=/dev/zero"}),
            "data.path: is not a regular file (a device or pipe may never end), got '/dev/zero' "
            "(from --set data.path=/dev/zero)");

  TempDir dir;
  const std::string big = dir.write("big.yaml", "seed: 1\n");
  fs::resize_file(big, kMaxConfigBytes + 1);  // sparse: nothing is written
  EXPECT_EQ(config_error(big, {}, dir.path),
            "config file big.yaml is 1048577 bytes; a config may have at most 1048576 bytes "
            "(1 MiB)");
  const std::string csv = dir.write("train.csv", "1,0\n");
  EXPECT_NE(config_error("", {"data.kind=csv", "data.path=" + csv, "data.test_path=/dev/zero"})
                .find("data.test_path: is not a regular file"),
            std::string::npos);
}

TEST(Config, MissingFileIsAnError) {
  TempDir dir;
  EXPECT_NE(config_error((dir.path / "nope.yaml").string(), {}).find("nope.yaml does not exist"),
            std::string::npos);
  EXPECT_NE(config_error(dir.path.string(), {}).find("is a directory"), std::string::npos);
  const std::string train = dir.write("train.csv", "1,0\n");
  const std::string test = (dir.path / "test.csv").string();
  EXPECT_EQ(config_error("", {"data.kind=csv", "data.path=" + train, "data.test_path=" + test}),
            "data.test_path: no such file or directory, got '" + test +
                "' (from --set data.test_path=" + test + ")");
  // Synthetic data reads no files, so its paths are not checked.
  EXPECT_NO_THROW(load_config("", {"data.test_path=" + test}));
  // A ConfigError is an mt::Error, so one catch at the top of main reports every failure.
  EXPECT_THROW(load_config("", {"seed=x"}), Error);
}

}  // namespace
