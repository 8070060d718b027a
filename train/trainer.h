#pragma once
// The trainer: it takes any nn::Module, a Task (train/task.h) that owns the forward pass and the
// loss, a data source (data/source.h) that hands out each step's batch as microbatches, and
// Options (train/options.h); it owns the loop. The `train` program builds all four from its YAML
// config (app/config_trainer.h); a program of its own builds them in a few lines
// (docs/library.md).
//
// One optimizer step, train_step() in train/trainer.cpp, top to bottom:
//   1. microbatches: the source's k microbatches of the step (a pure function of the step, so a
//      resumed run sees the same batches); for each, the task's loss with normalizer = B (the
//      whole step's sample count, never the microbatch's own), backward — gradients accumulate
//      (+=) in fp32 .grad;
//   2. unscale: f16 only, divide the gradients by the loss scale and check them for inf/NaN; an
//      overflow skips steps 3-4 (the scale halves; docs/precision.md);
//   3. clip the global gradient norm. An optimizer that can (AdamW, unsharded) folds the clip
//      factor into its update instead of a pass that rescales every gradient, so .grad holds the
//      unclipped gradient until zero_grad;
//   4. update: the optimizer's step at the schedule's learning rate;
//   5. zero_grad.
// The loss stays on the device and is read back only when logged, evaluated or checkpointed; a
// non-finite loss or gradient norm found then stops the run (exit code 3) before anything is
// saved, so the last checkpoint on disk is always a good one. That check runs before the update,
// so the message can name where the NaN or inf came from: the first non-finite parameter,
// activation (the step's loss is replayed with a forward hook that names the first module whose
// output is non-finite; train/forensics.h) or gradient. The state is checked once more before
// each save.
//
// Around the step, each in a function of its own: log_step() (the log line and metrics.jsonl),
// run_validation() (the held-out loss every eval.every steps; with checkpoint.keep_best, a new
// lowest one saves best.safetensors), save() (a checkpoint every checkpoint.every steps) and the CUDA graph (train/step_graph.cpp): cuda_graph: true records
// steps 1-5 in one graph (core/cuda/graph.h) after the run's first step, and replays it on every
// step that is not logged or saved: the batch is copied into the graph's input buffers, AdamW's
// prepare_step() hands this step's lr and bias corrections to the device, one launch does the
// rest. Logged and saved steps run eagerly (the same kernels, so the same numbers). .grad stays
// allocated (zero_grad without set_to_none) so the graph's pointers stay valid. Where the step
// cannot be captured (no GPU, an optimizer that keeps per-step values on the host, f16 loss
// scaling, a step callback, data parallelism, or a capture that fails) a warning says why and
// every step runs eagerly.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/source.h"
#include "nn/module.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "parallel/communicator.h"
#include "parallel/reducer.h"
#include "train/errors.h"
#include "train/options.h"
#include "train/task.h"
#include "train/zero.h"

