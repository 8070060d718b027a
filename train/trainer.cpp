#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>

#include <spdlog/spdlog.h>

#include "core/accumulate.h"
#include "core/autograd.h"
#include "core/registry.h"
#include "core/rng.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/sgd.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/fingerprint.h"
#include "train/forensics.h"
#include "train/memory.h"
#include "train/metrics.h"
#include "train/models.h"
#include "train/run_dir.h"
#include "train/step_graph.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace mt::train {

Device resolve_device(const std::string& spec) {
  if (spec == "auto") return cuda_available() ? cuda_device(0) : kCPU;
  Device d = Device::parse(spec);
  // A device that is not there is a usage error (exit code 2), like a misspelled one.
  if (d.is_cuda() && (!cuda_available() || d.index >= cuda_device_count()))
    throw ConfigError(detail::concat(
        "device: ", d.str(), " requested, but ",
        cuda_available() ? detail::concat("only ", cuda_device_count(), " GPUs are visible")
                         : std::string("no CUDA device is available (use --device cpu or auto)")));
  return d;
}

namespace {

// Checkpoints, metrics and the curve are first written after training has run a while, so a
// folder that can be neither created nor written is found now. Nothing is created here: the
// nearest existing folder on the way to `dir` must be a writable directory.
void check_writable(const std::string& key, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(dir.empty() ? fs::path(".") : dir, ec);
  while (!fs::exists(p, ec) && p.has_relative_path()) p = p.parent_path();
  if (!fs::is_directory(p, ec))
    throw ConfigError(detail::concat(key, ": cannot create '", dir.string(), "': '", p.string(),
                                     "' is not a directory"));
  if (::access(p.c_str(), W_OK | X_OK) != 0)
    throw ConfigError(detail::concat(key, ": cannot create or write '", dir.string(), "': '",
                                     p.string(), "' is not writable: ", std::strerror(errno)));
}

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

void check_finite(const data::Dataset& set) {
  // One NaN or inf feature would turn every parameter into NaN in the first step that draws it.
  for (size_t i = 0; i < set.features.size(); ++i)
    if (!std::isfinite(set.features[i]))
      throw data::DataError(detail::concat("the ", set.name, " data: sample ", i / size_t(set.dim),
                                          ", feature ", i % size_t(set.dim), " is ",
                                          set.features[i]));
}

// f16 is the one compute dtype whose range needs loss scaling; bf16 has fp32's exponent range.
optim::LossScalerOptions loss_scaler_options(const PrecisionConfig& p) {
  if (p.compute_dtype != DType::f16 || p.loss_scale == "none") return {optim::LossScaleMode::none};
  if (p.loss_scale == "fixed")
    return {optim::LossScaleMode::fixed, p.fixed_loss_scale, p.growth_interval};
  return {optim::LossScaleMode::dynamic, p.initial_scale, p.growth_interval};
}

// The loss scaler's state travels in the optimizer file under this prefix.
constexpr std::string_view kScalerPrefix = "loss_scaler.";

bool is_terminal() { return ::isatty(::fileno(stdout)) == 1; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Trainer::Trainer(Config config, Device device, std::shared_ptr<parallel::Communicator> comm)
    : Trainer(std::move(config), nullptr, classification(), device, std::move(comm)) {}

// A null `model` (the convenience constructor) stands for the config's own, built here once the
// data is known to fit it and the run to fit in memory.
Trainer::Trainer(Config config, std::shared_ptr<nn::Module> model, std::shared_ptr<Task> task,
                 Device device, std::shared_ptr<parallel::Communicator> comm,
                 std::optional<Datasets> data)
    : cfg_(std::move(config)), device_(device), comm_(std::move(comm)), model_(std::move(model)),
      task_(std::move(task)), scaler_(loss_scaler_options(cfg_.precision)), run_id_(random_id()) {
  MT_CHECK(task_, "Trainer: the task is null");
  verify_ops();  // every op this build can run has its kernels, with the signatures it declares
  const bool config_model = model_ == nullptr;
  const int world = comm_ ? comm_->size() : 1;
  const ModelConfig& m = cfg_.model;
  set_deterministic(cfg_.precision.deterministic);
  set_gemm_autotune(cfg_.precision.gemm_autotune);
  if (!cfg_.precision.deterministic) spdlog::warn("deterministic: false: reductions may use atomics");
  MT_CHECK(device_.is_cpu() || cfg_.precision.compute_dtype != DType::f64,
           "precision.compute_dtype: f64 runs on the CPU only");
  if (lead()) {
    check_writable("checkpoint.dir", cfg_.checkpoint.dir);
    if (!cfg_.logging.metrics.empty())
      check_writable("logging.metrics", std::filesystem::path(cfg_.logging.metrics).parent_path());
    if (!cfg_.logging.curve.empty())
      check_writable("logging.curve", std::filesystem::path(cfg_.logging.curve).parent_path());
  }
  // The estimate is the config's model's; a model handed in is already allocated.
  if (config_model) check_memory(cfg_, device_, world);

  if (data) {
    train_set_ = std::move(data->train);
    test_set_ = std::move(data->test);
  } else {
    train_set_ = data::load_dataset(cfg_.data, m, false);
    if (data::has_test_set(cfg_.data)) test_set_ = data::load_dataset(cfg_.data, m, true);
  }
  for (const data::Dataset* set : {&train_set_, &test_set_}) {
    if (config_model) check_fits(*set, m);
    check_finite(*set);
  }
  split_ = data::split_indices(train_set_.size, cfg_.data.val_fraction, cfg_.data.seed);
  if (cfg_.data.val_fraction > 0 && split_.val.empty())
    throw ConfigError(detail::concat("data.val_fraction: ", cfg_.data.val_fraction,
                                     " holds out none of the ", train_set_.size, " ",
                                     train_set_.name, " samples (use 0 for no validation)"));
  if (int64_t(split_.train.size()) < cfg_.optim.batch_size)
    throw ConfigError(detail::concat("optim.batch_size: ", cfg_.optim.batch_size, " is larger than the ",
                                     split_.train.size(), " training samples"));
  if (cfg_.optim.batch_size < world * cfg_.optim.microbatches)
    throw ConfigError(detail::concat("optim.batch_size: ", cfg_.optim.batch_size, " samples cannot give ",
                                     world, " ranks ", cfg_.optim.microbatches, " microbatches each"));
  if (cfg_.data.standardize) {
    standardization_ = data::standardization_of(train_set_, split_.train);
    for (data::Dataset* set : {&train_set_, &test_set_})
      data::standardize(set->features, standardization_);
  }
  if (lead()) {
    auto source = [](const data::Dataset& set) {
      return set.file.empty() ? std::string("generated")
                              : set.file + (set.had_header ? ", header line skipped" : "");
    };
    spdlog::info("data: {} {} features, {} classes: {} training, {} validation samples ({}); test: {}",
                 train_set_.name, train_set_.dim, train_set_.classes, split_.train.size(),
                 split_.val.size(), source(train_set_),
                 test_set_.size > 0 ? detail::concat(test_set_.size, " samples (", source(test_set_), ")")
                                    : std::string("none"));
    if (cfg_.data.standardize)
      spdlog::info("data: features standardized by the mean and std of the {} training samples",
                   split_.train.size());
  }
  loader_ = std::make_unique<data::Loader>(train_set_, split_.train, cfg_.optim.batch_size,
                                           cfg_.optim.microbatches, cfg_.data.shuffle, cfg_.data.seed,
                                           comm_ ? comm_->rank() : 0, world);
  // optim.epochs: the run's length in passes over the training split (whole batches only).
  if (cfg_.optim.epochs > 0) {
    cfg_.optim.steps = cfg_.optim.epochs * loader_->steps_per_epoch();
    if (lead())
      spdlog::info("optim.epochs = {}: {} steps ({} per epoch of {} training samples)",
                   cfg_.optim.epochs, cfg_.optim.steps, loader_->steps_per_epoch(), split_.train.size());
  }
  // A warmup longer than the run (a smoke run: --set optim.steps=10) warms up over the whole run.
  if (cfg_.optim.warmup_steps > cfg_.optim.steps) {
    if (lead())
      spdlog::warn("optim.warmup_steps = {} is longer than the run's {} steps: shortened to {}",
                   cfg_.optim.warmup_steps, cfg_.optim.steps, cfg_.optim.steps);
    cfg_.optim.warmup_steps = cfg_.optim.steps;
  }

  if (config_model) {
    manual_seed(cfg_.seed);  // the model's initialization
    model_ = build_model(m);
  }
  if (cfg_.precision.compute_dtype == DType::f64) model_->to(DType::f64);
  model_->to(device_);
  if (cfg_.precision.compute_dtype != DType::f64) model_->set_compute_dtype(cfg_.precision.compute_dtype);

  // After the move to the device: the reducer makes each .grad a view of a bucket there. ZeRO-1
  // (train/zero.h) reduce-scatters the buckets instead, also for a world of one.
  const bool shard = cfg_.optim.shard_state && comm_ != nullptr;
  if (shard && scaler_.enabled())
    throw ConfigError("optim.shard_state: not with f16 loss scaling: the scaler checks every "
                      "gradient for overflow, and a sharded rank holds only its shard of them");
  if (cfg_.optim.shard_state && !shard)
    spdlog::warn("optim.shard_state: one process and no communicator, so nothing to shard over; "
                 "AdamW's state stays whole");
  if (world > 1 || shard)
    reducer_ = std::make_unique<parallel::GradReducer>(model_->parameters(), comm_, size_t(25) << 20, shard);

  const OptimConfig& o = cfg_.optim;
  auto groups = optim::Optimizer::decay_groups(*model_, o.weight_decay);
  if (shard)
    zero_ = std::make_unique<ShardedAdamW>(
        groups, optim::AdamWOptions{o.lr, {o.betas[0], o.betas[1]}, o.eps, o.weight_decay}, comm_, *reducer_);
  else if (o.name == "adamw")
    optimizer_ = std::make_unique<optim::AdamW>(
        groups, optim::AdamWOptions{o.lr, {o.betas[0], o.betas[1]}, o.eps, o.weight_decay});
  else
    optimizer_ = std::make_unique<optim::SGD>(
        groups, optim::SGDOptions{o.lr, o.momentum, o.nesterov, o.weight_decay});
  if (o.schedule == "cosine")
    schedule_ = std::make_unique<optim::WarmupCosineLR>(o.lr, o.warmup_steps, o.steps, o.min_lr);
  else
    schedule_ = std::make_unique<optim::ConstantLR>(o.lr);
}

Trainer::~Trainer() = default;

void Trainer::resume(const std::string& path) {
  // Each candidate is loaded whole; one that does not fit (or holds impossible values) makes a
  // directory fall back to the next newest, so the state ends up all from one checkpoint.
  Checkpoint c = load_checkpoint(path, [&](const Checkpoint& candidate) {
    model_->load_state_dict(candidate.model);
    nn::StateDict optimizer, scaler;
    for (const auto& [name, t] : candidate.optimizer) {
      if (name.starts_with(kScalerPrefix)) scaler.emplace_back(name.substr(kScalerPrefix.size()), t);
      else optimizer.emplace_back(name, t);
    }
    if (zero_) zero_->load_state_dict(optimizer);  // this rank's pieces of the full state
    else optimizer_->load_state_dict(optimizer);
    scaler_.load_state_dict(scaler);
    // Every step is an update or a skipped one (f16 loss scaling); without a scaler the skipped
    // count is unknown (a run may switch from f16 on resume), so it is only a bound.
    const int64_t applied = this->optimizer().steps_taken(), step = candidate.step;
    MT_CHECK(scaler_.enabled() ? applied + scaler_.skipped_steps() == step : applied <= step,
             "the optimizer state has taken ", applied, " steps",
             scaler_.enabled() ? detail::concat(" and skipped ", scaler_.skipped_steps()) : "",
             ", which does not fit the checkpoint's step ", step);
    for (const NamedTensors* state : {&candidate.model, &candidate.optimizer})
      if (std::string bad = first_non_finite(*state); !bad.empty())
        MT_THROW("non-finite values in ", bad, " (a run never saves them)");
  });
  graph_.reset();  // it recorded the optimizer state just replaced
  step_ = c.step;
  resumed_ = true;
  resumed_from_ = c.path;
  if (!c.run_id.empty()) run_id_ = c.run_id;  // the run goes on; a format 1 one gets a new id
  if (lead()) spdlog::info("resumed from {} at step {}", c.path, step_);
}

void Trainer::clip_gradients(const std::vector<Tensor>& params, double max_norm, const Tensor& grad_norm) {
  if (clip_factor_.defined()) optim::grad_norm_and_clip_factor(params, max_norm, grad_norm, clip_factor_);
  else grad_norm.copy_(zero_ ? zero_->clip_grad_norm_(max_norm) : optim::clip_grad_norm_(params, max_norm));
}

std::string Trainer::save(int64_t step, nn::StateDict optimizer) {
  for (const auto& [name, t] : scaler_.state_dict())
    optimizer.emplace_back(std::string(kScalerPrefix) + name, t);
  std::map<std::string, std::string> meta = {{"config", to_yaml(cfg_)}};
  if (!standardization_.empty()) meta["standardization"] = data::to_text(standardization_);
  return save_checkpoint(cfg_.checkpoint.dir, run_id_, step, model_->state_dict(), optimizer, meta,
                         cfg_.checkpoint.keep_last);
}

void Trainer::microbatch_passes(const std::vector<data::Loader::Microbatch>& batches,
                                const Tensor& loss_sum, Metrics* metrics) {
  const int64_t before = comm_ ? comm_->all_reduce_calls() : 0;
  // Metrics read values back, behind the last step's collectives on the stream: wait for those
  // with a bound first, so that a dead peer is an error rather than a hang in the read.
  if (metrics != nullptr && comm_) comm_->synchronize();
  const std::vector<Batch> task_batches = this->task_batches(batches);
  for (size_t i = 0; i < task_batches.size(); ++i) {
    // Normalized by the whole step's sample count (over all ranks): k backward passes on each of
    // N ranks add up to the full batch.
    Tensor loss = task_->loss(*model_, task_batches[i], double(cfg_.optim.batch_size), metrics);
    // The logged step's own loss, a sum like the task's metrics, which the log pairs it with. Read
    // here, where the task read those, before a backward that may start collectives.
    if (metrics != nullptr) (*metrics)["batch_loss"] += loss.item() * double(cfg_.optim.batch_size);
    // Data parallel: the last backward all-reduces each gradient bucket as soon as it is final.
    if (reducer_ && i + 1 == batches.size()) reducer_->prepare_for_last_backward();
    loss.backward(scaler_.seed_for(loss));  // f16: the gradients come out times the scale
    add_into(loss_sum, loss.detach().to(DType::f32));
  }
  if (reducer_) {
    reducer_->finish();
    gradient_all_reduces_ += comm_->all_reduce_calls() - before;
  }
}

std::vector<Batch> Trainer::task_batches(const std::vector<data::Loader::Microbatch>& batches) const {
  std::vector<Batch> out;
  for (const auto& mb : batches) out.push_back({mb.x.to(cfg_.precision.compute_dtype), mb.y});
  return out;
}

double Trainer::sum_over_ranks(double value) {
  if (!comm_ || comm_->size() == 1) return value;
  const Tensor t = full({1}, value, DType::f64, device_);
  comm_->all_reduce_sum(t);
  comm_->synchronize();  // bounded: a dead peer is an error here, not a hang in item()
  return t.item();
}

Metrics Trainer::sum_over_ranks(Metrics metrics) {
  if (!comm_ || comm_->size() == 1 || metrics.empty()) return metrics;
  std::vector<double> values;  // in the map's (name) order, the same on every rank
  for (const auto& [name, v] : metrics) values.push_back(v);
  const Tensor t = from_vector(values, {int64_t(values.size())}, DType::f64).to(device_);
  comm_->all_reduce_sum(t);
  comm_->synchronize();
  const std::vector<double> sums = t.to_vector();
  size_t i = 0;
  for (auto& [name, v] : metrics) v = sums[i++];
  return metrics;
}

RunSummary Trainer::run() {
  const OptimConfig& o = cfg_.optim;
  const DType dt = cfg_.precision.compute_dtype;
  graph_.reset();  // a graph records this run's loss and norm tensors; a second run() makes its own
  if (resumed_ && step_ >= o.steps) {
    // Nothing to train, so nothing is written: no second test record, no rewritten curve.
    if (lead())
      spdlog::info("the run is already complete: {} is at step {} and optim.steps is {} (raise "
                   "optim.steps to train on); nothing to do",
                   resumed_from_, step_, o.steps);
    RunSummary done;
    done.steps = step_;
    done.checkpoint = resumed_from_;
    return done;
  }
  // Rank 0 alone writes the metrics, the curve and the checkpoints, and logs; it owns the folder
  // first (train/run_dir.h), for as long as run() lasts.
  std::optional<RunDir> run_dir;
  std::optional<MetricsWriter> metrics;
  if (lead()) {
    run_dir.emplace(cfg_.checkpoint.dir);
    run_dir->claim(run_id_, !resumed_, metrics_path(cfg_), cfg_.checkpoint.overwrite);
    metrics.emplace(metrics_path(cfg_), resumed_ ? step_ : -1);
  }
  const auto params = model_->parameters();
  const bool tty = is_terminal() && lead();
  RunSummary summary;
  if (lead())
    spdlog::info("training {} on {}: {} parameters, {} steps of {} samples in {} microbatches ({} {})",
                 train_set_.name, device_.str(), [&] {
                   int64_t n = 0;
                   for (auto& p : params) n += p.numel();
                   return n;
                 }(), o.steps, o.batch_size, o.microbatches, dtype_name(dt),
                 cfg_.precision.deterministic ? "deterministic" : "non-deterministic");
  if (reducer_) {
    if (lead())
      spdlog::info("data parallel: {} ranks, {} samples per rank per step; gradients in {} buckets{}:\n{}",
                   comm_->size(), loader_->shard_size(), reducer_->num_buckets(),
                   zero_ ? ", reduce-scattered (ZeRO-1: AdamW's state sharded over the ranks)" : "",
                   reducer_->layout_str());
    parallel::check_same_job(*comm_, job_entries(cfg_, *model_), device_);  // one config, one model
    // The replicas start equal by construction (one seed); rank 0's weights make sure of it.
    NoGradGuard no_grad;
    for (const Tensor& p : params) comm_->broadcast(p, 0);
    comm_->wait();  // the compute copies below read what the broadcasts wrote
    nn::refresh_compute_copies(params);
  }

  auto window_start = std::chrono::steady_clock::now();
  const auto run_start = window_start;
  int64_t window_steps = 0;
  const int64_t first_step = step_;
  int64_t last_check = step_;  // the last step whose loss and gradient norm were read and finite
  Tensor loss_sum = zeros({}, DType::f32, device_);
  // The norm of the last step that was applied: a skipped step has none of its own.
  Tensor grad_norm = zeros({}, dt == DType::f64 ? DType::f64 : DType::f32, device_);
  // An unsharded AdamW folds the clip factor into its update (clip_gradients), read from here.
  struct FoldedClip {
    optim::AdamW* adamw;
    Tensor& factor;
    ~FoldedClip() {  // outside run(), optimizer().step() is a plain step
      if (adamw) adamw->set_grad_scale({});
      factor = {};
    }
  } folded{zero_ ? nullptr : dynamic_cast<optim::AdamW*>(optimizer_.get()), clip_factor_};
  if (folded.adamw) {
    clip_factor_ = zeros({}, device_.is_cpu() ? DType::f64 : DType::f32, device_);
    folded.adamw->set_grad_scale(clip_factor_);
  }
  bool use_graph = cfg_.cuda_graph;
  if (use_graph) {
    if (std::string why = graph_blocker(); !why.empty()) {
      spdlog::warn("cuda_graph: {}; every step runs eagerly", why);
      use_graph = false;
    }
  }
  if (use_graph && (cfg_.logging.every == 1 || cfg_.checkpoint.every == 1))
    spdlog::warn("cuda_graph: every step is logged or saved, and those run eagerly: none is replayed");
  bool warmed_up = false;  // an eager step of this run has created the state a capture records
  double shown_loss = NAN, shown_sps = NAN, last_draw = -1;  // the live line's (terminal only)
  for (; step_ < o.steps; ++step_) {
    const bool log_now = (step_ + 1) % cfg_.logging.every == 0 || step_ + 1 == o.steps;
    const bool eval_now = (step_ + 1) % cfg_.eval.every == 0 || step_ + 1 == o.steps;
    const bool save_now = (step_ + 1) % cfg_.checkpoint.every == 0 || step_ + 1 == o.steps;
    const double lr = schedule_->lr_at(step_);
    optimizer().set_lr(lr);

    Metrics step_metrics;  // filled on logged steps
    double loss = 0, gn = 0;
    // A step that is neither logged nor saved reads nothing back before its update: under
    // cuda_graph it is a replay (the first such step after an eager one is captured).
    const bool quiet = !(log_now || save_now);
    if (use_graph && warmed_up && quiet && !graph_ && !capture_step(loss_sum, grad_norm))
      use_graph = false;
    if (use_graph && quiet && graph_) {
      replay_step();
    } else {
      microbatch_passes(loader_->step_batches(step_, device_), loss_sum, log_now ? &step_metrics : nullptr);
      if (step_callback_) step_callback_(step_ + 1, *this);
      const double scale = scaler_.scale();
      if (comm_ && scaler_.enabled()) comm_->synchronize();  // the scaler reads a flag back
      const bool overflow = scaler_.unscale_and_check(params);  // before clipping sees the norm
      const bool skip = scaler_.update(overflow);
      if (skip) {
        if (tty) std::printf("\r\033[K");
        spdlog::warn("step {}: gradient overflow, loss scale {} -> {}, step skipped", step_ + 1, scale,
                     scaler_.scale());
      } else {
        // max_norm = inf computes the norm for the log without clipping.
        clip_gradients(params, o.clip_norm > 0 ? o.clip_norm : INFINITY, grad_norm);
      }
      // The only host synchronization of a step: reading back what is logged. It comes before the
      // update, so that a NaN or inf stops the run while the tensors that show its origin are intact.
      if (log_now || save_now) {
        if (comm_) comm_->synchronize();  // a dead peer is an error here, not a hang in item()
        // Bad input a kernel recorded (an out-of-range label) belongs to a step since the last check.
        check_device_errors(device_, detail::concat("step ", step_ + 1, step_ > last_check
            ? detail::concat(" or an earlier step since step ", last_check) : ""));
        // This step's loss is in the sum; with data parallelism, each rank's share of it.
        loss = sum_over_ranks(loss_sum.item()) / double(window_steps + 1);
        gn = grad_norm.item();
        if (!std::isfinite(loss) || !std::isfinite(gn))
          throw NonFiniteError(detail::concat(
              "step ", step_ + 1, ": ", find_non_finite(*model_, *task_, task_batches(loader_->step_batches(step_, device_)),
                              double(o.batch_size)), "; loss ", loss,
              ", gradient norm ", gn,
              step_ > last_check ? detail::concat(" (the first check since step ", last_check,
                                                  "; logging.every=1 checks every step)")
                                 : "",
              "; stopping without saving (the last checkpoint on disk is intact)"));
        last_check = step_ + 1;
      }
      if (!skip && zero_) zero_->step();  // this rank's shard, then the all-gather
      else if (!skip) optimizer_->step();
      // A skipped step's gradients are dropped too. Under a CUDA graph, or when .grad is a view of
      // a data-parallel bucket, .grad keeps its buffer.
      if (zero_) zero_->zero_grad();
      else optimizer_->zero_grad(/*set_to_none=*/!use_graph && !reducer_);
    }
    warmed_up = true;
    ++window_steps;

    const double elapsed = seconds_since(run_start);
    const double eta = elapsed / double(step_ + 1 - first_step) * double(o.steps - step_ - 1);
    // The live line, redrawn at most ten times a second (and on the last step); "\033[K" clears
    // what a longer line before it left.
    if (tty && (elapsed - last_draw >= 0.1 || step_ + 1 == o.steps)) {
      last_draw = elapsed;
      std::printf("\r%s\033[K", progress_line(step_ + 1, o.steps, shown_loss, shown_sps, elapsed, eta).c_str());
      std::fflush(stdout);
    }
    if (!(log_now || save_now || eval_now)) continue;

    if (log_now) {
      const double secs = seconds_since(window_start);
      const double sps = double(window_steps * o.batch_size) / secs;
      Metrics means = sum_over_ranks(step_metrics);
      for (auto& [name, v] : means) v /= double(o.batch_size);
      const double batch_loss = means["batch_loss"];
      means.erase("batch_loss");
      // "loss" is the window's mean; the task's metrics (accuracy) are the logged step's batch,
      // shown beside that batch's own loss so that the two describe the same samples.
      std::string shown = " | batch: loss " + format_value(batch_loss);
      for (const auto& [name, v] : means) shown += " " + name + " " + format_value(v);
      if (tty) std::printf("\r\033[K");
      if (lead())
        spdlog::info("step {:>{}}/{} | loss {}{} | grad_norm {} | lr {} | {:.0f} samples/s | "
                     "{} ms/step | {} elapsed, {} left",
                     step_ + 1, std::to_string(o.steps).size(), o.steps, format_value(loss), shown,
                     format_value(gn), format_value(lr), sps,
                     format_value(1e3 * secs / double(window_steps)), format_duration(elapsed),
                     format_duration(eta));
      shown_loss = loss;
      shown_sps = sps;
      nlohmann::json record = {{"step", step_ + 1}, {"loss", loss}, {"batch_loss", batch_loss},
                               {"grad_norm", gn}, {"lr", lr}, {"samples_per_s", sps},
                               {"ms_per_step", 1e3 * secs / double(window_steps)}};
      for (const auto& [name, v] : means) record[name] = v;
      if (scaler_.enabled()) {
        record["loss_scale"] = scaler_.scale();
        record["skipped_steps"] = scaler_.skipped_steps();
      }
#ifdef MT_WITH_CUDA
      // Device memory held by live tensors: flat over a run unless something leaks.
      if (device_.is_cuda()) record["pool_bytes"] = cuda::pool_used_bytes(device_.index);
#endif
      if (reducer_) record["gradient_all_reduces"] = gradient_all_reduces_;
      if (metrics) metrics->write(record);
      summary.train_loss = loss;
      loss_sum.fill_(0.0);
      window_steps = 0;
      window_start = std::chrono::steady_clock::now();
    }
    if (eval_now && !split_.val.empty()) {
      if (comm_) comm_->synchronize();  // evaluation reads values back
      Evaluation e = evaluate(*model_, *task_, train_set_, split_.val, cfg_.eval.batch_size, device_, dt);
      if (metrics) {
        if (tty) std::printf("\r\033[K");
        spdlog::info("step {:>{}}/{} | val_loss {}{}", step_ + 1, std::to_string(o.steps).size(),
                     o.steps, format_value(e.loss), metrics_text(e.metrics, "val_"));
        nlohmann::json record = {{"step", step_ + 1}, {"val_loss", e.loss}};
        for (const auto& [name, v] : e.metrics) record["val_" + name] = v;
        metrics->write(record);
      }
      summary.val_loss = e.loss;
      summary.val_metrics = e.metrics;
    }
    if (save_now) {
      // A NaN the loss never saw (behind a ReLU, say, or in the optimizer's state) stops here.
      // Sharded, the full state is gathered: every rank takes part.
      nn::StateDict optimizer = zero_ ? zero_->state_dict() : optimizer_->state_dict();
      for (const nn::StateDict& state : {model_->state_dict(), optimizer})
        if (std::string bad = first_non_finite(state); !bad.empty())
          throw NonFiniteError(detail::concat("step ", step_ + 1, ": non-finite values in ", bad,
                                              "; not saving (the last checkpoint on disk is intact)"));
      if (lead()) summary.checkpoint = save(step_ + 1, std::move(optimizer));
      if (comm_) comm_->barrier();  // no rank runs ahead of a checkpoint it could be resumed from
    }
  }
  summary.steps = step_;
  if (reducer_ && lead() && !zero_)
    spdlog::info("data parallel: {} gradient all-reduces in {} steps ({} buckets)", gradient_all_reduces_,
                 step_ - first_step, reducer_->num_buckets());
  if (zero_ && lead())
    spdlog::info("ZeRO-1: {} bytes of AdamW state on rank 0 of {}; per step {} reduce-scatters, 1 "
                 "all-reduce (the gradient norm) and {} all-gathers", zero_->state_bytes(),
                 comm_->size(), reducer_->num_buckets(), reducer_->num_buckets());

  if (test_set_.size > 0) {
    std::vector<int64_t> all(static_cast<size_t>(test_set_.size));
    for (int64_t i = 0; i < test_set_.size; ++i) all[size_t(i)] = i;
    Evaluation e = evaluate(*model_, *task_, test_set_, all, cfg_.eval.batch_size, device_, dt);
    if (metrics) {
      spdlog::info("test: loss {}{} ({} samples)", format_value(e.loss), metrics_text(e.metrics, ""),
                   test_set_.size);
      nlohmann::json record = {{"step", step_}, {"test_loss", e.loss}};
      for (const auto& [name, v] : e.metrics) record["test_" + name] = v;
      metrics->write(record);
    }
    summary.test_loss = e.loss;
    summary.test_metrics = e.metrics;
  }
  if (!metrics) return summary;
  write_curve_svg(curve_path(cfg_), read_curves(metrics->path()),
                  "minitrain: " + train_set_.name + " " + model_->repr() + ", " + dtype_name(dt));
  spdlog::info("done: {} steps; metrics {}; curve {}; checkpoint {}", summary.steps, metrics->path(),
               curve_path(cfg_), summary.checkpoint.empty() ? "(none)" : summary.checkpoint);
  return summary;
}

}  // namespace mt::train
