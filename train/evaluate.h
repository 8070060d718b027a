#pragma once
// Evaluation: a task's mean loss and metrics over held-out data, without gradients.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/data.h"
#include "data/source.h"
#include "nn/module.h"
#include "train/task.h"

namespace mt::train {

struct Evaluation {
  double loss = 0;  // the mean over the samples
  Metrics metrics;  // each the mean over the samples
};

// task.loss over the batches `for_each` hands out (`samples` in all; inputs converted to
// `compute_dtype`), in eval mode; the model goes back to train mode after, and accumulated
// gradients are left alone.
using BatchVisitor = std::function<void(const data::Batch&)>;
Evaluation evaluate(nn::Module& model, Task& task,
                    const std::function<void(const BatchVisitor&)>& for_each, int64_t samples,
                    DType compute_dtype);
// The same over a source's validation or test data, in batches of `batch_size` on `device`.
Evaluation evaluate(nn::Module& model, Task& task, const data::Source& source, data::HeldOut which,
                    int64_t batch_size, Device device, DType compute_dtype);
// The same over `rows` of `set`.
Evaluation evaluate(nn::Module& model, Task& task, const data::Dataset& set,
                    const std::vector<int64_t>& rows, int64_t batch_size, Device device,
                    DType compute_dtype);

// " | val_accuracy 0.9730" for each metric (prefix "val_"), as the log prints them.
std::string metrics_text(const Metrics& metrics, const std::string& prefix);

}  // namespace mt::train
