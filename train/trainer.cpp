#include "train/trainer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include <spdlog/spdlog.h>

#include "core/accumulate.h"
#include "core/autograd.h"
#include "core/registry.h"
#include "core/safetensors.h"
#include "core/switches.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/sgd.h"
#include "parallel/job_check.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/forensics.h"
#include "train/metrics.h"
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

// check_output_paths() for one path.
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

// f16 is the one compute dtype whose range needs loss scaling; bf16 has fp32's exponent range.
optim::LossScalerOptions loss_scaler_options(const PrecisionOptions& p) {
  if (p.compute_dtype != DType::f16) return {optim::LossScaleMode::none};
  return p.loss_scale;
}

// The loss scaler's state travels in the optimizer file under this prefix.
constexpr std::string_view kScalerPrefix = "loss_scaler.";

// The run's length (options.steps) in each checkpoint's metadata.
constexpr const char* kRunStepsKey = "run_steps";

// What run `run_id` ended at `last_step` with, as its records in the metrics file `path` say:
// the last logged loss and the last validation of steps up to that one, and the test set's of
// that step alone (a run measures it once, after its last save: a record of an earlier end is
// another model's), each with its metrics ("val_accuracy" is the validation's "accuracy"). What
// no record says stays NaN; so does everything when `path` is not a regular file (a pipe).
RunSummary recorded_summary(const std::string& path, const std::string& run_id,
                            int64_t last_step) {
  RunSummary s;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return s;
  const auto metrics_of = [](const nlohmann::json& record, std::string_view prefix) {
    Metrics m;
    for (const auto& [key, v] : record.items())
      if (key.starts_with(prefix) && key != std::string(prefix) + "loss" && v.is_number())
        m[key.substr(prefix.size())] = v.get<double>();
    return m;
  };
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool ours = j.is_object() && j.contains("run_id") && j["run_id"] == run_id;
    if (!ours || !j.contains("step") || !j["step"].is_number_integer() ||
        j["step"].get<int64_t>() > last_step)
      continue;
    if (j.contains("loss") && j["loss"].is_number()) s.train_loss = j["loss"].get<double>();
    if (j.contains("val_loss") && j["val_loss"].is_number()) {
      s.val_loss = j["val_loss"].get<double>();
      s.val_metrics = metrics_of(j, "val_");
    }
    if (j.contains("test_loss") && j["test_loss"].is_number() && j["step"] == last_step) {
      s.test_loss = j["test_loss"].get<double>();
      s.test_metrics = metrics_of(j, "test_");
    }
  }
  return s;
}

