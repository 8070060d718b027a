#pragma once
// The trainer behind `train --config configs/mlp.yaml`, and behind any program that trains a model
// of its own: it takes any nn::Module and a Task (train/task.h) that owns the forward pass and the
// loss; the trainer owns the loop below.
//
// One optimizer step:
//   1. the loader hands out the step's batch of B samples as k microbatches (a pure function of
//      the seed and the step, so a resumed run sees the same batches);
//   2. for each microbatch: the task's loss with normalizer = B (the whole step's count, never the
//      microbatch's own), backward — gradients accumulate (+=) in fp32 .grad;
//   3. f16 only: divide the gradients by the loss scale and check them for inf/NaN; an overflow
//      skips step 4 (the scale halves; docs/precision.md);
//   4. clip the global gradient norm, optimizer step, learning-rate schedule; then zero_grad.
//      AdamW (unsharded) takes the clip factor into its update instead of a pass that rescales
//      every gradient, so .grad holds the unclipped gradient until zero_grad.
// The loss stays on the device and is read back only when logged, evaluated or checkpointed; a
// non-finite loss or gradient norm found then stops the run (exit code 3) before anything is
// saved, so the last checkpoint on disk is always a good one.
// That check runs before the update, so the message can name where the NaN or inf came from: the
// first non-finite parameter, activation (the step's loss is replayed with a forward hook that
// names the first module whose output is non-finite; train/forensics.h) or gradient. Data is checked when it is loaded, and the state once more before each save.
//
// cuda_graph: true records steps 2-4 (microbatches, clipping, the update, zero_grad) in one CUDA
// graph (core/cuda/graph.h) after the run's first step, and replays it on every step that is not
// logged or saved (train/step_graph.cpp): the batch is copied into the graph's input buffers, AdamW's prepare_step()
// hands this step's lr and bias corrections to the device, one launch does the rest. Logged and
// saved steps run eagerly (the same kernels, so the same numbers): they read logits for the
// accuracy and check for NaN before the update. .grad stays allocated (zero_grad without
// set_to_none) so the graph's pointers stay valid. Where the step cannot be captured (no GPU, an
// optimizer that keeps per-step values on the host, f16 loss scaling, a step callback, data
// parallelism, or a capture that fails) a warning says why and every step runs eagerly.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/data.h"
#include "nn/module.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "parallel/communicator.h"
#include "parallel/reducer.h"
#include "train/config.h"
#include "train/task.h"
#include "train/zero.h"

namespace mt::train {

// A NaN or inf in the loss, a gradient or the state about to be saved: the run stops; `train`
// exits with code 3. (One in the data is a data::DataError when it is loaded: exit code 4.)
struct NonFiniteError : Error {
  using Error::Error;
};

// "auto" is cuda:0 when a GPU is visible, else cpu.
Device resolve_device(const std::string& spec);

struct RunSummary {
  int64_t steps = 0;
  double train_loss = 0;  // the last logged step's
  double val_loss = 0;
  Metrics val_metrics;  // the task's, e.g. {"accuracy": 0.97}
  double test_loss = 0;  // when there is a test set
  Metrics test_metrics;
  std::string checkpoint;  // the last one written
};

// Data a program hands the trainer instead of the config's data section. A test set of size 0
// means none; the validation split is still data.val_fraction of `train`.
struct Datasets {
  data::Dataset train, test;
};

class Trainer {
 public:
  // Trains `model` with `task`, with the optimizer, precision, data, logging and checkpoint
  // sections of a validated config. The trainer moves the model to `device` (f64 when
  // precision.compute_dtype is f64) and calls its set_compute_dtype; the model's own
  // initialization is the caller's. Data comes from `data` when given, else from the config (its
  // model.input and model.classes shape the synthetic data). Too few samples for the batch or
  // the validation split, and NaN or inf in the data, are errors; so, before anything is loaded,
  // is a checkpoint folder (or logging path) that cannot be created or written.
  //
  // With a communicator of N > 1 ranks this is rank comm->rank() of a data-parallel job
  // (docs/distributed.md): it reads its shard of every global batch (optim.batch_size is the
  // global batch, optim.microbatches is per rank), its gradients are all-reduced once per step
  // after the last microbatch (parallel::GradReducer), losses and accuracy are summed over the ranks
  // for the log, and only rank 0 logs, writes metrics and saves checkpoints. Every rank must be
  // built from the same config and run() together. With optim.shard_state the buckets are
  // reduce-scattered instead and AdamW's state is sharded over the ranks (ZeRO-1, train/zero.h),
  // also for a communicator of one rank.
  Trainer(Config config, std::shared_ptr<nn::Module> model, std::shared_ptr<Task> task,
          Device device, std::shared_ptr<parallel::Communicator> comm = nullptr,
          std::optional<Datasets> data = std::nullopt);
  // The config's own model (train::build_model, initialized from config.seed) and the
  // classification task: `train --config`. Mismatches between the model section and the data
  // (feature count, labels outside model.classes) are ConfigErrors, and so, before anything is
  // allocated, is a run that cannot fit in the device's memory (train/memory.h).
  Trainer(Config config, Device device, std::shared_ptr<parallel::Communicator> comm = nullptr);
  ~Trainer();

