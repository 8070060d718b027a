#pragma once
// How the trainer trains: a plain struct with a default for every field, so a program sets only
// what it changes:
//
//   train::Options o;
//   o.steps = 200;
//   o.optimizer.lr = 1e-3;
//   o.checkpoint.dir = "runs/mine";
//   train::Trainer trainer(o, model, train::classification(), data, kCPU);
//
// The `train` program fills it from its YAML config (app/config.h: the same names, one section
// each); docs/config.md says what every field does. The data's batch size, microbatches, split and
// shuffling belong to the data source (data/source.h), not here.
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "optim/loss_scaler.h"

namespace mt::train {

struct OptimizerOptions {
  std::string name = "adamw";  // adamw | sgd
  double lr = 0.003;           // the peak learning rate
  double weight_decay = 0.01;  // on weights of two or more dimensions (optim::Optimizer::decay_groups)
  std::array<double, 2> betas = {0.9, 0.999};  // adamw
  double eps = 1e-8;                           // adamw
  double momentum = 0.9;                       // sgd
  bool nesterov = false;                       // sgd
  bool shard_state = false;  // adamw, data parallel: ZeRO-1 (train/zero.h)
  double clip_norm = 1.0;    // max global gradient norm; 0 = no clipping
};

struct ScheduleOptions {
  std::string kind = "cosine";  // constant | cosine (after a linear warmup)
  int64_t warmup_steps = 20;    // longer than the run: shortened to the run, with a warning
  double min_lr = 0.0;          // where the cosine ends
};

struct PrecisionOptions {
  DType compute_dtype = DType::f32;  // f64 (CPU only) | f32 | bf16 | f16
  bool deterministic = true;         // deterministic reductions (core/switches.h)
  bool gemm_autotune = false;        // CUDA GEMM algorithms chosen by timing
  optim::LossScalerOptions loss_scale;  // f16 only; the other dtypes never scale
};

struct EvalOptions {
  int64_t every = 100;  // optimizer steps between validation passes
  int64_t batch_size = 1024;
};

struct CheckpointOptions {
  std::string dir = "runs/mlp";
  int64_t every = 100;
  int64_t keep_last = 2;
  // Also keep the step of the lowest validation loss as <dir>/best.safetensors, never pruned
  // (train/checkpoint.h); it is saved when a validation pass beats every earlier one.
  bool keep_best = false;
  bool overwrite = false;  // a fresh run may delete another run's files in dir (train/run_dir.h)
  // Saved in the model file's metadata beside the trainer's own keys (the `train` program puts
  // its config here, so a model file alone rebuilds the model).
  std::map<std::string, std::string> metadata;
};

struct LoggingOptions {
  int64_t every = 25;   // optimizer steps between log lines (and NaN checks)
  std::string metrics;  // empty = <checkpoint.dir>/metrics.jsonl
  std::string curve;    // empty = <checkpoint.dir>/curve.svg
};

struct Options {
  int64_t steps = 300;  // optimizer steps
  int64_t epochs = 0;   // > 0: this many passes over the training data instead of `steps`
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  PrecisionOptions precision;
  EvalOptions eval;
  CheckpointOptions checkpoint;
  LoggingOptions logging;
  bool cuda_graph = false;  // replay quiet steps as one CUDA graph (train/trainer.h)
  // What the ranks of a data-parallel run must agree on besides the model's parameters (whose
  // names, shapes and dtypes the trainer adds): the `train` program passes its resolved config,
  // key by key. A mismatch stops every rank naming the first differing key.
  std::vector<std::pair<std::string, std::string>> job_keys;
};

// Where metrics and the loss curve go: the set path, or the default inside checkpoint.dir.
std::string metrics_path(const Options& o);
std::string curve_path(const Options& o);

// Checkpoints, metrics and the curve are first written after training has run a while, so a
// checkpoint.dir or logging path that can be neither created nor written is a ConfigError now.
// Nothing is created: the nearest existing folder on the way must be a writable directory. A
// metrics or curve path that is a directory, that is the other one, or that names a file of
// checkpoint.dir's own (a checkpoint, the lock) is a ConfigError too.
void check_output_paths(const Options& o);

// Throws ConfigError for the first value no run can use, naming its config key
// ("optim.lr: must be > 0, got -1"). The trainer calls it first. Its rules are one table
// (train/rules.h), which the `train` program's config applies too, key by key as it parses, so a
// bad value gives the same message from either (the config adds the file and line).
void validate(const Options& o);

}  // namespace mt::train