bool is_terminal() { return ::isatty(::fileno(stdout)) == 1; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string metrics_path(const Options& o) {
  if (!o.logging.metrics.empty()) return o.logging.metrics;
  return (std::filesystem::path(o.checkpoint.dir) / "metrics.jsonl").string();
}

std::string curve_path(const Options& o) {
  if (!o.logging.curve.empty()) return o.logging.curve;
  return (std::filesystem::path(o.checkpoint.dir) / "curve.svg").string();
}

void check_output_paths(const Options& o) {
  check_writable("checkpoint.dir", o.checkpoint.dir);
  if (!o.logging.metrics.empty())
    check_writable("logging.metrics", std::filesystem::path(o.logging.metrics).parent_path());
  if (!o.logging.curve.empty())
    check_writable("logging.curve", std::filesystem::path(o.logging.curve).parent_path());
  // A folder where a file goes would fail only when first written: the curve, at the run's end.
  // Two outputs at one path, or one named as a checkpoint (any run's), a config or a lock, would
  // write over each other or over what a run keeps.
  namespace fs = std::filesystem;
  auto normal = [](const std::string& p) { return fs::absolute(p).lexically_normal(); };
  const std::string metrics = metrics_path(o), curve = curve_path(o);
  for (const auto& [key, path] : {std::pair{"logging.metrics", metrics}, {"logging.curve", curve}}) {
    std::error_code ec;
    if (fs::is_directory(path, ec))
      throw ConfigError(detail::concat(key, ": '", path, "' is a directory; name a file"));
    const fs::path p = normal(path);
    const std::string ext = p.extension().string();
    if (ext == ".safetensors" || ext == ".yaml" || ext == ".yml" || ext == ".lock" ||
        p.filename() == ".lock")
      throw ConfigError(detail::concat(key, ": '", path, "' is a name of the files a run keeps ",
                                       "(a checkpoint, a config, a lock); name another file"));
  }
  if (normal(metrics) == normal(curve))
    throw ConfigError(detail::concat("logging.metrics and logging.curve: both are '", metrics,
                                     "'; name two files"));
}

Trainer::Trainer(Options options, std::shared_ptr<nn::Module> model, std::shared_ptr<Task> task,
                 std::shared_ptr<data::Source> data, Device device,
                 std::shared_ptr<parallel::Communicator> comm)
    : options_(std::move(options)), device_(device), comm_(std::move(comm)),
      model_(std::move(model)), task_(std::move(task)), data_(std::move(data)),
      scaler_(loss_scaler_options(options_.precision)), run_id_(random_id()) {
  MT_CHECK(model_, "Trainer: the model is null");
  MT_CHECK(task_, "Trainer: the task is null");
  MT_CHECK(data_, "Trainer: the data source is null");
  validate(options_);
  verify_ops();  // every op this build can run has its kernels, with the signatures it declares
  const int world = comm_ ? comm_->size() : 1;
  const PrecisionOptions& precision = options_.precision;
  set_deterministic(precision.deterministic);
  set_gemm_autotune(precision.gemm_autotune);
  if (!precision.deterministic) spdlog::warn("deterministic: false: reductions may use atomics");
  MT_CHECK(device_.is_cpu() || precision.compute_dtype != DType::f64,
           "precision.compute_dtype: f64 runs on the CPU only");
  if (lead()) check_output_paths(options_);

  data_->shard(comm_ ? comm_->rank() : 0, world);
  if (lead())
    for (const std::string& line : data_->describe()) spdlog::info("data: {}", line);
  // epochs: the run's length in passes over the training data (whole batches only).
  if (options_.epochs > 0) {
    options_.steps = options_.epochs * data_->steps_per_epoch();
    if (lead())
      spdlog::info("optim.epochs = {}: {} steps ({} per epoch of {} training samples)",
                   options_.epochs, options_.steps, data_->steps_per_epoch(), data_->size());
  }
  // A warmup longer than the run (a smoke run: --set optim.steps=10) warms up over the whole run.
  ScheduleOptions& schedule = options_.schedule;
  if (schedule.warmup_steps > options_.steps) {
    if (lead())
      spdlog::warn("optim.warmup_steps = {} is longer than the run's {} steps: shortened to {}",
                   schedule.warmup_steps, options_.steps, options_.steps);
    schedule.warmup_steps = options_.steps;
  }

  if (precision.compute_dtype == DType::f64) model_->to(DType::f64);
  model_->to(device_);
  if (precision.compute_dtype != DType::f64) model_->set_compute_dtype(precision.compute_dtype);

  // After the move to the device: the reducer makes each .grad a view of a bucket there. ZeRO-1
  // (train/zero.h) reduce-scatters the buckets instead, also for a world of one.
  const OptimizerOptions& o = options_.optimizer;
  const bool shard = o.shard_state && comm_ != nullptr;
  if (shard && scaler_.enabled())
    throw ConfigError("optim.shard_state: not with f16 loss scaling: the scaler checks every "
                      "gradient for overflow, and a sharded rank holds only its shard of them");
  if (o.shard_state && !shard)
    spdlog::warn("optim.shard_state: one process and no communicator, so nothing to shard over; "
                 "AdamW's state stays whole");
  if (world > 1 || shard)
    reducer_ = std::make_unique<parallel::GradReducer>(model_->parameters(), comm_, size_t(25) << 20, shard);

  auto groups = optim::Optimizer::decay_groups(*model_, o.weight_decay);
  const optim::AdamWOptions adamw{o.lr, {o.betas[0], o.betas[1]}, o.eps, o.weight_decay};
  if (shard)
    zero_ = std::make_unique<ShardedAdamW>(groups, adamw, comm_, *reducer_);
  else if (o.name == "adamw")
    optimizer_ = std::make_unique<optim::AdamW>(groups, adamw);
  else
    optimizer_ = std::make_unique<optim::SGD>(
        groups, optim::SGDOptions{o.lr, o.momentum, o.nesterov, o.weight_decay});
  if (schedule.kind == "cosine")
    schedule_ = std::make_unique<optim::WarmupCosineLR>(o.lr, schedule.warmup_steps,
                                                        options_.steps, schedule.min_lr);
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
    for (const nn::StateDict* state : {&candidate.model, &candidate.optimizer})
      if (std::string bad = first_non_finite(*state); !bad.empty())
        MT_THROW("non-finite values in ", bad, " (a run never saves them)");
  });
  graph_.reset();  // it recorded the optimizer state just replaced
  step_ = c.step;
  resumed_ = true;
  resumed_from_ = c.path;
  std::error_code ec;
  resumed_newest_ = std::filesystem::is_directory(path, ec) &&
                    std::filesystem::equivalent(path, options_.checkpoint.dir, ec);
  if (!c.run_id.empty()) run_id_ = c.run_id;  // the run goes on; a format 1 one gets a new id
  // keep_best: a resumed run replaces this run's best only with a lower validation loss.
  best_val_loss_ = INFINITY;
  const std::string best = best_checkpoint_path(options_.checkpoint.dir);
  if (std::filesystem::exists(best, ec)) {
    try {
      const auto meta = read_safetensors_metadata(best);
      if (meta.contains("val_loss") && meta.contains("run_id") && meta.at("run_id") == run_id_)
        best_val_loss_ = std::stod(meta.at("val_loss"));
    } catch (const std::exception& e) {
      spdlog::warn("checkpoint.keep_best: cannot read {} ({}); the next validation replaces it", best,
                   e.what());
    }
  }
  if (lead()) spdlog::info("resumed from {} at step {}", c.path, step_);
  if (auto saved = c.metadata.find(kRunStepsKey); saved != c.metadata.end() && lead()) {
    char* end = nullptr;
    const long long steps = std::strtoll(saved->second.c_str(), &end, 10);
    if (*end == '\0' && steps > 0) note_new_length(steps);
  }
}

