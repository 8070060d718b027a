#include "app/config_trainer.h"

#include <algorithm>

#include "app/memory.h"
#include "app/models.h"
#include "core/rng.h"
#include "data/token_source.h"
#include "data/tokenizer.h"
#include "train/lm_task.h"

namespace mt::app {
namespace {

// The config's model must fit its data.
void check_fits(const data::Dataset& set, const ModelConfig& m) {
  if (set.size == 0) return;
  const std::string which = set.file.empty() ? set.name : set.name + " file " + set.file;
  if (set.dim != m.input)
    throw ConfigError(detail::concat("model.input: is ", m.input, " but the ", which,
                                     " has ", set.dim, " features per sample"));
  for (size_t i = 0; i < set.labels.size(); ++i)
    if (set.labels[i] < 0 || set.labels[i] >= m.classes)
      throw ConfigError(detail::concat("model.classes: is ", m.classes, " but the ", which,
                                       " has label ", set.labels[i], " (sample ", i, ")"));
}

optim::LossScalerOptions loss_scale(const PrecisionConfig& p) {
  if (p.loss_scale == "none") return {optim::LossScaleMode::none};
  if (p.loss_scale == "fixed") return {optim::LossScaleMode::fixed, p.fixed_loss_scale, p.growth_interval};
  return {optim::LossScaleMode::dynamic, p.initial_scale, p.growth_interval};
}

}  // namespace

train::Options options_from(const Config& c) {
  train::Options o;
  o.steps = c.optim.steps;
  o.epochs = c.optim.epochs;
  o.optimizer = {c.optim.name, c.optim.lr, c.optim.weight_decay, c.optim.betas, c.optim.eps,
                 c.optim.momentum, c.optim.nesterov, c.optim.shard_state, c.optim.clip_norm};
  o.schedule = {c.optim.schedule, c.optim.warmup_steps, c.optim.min_lr};
  o.precision = {c.precision.compute_dtype, c.precision.deterministic, c.precision.gemm_autotune,
                 loss_scale(c.precision)};
  o.eval = {c.eval.every, c.eval.batch_size};
  o.checkpoint = {c.checkpoint.dir, c.checkpoint.every, c.checkpoint.keep_last,
                  c.checkpoint.overwrite, {{"config", to_yaml(c)}}};
  o.logging = {c.logging.every, c.logging.metrics, c.logging.curve};
  o.cuda_graph = c.cuda_graph;
  return o;
}

data::ArrayOptions array_options(const Config& c) {
  return {c.optim.batch_size, c.optim.microbatches, c.data.val_fraction, c.data.shuffle,
          c.data.seed, c.data.standardize};
}

namespace {

// Token data (data.kind text or tokens) as the config names it; a file that cannot be read or
// tokenized is a data::DataError, ids at or above model.vocab_size a ConfigError.
std::shared_ptr<data::TokenSource> token_source(const Config& c) {
  const DataConfig& d = c.data;
  data::TokenStream stream;
  std::string tokenizer = "tokens";
  try {
    if (d.kind == "text") {
      const auto t = make_tokenizer(d.tokenizer, d.gpt2_dir);
      tokenizer = t->name();
      if (t->vocab_size() > c.model.vocab_size)
        throw ConfigError(detail::concat("model.vocab_size: is ", c.model.vocab_size, " but the ",
                                         t->name(), " tokenizer has ", t->vocab_size(), " ids"));
      stream = data::tokenize_text_file(d.path, *t);
    } else {
      stream = data::read_token_shards({d.path}, c.model.vocab_size);
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw data::DataError(e.what());
  }
  data::TokenSourceOptions o{.block_size = d.block_size > 0 ? d.block_size : c.model.block_size,
                             .batch_size = c.optim.batch_size, .microbatches = c.optim.microbatches,
                             .val_fraction = d.val_fraction, .eval_windows = d.eval_windows,
                             .seed = d.seed};
  try {
    return std::make_shared<data::TokenSource>(std::move(stream), tokenizer, o);
  } catch (const Error& e) {
    throw ConfigError(std::string("data: ") + e.what());  // too little text for the windows
  }
}

}  // namespace

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

// A null `model` stands for the config's own, built once the data is known to fit it and the run
// to fit in memory.
ConfigTrainer::Parts ConfigTrainer::build(Config config, std::shared_ptr<nn::Module> model,
                                          std::shared_ptr<train::Task> task, Device device,
                                          std::shared_ptr<parallel::Communicator> comm,
                                          std::optional<Datasets> data) {
  const bool config_model = model == nullptr;
  const int world = comm ? comm->size() : 1;
  train::Options options = options_from(config);
  // Before anything is loaded or allocated (the trainer checks these again, for every caller).
  if (comm == nullptr || comm->rank() == 0) train::check_output_paths(options);
  std::shared_ptr<data::Source> source;
  if (config.model.kind == "gpt") {
    // A language model: token windows, the next-token task, dropout keyed by the step.
    auto tokens = token_source(config);
    if (config_model)
      task = train::language_modeling(config.model.vocab_size, tokens->tokens_per_byte(),
                                      {config.seed, [t = tokens.get()] { return t->last_step(); }});
    source = tokens;
  } else {
    source = array_source(config, config_model, world, device, std::move(data));
  }
  if (config_model) {
    manual_seed(config.seed);  // the model's initialization
    model = build_model(config.model);
  }
  // The checkpoint keeps the config this run trains with: optim.steps with epochs resolved, warmup
  // as the schedule shortens it.
  Config saved = config;
  if (saved.optim.epochs > 0) saved.optim.steps = saved.optim.epochs * source->steps_per_epoch();
  saved.optim.warmup_steps = std::min(saved.optim.warmup_steps, saved.optim.steps);
  options.checkpoint.metadata["config"] = to_yaml(saved);
  return {std::move(config), std::move(options), std::move(model), std::move(task),
          std::move(source), device, std::move(comm)};
}

std::shared_ptr<data::Source> ConfigTrainer::array_source(const Config& config, bool config_model,
                                                          int world, Device device,
                                                          std::optional<Datasets> data) {
  // The estimate is the config's model's; a model handed in is already allocated.
  if (config_model) check_memory(config, device, world);
  Datasets sets;
  if (data) {
    sets = std::move(*data);
  } else {
    sets.train = data::load_dataset(config.data, config.model, false);
    if (data::has_test_set(config.data)) sets.test = data::load_dataset(config.data, config.model, true);
  }
  if (config_model)
    for (const data::Dataset* set : {&sets.train, &sets.test}) check_fits(*set, config.model);
  return std::make_shared<data::ArraySource>(std::move(sets.train), std::move(sets.test),
                                             array_options(config));
}

train::LocalRun run_local_ranks(const Config& cfg, int nproc, const std::string& resume,
                                const std::function<void(int rank, train::Trainer&)>& setup) {
  return train::run_local_ranks(nproc, [&](std::shared_ptr<parallel::Communicator> comm) {
    const int rank = comm->rank();
    auto t = std::make_unique<ConfigTrainer>(cfg, kCPU, std::move(comm));
    if (!resume.empty()) t->resume(resume);
    if (setup) setup(rank, *t);
    return t;
  });
}

}  // namespace mt::app