namespace mt::train {

struct StepGraph;  // train/step_graph.h

// "auto" is cuda:0 when a GPU is visible, else cpu.
Device resolve_device(const std::string& spec);

// What a run ended with. A loss no run measured (no test set, no validation) is NaN, never a
// 0 that reads as a perfect score. Resuming a run that is already complete trains nothing and
// returns the summary its metrics file recorded (on the rank that wrote it; NaN elsewhere).
struct RunSummary {
  int64_t steps = 0;
  double train_loss = std::numeric_limits<double>::quiet_NaN();  // the last logged step's
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  Metrics val_metrics;  // the task's, e.g. {"accuracy": 0.97}
  double test_loss = std::numeric_limits<double>::quiet_NaN();  // when there is a test set
  Metrics test_metrics;
  std::string checkpoint;  // the last one written
};

class Trainer {
 public:
  // Trains `model` with `task` on `data`, as `options` say. The trainer moves the model to
  // `device` (f64 when precision.compute_dtype is f64) and calls its set_compute_dtype; the
  // model's own initialization is the caller's. Before anything is trained, a checkpoint folder
  // (or logging path) that cannot be created or written is a ConfigError.
  //
  // With a communicator of N > 1 ranks this is rank comm->rank() of a data-parallel job
  // (docs/distributed.md): the source serves its shard of every global batch
  // (data::Source::shard), its gradients are all-reduced once per step after the last microbatch
  // (parallel::GradReducer), losses and metrics are summed over the ranks for the log, and only
  // rank 0 logs, writes metrics and saves checkpoints. Every rank must be built alike and run()
  // together. With optimizer.shard_state the buckets are reduce-scattered instead and AdamW's
  // state is sharded over the ranks (ZeRO-1, train/zero.h), also for a communicator of one rank.
  Trainer(Options options, std::shared_ptr<nn::Module> model, std::shared_ptr<Task> task,
          std::shared_ptr<data::Source> data, Device device,
          std::shared_ptr<parallel::Communicator> comm = nullptr);
  virtual ~Trainer();

  // Continues the run saved at `path`: a checkpoint file, or a directory's newest checkpoint that
  // is intact and fits this trainer (a damaged newer one is skipped with a warning). Anything
  // else is a CheckpointError (train/checkpoint.h) naming the file and why; the trainer is then
  // unusable. A checkpoint of a run of another length (optim.steps raised to train on) is
  // logged in one line: a cosine schedule is recomputed over the new length, so the learning rate
  // jumps from where the old schedule ended; the line gives both values.
  void resume(const std::string& path);
  // Trains from the current step to options.steps. First the lead rank takes checkpoint.dir
  // (train/run_dir.h: a ConfigError if another run holds it or its files are there). A resumed
  // run that is already at the last step trains and writes nothing, and returns the step and the
  // checkpoint it was resumed from.
  RunSummary run();

  // Calls `callback(step, *this)` in every step after the microbatches' backward passes, before
  // the loss scaler, clipping and the update; `step` counts from 1, as the log does. For tests
  // that inject faults (a NaN into a gradient or a parameter) and for measurements taken while a
  // run goes on. A callback keeps every step eager (a CUDA graph has no host code between its
  // backward and its update).
  void set_step_callback(std::function<void(int64_t step, Trainer&)> callback) {
    step_callback_ = std::move(callback);
  }

  const Options& options() const { return options_; }
  nn::Module& model() { return *model_; }
  Task& task() { return *task_; }
  data::Source& data() { return *data_; }
  // With optimizer.shard_state, this rank's shard of AdamW (train/zero.h).
  optim::Optimizer& optimizer() { return zero_ ? zero_->shard() : *optimizer_; }
  ShardedAdamW* sharded_optimizer() { return zero_.get(); }  // null unless shard_state
  const optim::LossScaler& loss_scaler() const { return scaler_; }
  int64_t step() const { return step_; }

 private:
  // What one run() keeps between its steps.
  struct RunState;
  // Which of its side jobs step `step_` does.
  struct Due {
    bool log, eval, save;
  };

  // run()'s parts, in the order they happen.
  void begin_run(RunState& r);
  Due due() const;
  void train_step(RunState& r, const Due& due);
  void show_progress(RunState& r);
  void note_new_length(int64_t saved_steps) const;
  void log_step(RunState& r);
  void run_validation(RunState& r);
  void save_step(RunState& r);
  RunSummary end_run(RunState& r);

  // train_step()'s parts. The task's loss and its backward for each microbatch; the losses are
  // added into loss_sum, and when `metrics` is given, the task's metric sums into it (a host
  // read).
  void microbatch_passes(const std::vector<data::Batch>& batches, const Tensor& loss_sum,
                         Metrics* metrics);
  // Step 2: true when the step is skipped (an f16 gradient overflow).
  bool unscale(const std::vector<Tensor>& params);
  // Step 3: the global gradient norm into grad_norm; the clip factor into clip_factor_ when the
  // optimizer folds it in, else .grad clipped in place (optim/clip.h).
  void clip_gradients(const std::vector<Tensor>& params, double max_norm, const Tensor& grad_norm);
  // The loss and gradient norm read back for the log, and stopped on when not finite.
  void read_back(RunState& r);
  void update(bool skip, bool keep_grads);