// The schedule is a function of the run's length: one resumed with another length follows the
// new curve from the resumed step on, rather than the one it was trained on so far.
void Trainer::note_new_length(int64_t saved_steps) const {
  const ScheduleOptions& s = options_.schedule;
  if (saved_steps == options_.steps || s.kind != "cosine" || step_ >= options_.steps) return;
  const optim::WarmupCosineLR old(options_.optimizer.lr, std::min(s.warmup_steps, saved_steps),
                                  saved_steps, s.min_lr);
  spdlog::info("the run was {} steps long and is now {}: the cosine schedule is recomputed over {} "
               "steps, so the learning rate goes from {} at step {} (the old schedule) to {} at step {}",
               saved_steps, options_.steps, options_.steps, format_value(old.lr_at(step_ - 1)), step_,
               format_value(schedule_->lr_at(step_)), step_ + 1);
}

// ---- one step ------------------------------------------------------------------------------

void Trainer::microbatch_passes(const std::vector<data::Batch>& batches, const Tensor& loss_sum,
                                Metrics* metrics) {
  const int64_t before = comm_ ? comm_->all_reduce_calls() : 0;
  // Metrics read values back, behind the last step's collectives on the stream: wait for those
  // with a bound first, so that a dead peer is an error rather than a hang in the read.
  if (metrics != nullptr && comm_) comm_->synchronize();
  const std::vector<data::Batch> task_batches = this->task_batches(batches);
  const double batch = double(data_->batch_size());
  for (size_t i = 0; i < task_batches.size(); ++i) {
    // Normalized by the whole step's sample count (over all ranks): k backward passes on each of
    // N ranks add up to the full batch.
    Tensor loss = task_->loss(*model_, task_batches[i], batch, metrics);
    // The logged step's own loss, a sum like the task's metrics, which the log pairs it with. Read
    // here, where the task read those, before a backward that may start collectives.
    if (metrics != nullptr) (*metrics)["batch_loss"] += loss.item() * batch;
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

std::vector<data::Batch> Trainer::task_batches(const std::vector<data::Batch>& batches) const {
  std::vector<data::Batch> out;
  for (const data::Batch& b : batches) out.push_back(to_compute_dtype(b, options_.precision.compute_dtype));
  return out;
}

bool Trainer::unscale(const std::vector<Tensor>& params) {
  const double scale = scaler_.scale();
  if (comm_ && scaler_.enabled()) comm_->synchronize();  // the scaler reads a flag back
  const bool overflow = scaler_.unscale_and_check(params);  // before clipping sees the norm
  const bool skip = scaler_.update(overflow);
  if (skip) {
    if (is_terminal() && lead()) std::printf("\r\033[K");
    spdlog::warn("step {}: gradient overflow, loss scale {} -> {}, step skipped", step_ + 1, scale,
                 scaler_.scale());
  }
  return skip;
}

void Trainer::clip_gradients(const std::vector<Tensor>& params, double max_norm, const Tensor& grad_norm) {
  if (clip_factor_.defined()) optim::grad_norm_and_clip_factor(params, max_norm, grad_norm, clip_factor_);
  else grad_norm.copy_(zero_ ? zero_->clip_grad_norm_(max_norm) : optim::clip_grad_norm_(params, max_norm));
}

void Trainer::update(bool skip, bool keep_grads) {
  if (!skip && zero_) zero_->step();  // this rank's shard, then the all-gather
  else if (!skip) optimizer_->step();
  // A skipped step's gradients are dropped too. Under a CUDA graph, or when .grad is a view of a
  // data-parallel bucket, .grad keeps its buffer.
  if (zero_) zero_->zero_grad();
  else optimizer_->zero_grad(/*set_to_none=*/!keep_grads && !reducer_);
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

std::string Trainer::save(int64_t step, nn::StateDict optimizer, std::optional<double> best_val_loss) {
  for (const auto& [name, t] : scaler_.state_dict())
    optimizer.emplace_back(std::string(kScalerPrefix) + name, t);
  std::map<std::string, std::string> meta = options_.checkpoint.metadata;
  for (const auto& [key, value] : data_->metadata()) meta[key] = value;
  meta[kRunStepsKey] = std::to_string(options_.steps);  // the schedule's length, for resume()
  if (best_val_loss)
    return save_best_checkpoint(options_.checkpoint.dir, run_id_, step, *best_val_loss,
                                model_->state_dict(), optimizer, meta);
  return save_checkpoint(options_.checkpoint.dir, run_id_, step, model_->state_dict(), optimizer,
                         meta, options_.checkpoint.keep_last);
}

// ---- the run -------------------------------------------------------------------------------

struct Trainer::RunState {
  // An optimizer that folds the clip factor into its update (clip_gradients) reads it from
  // clip_factor_ during run(); outside run(), optimizer().step() is a plain step.
  struct FoldedClip {
    optim::Optimizer* folding = nullptr;
    Tensor* factor = nullptr;
    FoldedClip() = default;
    FoldedClip(const FoldedClip&) = delete;
    FoldedClip& operator=(const FoldedClip&) = delete;
    ~FoldedClip() {
      if (folding) folding->set_grad_scale({});
      if (factor) *factor = {};
    }
  };

  std::optional<RunDir> run_dir;  // rank 0's: the folder is the run's while it lasts
  std::optional<MetricsWriter> metrics;  // rank 0's
  std::vector<Tensor> params;
  bool tty = false;
  RunSummary summary;
  std::chrono::steady_clock::time_point run_start, window_start;
  int64_t window_steps = 0;
  int64_t first_step = 0;
  int64_t last_check = 0;  // the last step whose loss and gradient norm were read and finite
  Tensor loss_sum;         // the window's losses, on the device
  Tensor grad_norm;        // the last applied step's (a skipped step has none of its own)
  FoldedClip folded;
  bool use_graph = false;
  bool warmed_up = false;  // an eager step of this run has created the state a capture records
  // The logged step's values.
  Metrics step_metrics;
  double loss = 0, grad_norm_value = 0, lr = 0;
  double last_draw = -1;  // when the live line was drawn (terminal only)
};

RunSummary Trainer::run() {
  graph_.reset();  // a graph records this run's loss and norm tensors; a second run() makes its own
  if (resumed_ && step_ >= options_.steps) {
    // Nothing to train, so nothing is written: no second test record, no rewritten curve. The
    // summary is the one the run ended with, read back from what it logged.
    if (lead())
      spdlog::info("the run is already complete: {} is at step {} and optim.steps is {} (raise "
                   "optim.steps to train on); nothing to do",
                   resumed_from_, step_, options_.steps);
    RunSummary done =
        lead() ? recorded_summary(metrics_path(options_), run_id_, step_) : RunSummary{};
    done.steps = step_;
    done.checkpoint = resumed_from_;
    return done;
  }
  RunState r;
  begin_run(r);
  for (; step_ < options_.steps; ++step_) {
    const Due due = this->due();
    r.lr = schedule_->lr_at(step_);
    optimizer().set_lr(r.lr);
    // A step that is neither logged nor saved reads nothing back before its update: under
    // cuda_graph it is a replay (the first such step after an eager one is captured).
    const bool quiet = !(due.log || due.save);
    if (r.use_graph && r.warmed_up && quiet && !graph_ && !capture_step(r.loss_sum, r.grad_norm))
      r.use_graph = false;
    if (r.use_graph && quiet && graph_) replay_step();
    else train_step(r, due);
    r.warmed_up = true;
    ++r.window_steps;
    show_progress(r);
    if (due.log) log_step(r);
    if (due.eval) run_validation(r);
    if (due.save) save_step(r);
  }
  return end_run(r);
}

Trainer::Due Trainer::due() const {
  auto every = [&](int64_t n) { return (step_ + 1) % n == 0 || step_ + 1 == options_.steps; };
  return {every(options_.logging.every), every(options_.eval.every), every(options_.checkpoint.every)};
}

void Trainer::begin_run(RunState& r) {
  // Rank 0 alone writes the metrics, the curve and the checkpoints, and logs; it owns the folder
  // first (train/run_dir.h), for as long as run() lasts.
  if (lead()) {
    r.run_dir.emplace(options_.checkpoint.dir);
    r.run_dir->lock_file("logging.metrics", metrics_path(options_));
    r.run_dir->lock_file("logging.curve", curve_path(options_));
    r.run_dir->claim(run_id_, resumed_ ? step_ : -1, resumed_newest_, metrics_path(options_),
                     curve_path(options_), options_.checkpoint.overwrite);
    r.metrics.emplace(metrics_path(options_), resumed_ ? step_ : -1, run_id_,
                      options_.checkpoint.overwrite);
  }
  r.params = model_->parameters();
  r.tty = is_terminal() && lead();
  const DType dt = options_.precision.compute_dtype;
  if (lead()) {
    int64_t n = 0;
    for (const Tensor& p : r.params) n += p.numel();
    spdlog::info("training {} on {}: {} parameters, {} steps of {} samples in {} microbatches ({} {})",
                 data_->name(), device_.str(), n, options_.steps, data_->batch_size(),
                 data_->microbatches(), dtype_name(dt),
                 options_.precision.deterministic ? "deterministic" : "non-deterministic");
  }
  if (reducer_) {
    if (lead())
      spdlog::info("data parallel: {} ranks, {} samples per rank per step; gradients in {} bucket{}{}:\n{}",
                   comm_->size(), data_->shard_size(), reducer_->num_buckets(),
                   reducer_->num_buckets() == 1 ? "" : "s",
                   zero_ ? ", reduce-scattered (ZeRO-1: AdamW's state sharded over the ranks)" : "",
                   reducer_->layout_str());
    parallel::JobEntries job = options_.job_keys;  // one config, one model, one starting step
    // Rank 0's weights are broadcast below, but not its optimizer state or data position: ranks
    // resumed from different checkpoints (stale folders without a shared filesystem) would part.
    job.emplace_back("resumed at step", std::to_string(step_));
    for (const auto& [name, p] : model_->named_parameters())
      job.emplace_back("param." + name, shape_str(p.shape()) + " " + dtype_name(p.dtype()));
    parallel::check_same_job(*comm_, job, device_);
    // The replicas start equal by construction (one seed); rank 0's weights make sure of it.
    NoGradGuard no_grad;
    for (const Tensor& p : r.params) comm_->broadcast(p, 0);
    comm_->wait();  // the compute copies below read what the broadcasts wrote
    nn::refresh_compute_copies(r.params);
  }
  r.window_start = r.run_start = std::chrono::steady_clock::now();
  r.first_step = r.last_check = step_;
  r.loss_sum = zeros({}, DType::f32, device_);
  r.grad_norm = zeros({}, dt == DType::f64 ? DType::f64 : DType::f32, device_);
  if (!zero_) {
    clip_factor_ = zeros({}, device_.is_cpu() ? DType::f64 : DType::f32, device_);
    r.folded.factor = &clip_factor_;
    if (optimizer_->set_grad_scale(clip_factor_)) r.folded.folding = optimizer_.get();
    else clip_factor_ = {};
  }
  r.use_graph = options_.cuda_graph;
  if (r.use_graph) {
    if (std::string why = graph_blocker(); !why.empty()) {
      spdlog::warn("cuda_graph: {}; every step runs eagerly", why);
      r.use_graph = false;
    }
  }
  if (r.use_graph && (options_.logging.every == 1 || options_.checkpoint.every == 1))
    spdlog::warn("cuda_graph: every step is logged or saved, and those run eagerly: none is replayed");
}

// Steps 1-5 of the header, eagerly; a logged or saved step reads its loss and gradient norm back
// before the update.
void Trainer::train_step(RunState& r, const Due& due) {
  r.step_metrics.clear();
  microbatch_passes(data_->step_batches(step_, device_), r.loss_sum, due.log ? &r.step_metrics : nullptr);
  if (step_callback_) step_callback_(step_ + 1, *this);
  const bool skip = unscale(r.params);
  // max_norm = inf computes the norm for the log without clipping.
  const double clip = options_.optimizer.clip_norm;
  if (!skip) clip_gradients(r.params, clip > 0 ? clip : INFINITY, r.grad_norm);
  if (due.log || due.save) read_back(r);
  update(skip, /*keep_grads=*/r.use_graph);
}

// The only host synchronization of a step: reading back what is logged. It comes before the
// update, so that a NaN or inf stops the run while the tensors that show its origin are intact.
void Trainer::read_back(RunState& r) {
  if (comm_) comm_->synchronize();  // a dead peer is an error here, not a hang in item()
  // Bad input a kernel recorded (an out-of-range label) belongs to a step since the last check.
  check_device_errors(device_, detail::concat("step ", step_ + 1, step_ > r.last_check
      ? detail::concat(" or an earlier step since step ", r.last_check) : ""));
  // This step's loss is in the sum; with data parallelism, each rank's share of it.
  r.loss = sum_over_ranks(r.loss_sum.item()) / double(r.window_steps + 1);
  r.grad_norm_value = r.grad_norm.item();
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm_value))
    throw NonFiniteError(detail::concat(
        "step ", step_ + 1, ": ",
        find_non_finite(*model_, *task_, task_batches(data_->step_batches(step_, device_)),
                        double(data_->batch_size())),
        "; loss ", r.loss, ", gradient norm ", r.grad_norm_value,
        step_ > r.last_check ? detail::concat(" (the first check since step ", r.last_check,
                                              "; logging.every=1 checks every step)")
                             : "",
        "; stopping without saving (the last checkpoint on disk is intact)"));
  r.last_check = step_ + 1;
}

// The live line, redrawn at most ten times a second (and on the last step); "\033[K" clears what
// a longer line before it left. Its loss and throughput are the current logging window's so far,
// so they move between log lines (and on the window's last step equal what the log line prints).
// Reading the loss back stops the device once per redraw, not once per step. With data
// parallelism the loss is rank 0's samples' alone: averaging over the ranks would take a
// collective that only this rank calls.
void Trainer::show_progress(RunState& r) {
  if (!r.tty) return;
  const double elapsed = seconds_since(r.run_start);
  if (elapsed - r.last_draw < 0.1 && step_ + 1 != options_.steps) return;
  const double eta = elapsed / double(step_ + 1 - r.first_step) * double(options_.steps - step_ - 1);
  r.last_draw = elapsed;
  // loss_sum holds this rank's share of each step's loss (normalized by the whole batch).
  const double share = double(data_->shard_size()) / double(data_->batch_size());
  const double loss = r.loss_sum.item() / share / double(r.window_steps);
  const double sps = double(r.window_steps * data_->batch_size()) / seconds_since(r.window_start);
  std::printf("\r%s\033[K", progress_line(step_ + 1, options_.steps, loss, sps, elapsed, eta).c_str());
  std::fflush(stdout);
}

void Trainer::log_step(RunState& r) {
  const double elapsed = seconds_since(r.run_start);
  const double eta = elapsed / double(step_ + 1 - r.first_step) * double(options_.steps - step_ - 1);
  const double secs = seconds_since(r.window_start);
  const int64_t batch = data_->batch_size();
  const double sps = double(r.window_steps * batch) / secs;
  Metrics means = sum_over_ranks(r.step_metrics);
  for (auto& [name, v] : means) v /= double(batch);
  const double batch_loss = means["batch_loss"];
  means.erase("batch_loss");
  task_->add_derived_metrics(batch_loss, means);
  // "loss" is the window's mean; the task's metrics (accuracy) are the logged step's batch, shown
  // beside that batch's own loss so that the two describe the same samples.
  std::string shown = " | batch: loss " + format_value(batch_loss);
  for (const auto& [name, v] : means) shown += " " + name + " " + format_value(v);
  if (r.tty) std::printf("\r\033[K");
  if (lead())
    spdlog::info("step {:>{}}/{} | loss {}{} | grad_norm {} | lr {} | {:.0f} samples/s | "
                 "{} ms/step | {} elapsed, {} left",
                 step_ + 1, std::to_string(options_.steps).size(), options_.steps,
                 format_value(r.loss), shown, format_value(r.grad_norm_value), format_value(r.lr),
                 sps, format_value(1e3 * secs / double(r.window_steps)), format_duration(elapsed),
                 format_duration(eta));
  nlohmann::json record = {{"step", step_ + 1}, {"loss", r.loss}, {"batch_loss", batch_loss},
                           {"grad_norm", r.grad_norm_value}, {"lr", r.lr}, {"samples_per_s", sps},
                           {"ms_per_step", 1e3 * secs / double(r.window_steps)}};
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
  if (r.metrics) r.metrics->write(record);
  r.summary.train_loss = r.loss;
  r.loss_sum.fill_(0.0);
  r.window_steps = 0;
  r.window_start = std::chrono::steady_clock::now();
}

void Trainer::run_validation(RunState& r) {
  if (data_->held_out_size(data::HeldOut::validation) == 0) return;
  if (comm_) comm_->synchronize();  // evaluation reads values back
  const Evaluation e = evaluate(*model_, *task_, *data_, data::HeldOut::validation,
                                options_.eval.batch_size, device_, options_.precision.compute_dtype);
  if (r.metrics) {
    if (r.tty) std::printf("\r\033[K");
    spdlog::info("step {:>{}}/{} | val_loss {}{}", step_ + 1, std::to_string(options_.steps).size(),
                 options_.steps, format_value(e.loss), metrics_text(e.metrics, "val_"));
    nlohmann::json record = {{"step", step_ + 1}, {"val_loss", e.loss}};
    for (const auto& [name, v] : e.metrics) record["val_" + name] = v;
    r.metrics->write(record);
  }
  r.summary.val_loss = e.loss;
  r.summary.val_metrics = e.metrics;
  // keep_best: rank 0's best (the one its folder holds) decides for every rank, since the save
  // below may be a collective (state_to_save) that every rank must join.
  bool best = options_.checkpoint.keep_best && e.loss < best_val_loss_;
  if (options_.checkpoint.keep_best && comm_) best = sum_over_ranks(lead() && best ? 1.0 : 0.0) > 0;
  if (best) {
    nn::StateDict optimizer = state_to_save();
    if (lead()) {
      const std::string path = save(step_ + 1, std::move(optimizer), e.loss);
      spdlog::info("step {:>{}}/{} | the best val_loss so far: saved {}", step_ + 1,
                   std::to_string(options_.steps).size(), options_.steps, path);
    }
    best_val_loss_ = e.loss;
    if (comm_) comm_->barrier();
  }
}

nn::StateDict Trainer::state_to_save() {
  // A NaN the loss never saw (behind a ReLU, say, or in the optimizer's state) stops here.
  // Sharded, the full state is gathered: every rank takes part.
  nn::StateDict optimizer = zero_ ? zero_->state_dict() : optimizer_->state_dict();
  for (const nn::StateDict& state : {model_->state_dict(), optimizer})
    if (std::string bad = first_non_finite(state); !bad.empty())
      throw NonFiniteError(detail::concat("step ", step_ + 1, ": non-finite values in ", bad,
                                          "; not saving (the last checkpoint on disk is intact)"));
  return optimizer;
}

void Trainer::save_step(RunState& r) {
  nn::StateDict optimizer = state_to_save();
  if (lead()) r.summary.checkpoint = save(step_ + 1, std::move(optimizer));
  if (comm_) comm_->barrier();  // no rank runs ahead of a checkpoint it could be resumed from
}

RunSummary Trainer::end_run(RunState& r) {
  RunSummary& summary = r.summary;
  summary.steps = step_;
  if (reducer_ && lead() && !zero_)
    spdlog::info("data parallel: {} gradient all-reduces in {} steps ({} bucket{})", gradient_all_reduces_,
                 step_ - r.first_step, reducer_->num_buckets(), reducer_->num_buckets() == 1 ? "" : "s");
  if (zero_ && lead())
    spdlog::info("ZeRO-1: {} bytes of AdamW state on rank 0 of {}; per step {} reduce-scatters, 1 "
                 "all-reduce (the gradient norm) and {} all-gathers", zero_->state_bytes(),
                 comm_->size(), reducer_->num_buckets(), reducer_->num_buckets());
  const DType dt = options_.precision.compute_dtype;
  if (const int64_t n = data_->held_out_size(data::HeldOut::test); n > 0) {
    const Evaluation e = evaluate(*model_, *task_, *data_, data::HeldOut::test,
                                  options_.eval.batch_size, device_, dt);
    if (r.metrics) {
      spdlog::info("test: loss {}{} ({} samples)", format_value(e.loss), metrics_text(e.metrics, ""), n);
      nlohmann::json record = {{"step", step_}, {"test_loss", e.loss}};
      for (const auto& [name, v] : e.metrics) record["test_" + name] = v;
      r.metrics->write(record);
    }
    summary.test_loss = e.loss;
    summary.test_metrics = e.metrics;
  }
  if (!r.metrics) return summary;
  write_curve_svg(curve_path(options_), read_curves(r.metrics->path()),
                  "minitrain: " + data_->name() + " " + model_->repr() + ", " + dtype_name(dt), run_id_);
  spdlog::info("done: {} steps; metrics {}; curve {}; checkpoint {}", summary.steps,
               r.metrics->path(), curve_path(options_),
               summary.checkpoint.empty() ? "(none)" : summary.checkpoint);
  return summary;
}

}  // namespace mt::train
