#pragma once
// The trainer as the `train` program builds it from a config (app/config.h): the config's
// sections become train::Options (options_from, app/config.h), its `data` section a data source
// and its `model` section the model, and the checkpoint carries the config as YAML, so that a
// model file alone rebuilds the model (`train eval`, `train predict`; app/inference.h).
//
// A program that trains a model of its own needs none of this: it builds train::Options, a
// data::Source and its model itself (docs/library.md).
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "app/config.h"
#include "data/array_source.h"
#include "data/data.h"
#include "train/options.h"
#include "train/trainer.h"

namespace mt::app {

// The data source's options from the config (optim.batch_size, optim.microbatches and data.*).
data::ArrayOptions array_options(const Config& c);

// Data a program hands the trainer instead of the config's data section. A test set of size 0
// means none; the validation split is still data.val_fraction of `train`.
struct Datasets {
  data::Dataset train, test;
};

// The checkpoint metadata key that marks a model of the caller's own (its value: the module's
// repr()), which no model kind builds.
inline constexpr const char* kOwnModelKey = "own_model";

class ConfigTrainer : public train::Trainer {
 public:
  // The config's own model (initialized from config.seed) and the classification task:
  // `train --config`. Mismatches between the model section and the data (feature count, labels
  // outside model.classes) are ConfigErrors, and so, before anything is allocated, is a run that
  // cannot fit in the device's memory (app/memory.h), and before anything is loaded, a checkpoint
  // folder that cannot be written.
  ConfigTrainer(Config config, Device device, std::shared_ptr<parallel::Communicator> comm = nullptr);
  // `model` and `task` of the caller's own, with the config's other sections; data from `data`
  // when given, else from the config (its model.input and model.classes shape the synthetic
  // data).
  ConfigTrainer(Config config, std::shared_ptr<nn::Module> model, std::shared_ptr<train::Task> task,
                Device device, std::shared_ptr<parallel::Communicator> comm = nullptr,
                std::optional<Datasets> data = std::nullopt);

  const Config& config() const { return config_; }

 private:
  struct Parts;
  explicit ConfigTrainer(Parts parts);
  // The config's data as a source: the data (or the config's) in a data::ArraySource, after the
  // memory and fit checks of the config's own model.
  static std::shared_ptr<data::Source> array_source(const Config& config, bool config_model,
                                                    int world, Device device,
                                                    std::optional<Datasets> data);
  static Parts build(Config config, std::shared_ptr<nn::Module> model,
                     std::shared_ptr<train::Task> task, Device device,
                     std::shared_ptr<parallel::Communicator> comm, std::optional<Datasets> data);
  Config config_;
};

// A data-parallel job of `nproc` CPU ranks as threads of this process (train::run_local_ranks),
// every rank the config's trainer, each resumed from `resume` if given, then `setup` with each;
// `timeout` as train::run_local_ranks's.
train::LocalRun run_local_ranks(const Config& cfg, int nproc, const std::string& resume = "",
                                const std::function<void(int rank, train::Trainer&)>& setup = {},
                                std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace mt::app
