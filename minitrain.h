#pragma once
// minitrain's public API in one include, for programs built against the library:
//
//   #include "minitrain.h"   // with target_link_libraries(app PRIVATE minitrain::minitrain)
//
// Each area's headers can also be included one by one ("core/tensor.h", "nn/modules.h", ...);
// docs/library.md lists the areas and what links what.

// core: tensors, autograd, the random generator, the op registry.
#include "core/autograd.h"
#include "core/error.h"
#include "core/registry.h"
#include "core/rng.h"
#include "core/tensor.h"

// ops: the differentiable operations.
#include "ops/attention/attention.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/dropout/dropout.h"
#include "ops/elementwise/elementwise.h"
#include "ops/embedding/embedding.h"
#include "ops/gelu/gelu.h"
#include "ops/gelu_mlp/gelu_mlp.h"
#include "ops/heads/heads.h"
#include "ops/layer_norm/layer_norm.h"
#include "ops/linear/linear.h"
#include "ops/rms_norm/rms_norm.h"
#include "ops/rms_norm/rms_norm_scaled_silu.h"
#include "ops/scaled_silu/scaled_silu.h"
#include "check/op_check.h"

// nn: modules (the GPT among them) and initialization.
#include "nn/gpt.h"
#include "nn/init.h"
#include "nn/module.h"
#include "nn/modules.h"
#include "nn/serialize.h"

// optim: optimizers, clipping, schedules, loss scaling.
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "optim/sgd.h"

// parallel: data parallelism (CPU threads, NCCL on GPUs).
#include "parallel/communicator.h"
#include "parallel/launch.h"
#include "parallel/reducer.h"

// data: datasets, their file formats (CSV, token shards), data sources and the tokenizers.
#include "data/array_source.h"
#include "data/csv.h"
#include "data/data.h"
#include "data/source.h"
#include "data/token_shards.h"
#include "data/token_source.h"
#include "data/tokenizer.h"

// train: the trainer, its options, tasks, evaluation, sampling and checkpoints.
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/lm_task.h"
#include "train/options.h"
#include "train/sample.h"
#include "train/task.h"
#include "train/trainer.h"

// app: the `train` program's YAML config, the trainer it builds from it, and its commands as
// functions (eval, predict).
#include "app/config.h"
#include "app/config_trainer.h"
#include "app/inference.h"
#include "app/registry.h"
