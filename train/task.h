#pragma once
// What the trainer asks of the thing it trains: the trainer owns the loop (batches, microbatches,
// precision, data parallelism, the update, checkpoints, logging), a Task owns the forward pass and
// the loss. So a model with any forward signature, and any loss, gets the whole trainer:
//
//   struct MyTask : train::Task {
//     Tensor loss(nn::Module& model, const train::Batch& b, double normalizer,
//                 train::Metrics* metrics) override {
//       Tensor logits = static_cast<MyNet&>(model).forward(b.x, b.x);
//       return cross_entropy(logits, b.y, -100, normalizer);
//     }
//   };
#include <map>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "data/source.h"
#include "nn/module.h"

namespace mt::train {

// One microbatch, on the run's device (data/source.h): x the model's input, in the compute dtype
// when it is floating point (features [n, D]); y the target (class labels [n] int64, ...).
using Batch = data::Batch;

// `b` as the task sees it: a floating-point input converted to `compute_dtype`; an integer input
// (token ids) and the target as they are.
Batch to_compute_dtype(const Batch& b, DType compute_dtype);

// Per-sample sums of a task's metrics (e.g. {"accuracy": correctly classified samples}). The
// trainer adds them over microbatches and ranks, divides by the sample count, and logs them as
// "<name>" (the training batch), "val_<name>" and "test_<name>".
using Metrics = std::map<std::string, double>;

class Task {
 public:
  virtual ~Task() = default;
  // The microbatch's loss SUMMED over its samples and divided by `normalizer` (a scalar tensor).
  // In training the normalizer is the whole step's sample count over all microbatches and ranks,
  // so k microbatches' backward passes add up to the gradient of the full batch's mean loss; in
  // evaluation it is 1 (the sum). When `metrics` is given (logged steps and evaluation only, as
  // filling it may read values back to the host), add this microbatch's sums into it; every call
  // of a run must add the same names.
  virtual Tensor loss(nn::Module& model, const Batch& batch, double normalizer,
                      Metrics* metrics) = 0;
  // Metrics that follow from the mean loss instead of adding up over samples (a language model's
  // perplexity, exp(loss)): added to `means` where the means are formed, the logged batch's (with
  // its loss) and each evaluation's.
  virtual void add_derived_metrics(double /*mean_loss*/, Metrics& /*means*/) const {}
};

// logits = model(x) [n, classes]; cross_entropy against y; metric "accuracy" (rows whose largest
// logit is at the label, first on ties).
std::shared_ptr<Task> classification();

// The number of rows of `logits` [n, classes] whose largest value is at `targets` [n] (first on
// ties); a host read.
int64_t count_correct(const Tensor& logits, const Tensor& targets);

}  // namespace mt::train
