#pragma once
// Evaluation: a task's mean loss and metrics over some rows of a dataset, without gradients.
#include <cstdint>
#include <string>
#include <vector>

#include "data/data.h"
#include "nn/module.h"
#include "train/task.h"

namespace mt::train {

struct Evaluation {
  double loss = 0;  // the mean over the rows
  Metrics metrics;  // each the mean over the rows
};

// task.loss over `rows` of `set` in batches of `batch_size` (x converted to `compute_dtype`), in
// eval mode; the model goes back to train mode after, and accumulated gradients are left alone.
Evaluation evaluate(nn::Module& model, Task& task, const data::Dataset& set,
                    const std::vector<int64_t>& rows, int64_t batch_size, Device device,
                    DType compute_dtype);

// " | val_accuracy 0.9730" for each metric (prefix "val_"), as the log prints them.
std::string metrics_text(const Metrics& metrics, const std::string& prefix);

}  // namespace mt::train
