// The trainer's config: defaults, overrides, the to_yaml round trip, and a table of bad configs,
// each with the message it must produce (key path, what is wrong, and where it came from).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "train/config.h"
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
  EXPECT_EQ(metrics_path(c), "runs/mlp/metrics.jsonl");
  EXPECT_EQ(curve_path(c), "runs/mlp/curve.svg");

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
precision: {compute_dtype: bf16, deterministic: false, loss_scale: 128, initial_scale: 1024,
            growth_interval: 10}
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
  EXPECT_TRUE(c.data.header);
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
  EXPECT_EQ(c.precision.loss_scale, "fixed");
  EXPECT_EQ(c.precision.fixed_loss_scale, 128.0);
  EXPECT_EQ(c.precision.initial_scale, 1024.0);
  EXPECT_EQ(c.precision.growth_interval, 10);
  EXPECT_EQ(c.eval.every, 5);
  EXPECT_EQ(c.checkpoint.dir, "out");
  EXPECT_EQ(c.logging.metrics, "m.jsonl");
  EXPECT_EQ(metrics_path(c), "m.jsonl");
  EXPECT_EQ(curve_path(c), "c.svg");
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
  c.precision.initial_scale = 1099511627776.0;  // 2^40
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

TEST(Config, BadConfigsNameTheKeyAndThePlace) {
  const std::vector<BadConfig> cases = {
      // wrong types
      {"optim:\n  lr: fast\n", {}, "optim.lr: expected a number, got 'fast' at mlp.yaml:2:7"},
      {"optim:\n  steps: 1.5\n",
       {},
       "optim.steps: expected an integer, got '1.5' at mlp.yaml:2:10"},
      {"seed: -1\n", {}, "seed: expected a non-negative integer, got '-1' at mlp.yaml:1:7"},
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
      {"optim:\n  steps: 10\n",
       {},
       "optim.warmup_steps: must not exceed optim.steps = 10, got 20 (the default)"},
      {"optim: {name: sgd, momentum: 0, nesterov: true}\n",
       {},
       "optim.nesterov: needs optim.momentum > 0 at mlp.yaml:1:43"},
      {"optim:\n  name: lamb\n",
       {},
       "optim.name: expected one of adamw, sgd, got 'lamb' at mlp.yaml:2:9"},
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
  TempDir dir;
  for (const BadConfig& c : cases) {
    SCOPED_TRACE(c.yaml);
    const std::string msg = config_error(dir.write("mlp.yaml", c.yaml), c.overrides, dir.path);
    EXPECT_NE(msg.find(c.expected), std::string::npos)
        << "expected an error containing \"" << c.expected << "\", got: " << msg;
  }
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
