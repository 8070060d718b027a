#pragma once
// Models and data by name: a config's `model.kind` and `data.kind` name entries of these
// registries, as an op's name names its kernels (core/registry.h). An entry is a builder, the keys
// it adds to its section of the config, and its checks; a new kind is one file that registers
// itself, and nothing else changes: the config accepts the kind and its keys (with their checks),
// --print-config prints them, the schema's reference (docs/config.md) lists them, and `train`
// trains it.
//
//   // app/models/tiny.cpp (or a test file, or a program of its own)
//   static const app::RegisterModel tiny({
//       .name = "tiny",
//       .meaning = "one linear layer",
//       .keys = {{.name = "bias", .type = app::ParamType::boolean, .default_value = "true",
//                 .meaning = "the layer has a bias"}},
//       .build = [](const Config& c) {
//         return std::make_shared<nn::Linear>(c.model.input, c.model.classes,
//                                             c.model.params.boolean("bias"));
//       }});
//
// The keys shared by the built-in kinds (model.input, model.hidden, ..., data.path, ...) are the
// schema's own (app/config.h); every kind may read them.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "app/config.h"
#include "core/device.h"
#include "data/data.h"
#include "data/source.h"
#include "nn/gpt.h"
#include "nn/module.h"
#include "train/task.h"

namespace mt::app {

// A key a kind adds to its section. Its value is kept as YAML text in the section's `params`
// (ModelConfig::params, DataConfig::params) and read with the section's accessors.
struct ParamKey {
  std::string name;
  ParamType type = ParamType::integer;
  std::string default_value = {};  // as YAML: "8", "0.5", "true", "name", "[64, 64]"
  std::string meaning = {}, constraints = {};  // for the reference
  // An error for a value the kind cannot use, e.g. "must be at least 1" ("" when it can); given
  // the section, which holds the value.
  std::function<std::string(const Params& params)> check = {};
};

// Rejects the value of `key` (its name within the section, e.g. "path") with `message` (what is
// wrong and the value: "no such file or directory, got 'x.csv'"); the ConfigError names the full
// key and where the value came from (file and line, or the --set).
using Reject = std::function<void(const std::string& key, const std::string& message)>;

struct ModelKind {
  std::string name;
  std::string meaning = {};  // one line for the reference
  std::vector<ParamKey> keys = {};
  // The model of a validated config, fp32 on the CPU, initialized from the default generator.
  std::function<std::shared_ptr<nn::Module>(const Config&)> build = {};
  // Optional. Throws ConfigError when `set` (the training or test data) does not fit the model.
  std::function<void(const Config&, const data::Dataset& set)> check_data = {};
  // Optional. Throws ConfigError when the run cannot fit in `device`'s memory (app/memory.h).
  std::function<void(const Config&, Device device, int world)> check_memory = {};
  // Optional. The task the model trains with, given the run's data source; none: classification.
  std::function<std::shared_ptr<train::Task>(const Config&, data::Source& source)> task = {};
  bool documented = true;  // false: left out of the reference (a test's kind)
};

struct DataKind {
  std::string name;
  std::string meaning = {};
  std::vector<ParamKey> keys = {};
  // Array data (features and class labels, data::ArraySource): the training set, or with `test`
  // the test set; a file that cannot be read is a DataError. Whether there is a test set.
  std::function<data::Dataset(const DataConfig&, const ModelConfig&, bool test)> load = {};
  std::function<bool(const DataConfig&)> has_test = {};
  // Any other data (token ids, say): the run's data source, built from the config; when set,
  // `load` is not used for training.
  std::function<std::shared_ptr<data::Source>(const Config&)> source = {};
  // Optional: checks of the section's values that need no data (files that must exist, sizes
  // that follow from the config alone), run as the config is parsed, after the optim section.
  std::function<void(const Config&, const Reject&)> check = {};
  bool documented = true;
};

// Adds a kind; a second kind of the same name is an error (at start-up).
struct RegisterModel {
  explicit RegisterModel(ModelKind kind);
};
struct RegisterData {
  explicit RegisterData(DataKind kind);
};

// The kind named `name`; a ConfigError for one that is not registered, listing those that are.
const ModelKind& model_kind(const std::string& name);
const DataKind& data_kind(const std::string& name);
const ModelKind* find_model_kind(const std::string& name);
const DataKind* find_data_kind(const std::string& name);
// Every registered kind, by name.
std::vector<const ModelKind*> model_kinds();
std::vector<const DataKind*> data_kinds();

// The config's model (its model.kind's builder).
std::shared_ptr<nn::Module> build_model(const Config& c);

// model.kind gpt's shape from the model section (app/models/gpt.cpp).
nn::GPTConfig gpt_config(const Config& c);

}  // namespace mt::app