  // The step's microbatches as the task sees them: float inputs in the compute dtype.
  std::vector<data::Batch> task_batches(const std::vector<data::Batch>& batches) const;
  // The sum over the ranks of host values (the values themselves on one rank). A collective.
  double sum_over_ranks(double value);
  Metrics sum_over_ranks(Metrics metrics);
  bool lead() const { return comm_ == nullptr || comm_->rank() == 0; }
  // A checkpoint of step `step`: step-N, or with `best_val_loss` the run's best (keep_best).
  std::string save(int64_t step, nn::StateDict optimizer, std::optional<double> best_val_loss = {});
  // The model and optimizer state about to be saved, checked for NaN and inf (a NonFiniteError);
  // with ZeRO-1 a collective (the full optimizer state is gathered).
  nn::StateDict state_to_save();

  // The CUDA graph (train/step_graph.cpp). Why this run's step cannot be captured (empty if it
  // can); the capture, with this step's batch in its input buffers (false, after a warning, if
  // it failed); one replay on this step's batch.
  std::string graph_blocker() const;
  bool capture_step(const Tensor& loss_sum, const Tensor& grad_norm);
  void replay_step();

  Options options_;
  Device device_;
  std::shared_ptr<parallel::Communicator> comm_;  // null: one process, no data parallelism
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<Task> task_;
  std::shared_ptr<data::Source> data_;
  std::unique_ptr<optim::Optimizer> optimizer_;  // null with ZeRO-1
  std::unique_ptr<ShardedAdamW> zero_;            // shard_state with a communicator
  Tensor clip_factor_;  // during run(), the clip factor optimizer_ folds in; undefined if none does
  std::unique_ptr<optim::LRSchedule> schedule_;
  std::unique_ptr<parallel::GradReducer> reducer_;  // data parallelism with more than one rank
  int64_t gradient_all_reduces_ = 0;            // the reducer's collectives in this run
  optim::LossScaler scaler_;  // mode none unless compute_dtype is f16
  int64_t step_ = 0;
  bool resumed_ = false;
  std::string resumed_from_;  // the model file resume() loaded
  // resume() searched checkpoint.dir itself, so that any newer checkpoint there was passed over
  // as damaged or unfit (train/run_dir.h)
  bool resumed_newest_ = false;
  std::string run_id_;        // in every checkpoint this run saves; kept across resumes
  double best_val_loss_ = INFINITY;  // keep_best: the loss of best.safetensors (this run's)
  std::function<void(int64_t, Trainer&)> step_callback_;
  std::unique_ptr<StepGraph> graph_;  // the captured step and its input buffers (CUDA builds)
};

// A data-parallel job of `nproc` ranks as threads of this process, on the CPU, joined by the
// in-process communicator (parallel::make_local_group); train/local_ranks.cpp. The trainers are
// built one after another by `make_rank` (model initialization draws from the one default
// generator), then all run together. A rank that fails aborts the group, so the others stop
// instead of waiting for it; its error is rethrown here. `timeout` bounds one rank's wait for
// the others in one collective (the group's). Returns the finished trainers and rank 0's summary.
struct LocalRun {
  std::vector<std::unique_ptr<Trainer>> ranks;
  RunSummary summary;  // rank 0's
};
using MakeRank = std::function<std::unique_ptr<Trainer>(std::shared_ptr<parallel::Communicator>)>;
LocalRun run_local_ranks(int nproc, const MakeRank& make_rank,
                         std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace mt::train
