// Models and data by name (app/registry.h): a model kind and a data kind registered in this file,
// and nowhere else, are parsed with their own keys and checks, printed by to_yaml, refused when
// misspelled, and trained by the `train` program (app/cli.h) like the built-in kinds.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "app/cli.h"
#include "app/config.h"
#include "app/registry.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "nn/modules.h"
#include "ops/elementwise/elementwise.h"
#include "tests/run_train.h"
#include "tests/temp_dir.h"
#include "train/checkpoint.h"

namespace mt {
namespace {

using test::TempDir;

// model.kind: toy_linear, one linear layer whose initial weights are multiplied by model.gain.
const app::RegisterModel toy_model({
    .name = "toy_linear",
    .meaning = "one linear layer",
    .keys = {{.name = "gain",
              .type = ParamType::number,
              .default_value = "1",
              .meaning = "factor on the initial weights",
              .constraints = "> 0",
              .check = [](const Params& p) { return p.number("gain") > 0 ? "" : "must be > 0"; }}},
    .build =
        [](const Config& c) -> std::shared_ptr<nn::Module> {
          auto layer = std::make_shared<nn::Linear>(c.model.input, c.model.classes);
          NoGradGuard no_grad;
          layer->weight.copy_(scale(layer->weight, c.model.params.number("gain")));
          return layer;
        },
    .documented = false,
});

// data.kind: toy_stripes, points in [-1, 1]^input labelled by which of model.classes stripes
// of their first coordinate they fall in; data.rows of them (a fifth as many for the test).
data::Dataset stripes(int64_t rows, int64_t dim, int64_t classes, uint64_t seed) {
  data::Dataset d;
  d.name = "toy_stripes";
  d.size = rows, d.dim = dim, d.classes = classes;
  Generator g(seed);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < dim; ++k) d.features.push_back(float(2 * g.uniform() - 1));
    const double x0 = d.features[size_t(r * dim)];
    d.labels.push_back(std::min(classes - 1, int64_t((x0 + 1) / 2 * double(classes))));
  }
  return d;
}

const app::RegisterData toy_data({
    .name = "toy_stripes",
    .meaning = "points labelled by stripes",
    .keys = {{.name = "rows",
              .type = ParamType::integer,
              .default_value = "512",
              .meaning = "training points",
              .constraints = "≥ 64",
              .check = [](const Params& p) { return p.integer("rows") >= 64 ? "" : "must be at least 64"; }}},
    .load =
        [](const DataConfig& d, const ModelConfig& m, bool test) {
          const int64_t rows = d.params.integer("rows");
          return stripes(test ? rows / 5 : rows, m.input, m.classes, d.seed * 2 + (test ? 1 : 0));
        },
    .has_test = [](const DataConfig&) { return true; },
    .documented = false,
});

const std::vector<std::string> kToy = {"model.kind=toy_linear", "data.kind=toy_stripes"};

std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

std::string error_of(const std::vector<std::string>& sets) {
  try {
    load_config("", sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Kinds, AKindsOwnKeysAreParsedCheckedAndPrinted) {
  const Config c = load_config("", with(kToy, {"model.gain=0.5", "data.rows=128"}));
  EXPECT_EQ(c.model.params.number("gain"), 0.5);
  EXPECT_EQ(c.data.params.integer("rows"), 128);
  const std::string yaml = to_yaml(c);
  EXPECT_NE(yaml.find("model:\n  kind: \"toy_linear\"\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  gain: 0.5\ndata:\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  rows: 128\noptim:\n"), std::string::npos) << yaml;
  EXPECT_EQ(parse_config(yaml, "printed"), c);
  // The defaults, when the keys are not set.
  const Config d = load_config("", kToy);
  EXPECT_EQ(d.model.params.number("gain"), 1.0);
  EXPECT_EQ(d.data.params.integer("rows"), 512);

  EXPECT_EQ(error_of(with(kToy, {"model.gain=-1"})), "model.gain: must be > 0, got -1 (from --set model.gain=-1)");
  EXPECT_EQ(error_of(with(kToy, {"data.rows=10"})), "data.rows: must be at least 64, got 10 (from --set data.rows=10)");
  EXPECT_EQ(error_of(with(kToy, {"model.gainn=2"})),
            "model.gainn: unknown key (from --set model.gainn=2); did you mean 'model.gain'?");
  // A kind's keys belong to it alone.
  EXPECT_EQ(error_of({"model.gain=2"}), "model.gain: unknown key (from --set model.gain=2)");
  // An unknown kind: the documented kinds are offered, and the nearest registered one.
  EXPECT_EQ(error_of({"model.kind=toy_linaer"}),
            "model.kind: expected one of gpt, mlp, got 'toy_linaer' (from --set model.kind=toy_linaer); "
            "did you mean 'toy_linear'?");
}

int run_train(const std::vector<std::string>& args) {
  std::vector<std::string> storage = {"train"};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : storage) argv.push_back(a.data());
  return app::run_cli(int(argv.size()), argv.data());
}

TEST(Kinds, ARegisteredModelAndDataKindTrainThroughTheTrainProgram) {
  TempDir dir;
  const std::string config = dir.write("toy.yaml",
                                       "model: {kind: toy_linear, input: 4, classes: 2, gain: 0.5}\n"
                                       "data: {kind: toy_stripes, rows: 640}\n"
                                       "optim: {steps: 60, batch_size: 64, microbatches: 2, lr: 0.05}\n"
                                       "eval: {every: 30}\n"
                                       "logging: {every: 20}\n"
                                       "checkpoint: {dir: " + (dir / "run") + ", every: 30}\n");
  ASSERT_EQ(run_train({"--config", config, "--device", "cpu"}), 0);
  std::ifstream in(dir / "run/metrics.jsonl");
  std::stringstream text;
  text << in.rdbuf();
  const std::string metrics = text.str();
  const size_t at = metrics.find("\"test_accuracy\":");
  ASSERT_NE(at, std::string::npos) << metrics;
  EXPECT_GT(std::stod(metrics.substr(at + 16)), 0.9) << metrics;  // a linear layer separates two stripes
  // The checkpoint's config names the kinds and their keys, so the saved model can be rebuilt.
  const Config saved = parse_config(train::load_checkpoint(dir / "run").metadata.at("config"), "saved");
  EXPECT_EQ(saved.model.kind, "toy_linear");
  EXPECT_EQ(saved.model.params.number("gain"), 0.5);
  EXPECT_EQ(saved.data.params.integer("rows"), 640);
  // `train eval` rebuilds the model and the data from the checkpoint alone, through the kinds.
  ASSERT_EQ(run_train({"eval", "--checkpoint", dir / "run", "--device", "cpu"}), 0);
  // The `train` program this build made registers no toy_linear: it says so, and what to do.
  std::string log;
  EXPECT_EQ(test::run_train("eval --checkpoint " + (dir / "run"), &log), 2) << log;
  EXPECT_NE(log.find("its model.kind 'toy_linear' is not registered in this program (it has "),
            std::string::npos) << log;
  EXPECT_NE(log.find("app::evaluate_checkpoint"), std::string::npos) << log;
}

}  // namespace
}  // namespace mt
