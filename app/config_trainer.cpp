#include "app/config_trainer.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "app/fingerprint.h"
#include "app/registry.h"
#include "core/rng.h"

namespace mt::app {

data::ArrayOptions array_options(const Config& c) {
  return {c.optim.batch_size, c.optim.microbatches, c.data.val_fraction, c.data.shuffle,
          c.data.seed, c.data.standardize};
}

struct ConfigTrainer::Parts {
  Config config;
  train::Options options;
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<train::Task> task;
  std::shared_ptr<data::Source> data;
  Device device;
  std::shared_ptr<parallel::Communicator> comm;
};

ConfigTrainer::ConfigTrainer(Config config, Device device, std::shared_ptr<parallel::Communicator> comm)
    : ConfigTrainer(build(std::move(config), nullptr, train::classification(), device,
                          std::move(comm), std::nullopt)) {}

ConfigTrainer::ConfigTrainer(Config config, std::shared_ptr<nn::Module> model,
                             std::shared_ptr<train::Task> task, Device device,
                             std::shared_ptr<parallel::Communicator> comm,
                             std::optional<Datasets> data)
    : ConfigTrainer(build(std::move(config), std::move(model), std::move(task), device,
                          std::move(comm), std::move(data))) {}

ConfigTrainer::ConfigTrainer(Parts p)
    : train::Trainer(std::move(p.options), std::move(p.model), std::move(p.task), std::move(p.data),
                     p.device, std::move(p.comm)),
      config_(std::move(p.config)) {}

namespace {

// The metrics and the curve are rewritten (and deleted by checkpoint.overwrite): neither may be a
// file the run reads.
void check_outputs_are_not_data(const train::Options& o, const DataConfig& data) {
  for (const auto& [key, out] : {std::pair{"logging.metrics", train::metrics_path(o)},
                                 {"logging.curve", train::curve_path(o)}})
    for (const auto& [data_key, in] : {std::pair{"data.path", data.path},
                                       {"data.test_path", data.test_path}}) {
      std::error_code ec;  // false, with ec set, when either does not exist
      if (!in.empty() && std::filesystem::equivalent(out, in, ec))
        throw ConfigError(detail::concat(key, ": '", out, "' is ", data_key,
                                         ", which the run reads; name another file"));
    }
}

}  // namespace

// A null `model` stands for the config's own, built once the data is known to fit it and the run
// to fit in memory.
ConfigTrainer::Parts ConfigTrainer::build(Config config, std::shared_ptr<nn::Module> model,
                                          std::shared_ptr<train::Task> task, Device device,
                                          std::shared_ptr<parallel::Communicator> comm,
                                          std::optional<Datasets> data) {
  const bool config_model = model == nullptr;
  const int world = comm ? comm->size() : 1;
  train::Options options = options_from(config);
  options.job_keys = job_entries(config);
  // Before anything is loaded or allocated (the trainer checks these again, for every caller).
  if (comm == nullptr || comm->rank() == 0) {
    train::check_output_paths(options);
    check_outputs_are_not_data(options, config.data);
  }
  // The model kind's checks are of its own model; a model handed in is the caller's.
  const ModelKind* kind = config_model ? &model_kind(config.model.kind) : nullptr;
  if (kind && kind->check_memory) kind->check_memory(config, device, world);

  std::shared_ptr<data::Source> source;
  const DataKind& data_kind = app::data_kind(config.data.kind);
  if (!data && data_kind.source) {
    source = data_kind.source(config);
  } else {
    Datasets sets;
    if (data) {
      if (config.data.test_fraction > 0)
        throw ConfigError("data.test_fraction: holds a test set out of the config's data, but this "
                          "data is handed in (its test set is app::Datasets::test), got " +
                          format_number(config.data.test_fraction));
      sets = std::move(*data);
    } else {
      sets.train = data::load_dataset(config.data, config.model, false);
      if (data::has_test_set(config.data)) sets.test = data::load_dataset(config.data, config.model, true);
    }
    if (kind && kind->check_data)
      for (const data::Dataset* set : {&sets.train, &sets.test}) kind->check_data(config, *set);
    source = std::make_shared<data::ArraySource>(std::move(sets.train), std::move(sets.test),
                                                 array_options(config));
  }
  if (config_model) {
    manual_seed(config.seed);  // the model's initialization
    model = kind->build(config);
    if (kind->task) task = kind->task(config, *source);
  }
  // The checkpoint's config is the run's: with the length optim.epochs gives it and the warmup
  // the trainer shortens to it, so that a resumed run and `train eval` read what was run.
  Config saved = config;
  if (saved.optim.epochs > 0) saved.optim.steps = saved.optim.epochs * source->steps_per_epoch();
  saved.optim.warmup_steps = std::min(saved.optim.warmup_steps, saved.optim.steps);
  options.checkpoint.metadata["config"] = to_yaml(saved);
  // The config's model section did not build a model handed in, so `train eval` and `train
  // predict` cannot rebuild it from the config: they refuse such a checkpoint by this key.
  if (!config_model) options.checkpoint.metadata[kOwnModelKey] = model->repr();
  return {std::move(config), std::move(options), std::move(model), std::move(task),
          std::move(source), device, std::move(comm)};
}

train::LocalRun run_local_ranks(const Config& cfg, int nproc, const std::string& resume,
                                const std::function<void(int rank, train::Trainer&)>& setup,
                                std::chrono::milliseconds timeout) {
  return train::run_local_ranks(nproc, [&](std::shared_ptr<parallel::Communicator> comm) {
    const int rank = comm->rank();
    auto t = std::make_unique<ConfigTrainer>(cfg, kCPU, std::move(comm));
    if (!resume.empty()) t->resume(resume);
    if (setup) setup(rank, *t);
    return t;
  }, timeout);
}

}  // namespace mt::app