  // Continues the run saved at `path`: a checkpoint file, or a directory's newest checkpoint that
  // is intact and fits this trainer (a damaged newer one is skipped with a warning). Anything
  // else is a CheckpointError (train/checkpoint.h) naming the file and why; the trainer is then
  // unusable.
  void resume(const std::string& path);
  // Trains from the current step to optim.steps. First the lead rank takes checkpoint.dir
  // (train/run_dir.h: a ConfigError if another run holds it or its files are there). A resumed
  // run that is already at optim.steps trains and writes nothing, and returns the step and the
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

  nn::Module& model() { return *model_; }
  Task& task() { return *task_; }
  // With optim.shard_state, this rank's shard of AdamW (train/zero.h).
  optim::Optimizer& optimizer() { return zero_ ? zero_->shard() : *optimizer_; }
  ShardedAdamW* sharded_optimizer() { return zero_.get(); }  // null unless optim.shard_state
  const optim::LossScaler& loss_scaler() const { return scaler_; }
  int64_t step() const { return step_; }

 private:
  // The sum over the ranks of host values (the values themselves on one rank). A collective.
  double sum_over_ranks(double value);
  Metrics sum_over_ranks(Metrics metrics);
  // The loader's microbatches as the task sees them: x in the compute dtype.
  std::vector<Batch> task_batches(const std::vector<data::Loader::Microbatch>& batches) const;
  bool lead() const { return comm_ == nullptr || comm_->rank() == 0; }
  std::string save(int64_t step, nn::StateDict optimizer);
  // The task's loss and its backward for each microbatch; the losses are added into loss_sum, and
  // when `metrics` is given, the task's metric sums into it (a host read).
  void microbatch_passes(const std::vector<data::Loader::Microbatch>& batches, const Tensor& loss_sum,
                         Metrics* metrics);
  // Step 4's clipping: the global gradient norm into grad_norm. With an unsharded AdamW the clip
  // factor goes into clip_factor_, which the update folds in (optim/adamw.h: .grad is read, never
  // rescaled); with SGD or ZeRO-1, .grad is clipped in place (optim/clip.h).
  void clip_gradients(const std::vector<Tensor>& params, double max_norm, const Tensor& grad_norm);
  // Why this run's step cannot be captured in a CUDA graph; empty if it can.
  std::string graph_blocker() const;
  // Records the step in a CUDA graph, with this step's batch in its input buffers; false (after a
  // warning) if the capture failed.
  bool capture_step(const Tensor& loss_sum, const Tensor& grad_norm);
  // One replay of the captured step, on this step's batch.
  void replay_step();

  Config cfg_;
  Device device_;
  data::Dataset train_set_, test_set_;
  data::Split split_;
  data::Standardization standardization_;  // data.standardize: the training split's, saved with each checkpoint
  std::shared_ptr<parallel::Communicator> comm_;  // null: one process, no data parallelism
  std::unique_ptr<data::Loader> loader_;
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<Task> task_;
  std::unique_ptr<optim::Optimizer> optimizer_;  // null with ZeRO-1
  std::unique_ptr<ShardedAdamW> zero_;            // optim.shard_state with a communicator
  Tensor clip_factor_;  // during run(), the clip factor optimizer_ folds in; undefined if none does
  std::unique_ptr<optim::LRSchedule> schedule_;
  std::unique_ptr<parallel::GradReducer> reducer_;  // data parallelism with more than one rank
  int64_t gradient_all_reduces_ = 0;            // the reducer's collectives in this run
  optim::LossScaler scaler_;  // mode none unless compute_dtype is f16
  int64_t step_ = 0;
  bool resumed_ = false;
  std::string resumed_from_;  // the model file resume() loaded
  std::string run_id_;        // in every checkpoint this run saves; kept across resumes
  std::function<void(int64_t, Trainer&)> step_callback_;
  struct StepGraph;  // the captured step and its input buffers (CUDA builds)
  std::unique_ptr<StepGraph> graph_;
};

// A data-parallel job of `nproc` ranks as threads of this process, on the CPU, joined by the
// in-process communicator (parallel::make_local_group); train/local_ranks.cpp. The trainers are
// built one after another by `make_rank` (model initialization draws from the one default
// generator), then all run together. A rank that fails aborts the group, so the others stop
// instead of waiting for it; its error is rethrown here. Returns the finished trainers and rank
// 0's summary.
struct LocalRun {
  std::vector<std::unique_ptr<Trainer>> ranks;
  RunSummary summary;  // rank 0's
};
using MakeRank = std::function<std::unique_ptr<Trainer>(std::shared_ptr<parallel::Communicator>)>;
LocalRun run_local_ranks(int nproc, const MakeRank& make_rank);
// The config's model on every rank, each resumed from `resume` if given, then `setup` with each.
LocalRun run_local_ranks(const Config& cfg, int nproc, const std::string& resume = "",
                         const std::function<void(int rank, Trainer&)>& setup = {});

}  // namespace mt::train
