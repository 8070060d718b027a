#include "train/evaluate.h"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

#include "core/autograd.h"
#include "data/array_source.h"

namespace mt::train {

Evaluation evaluate(nn::Module& model, Task& task,
                    const std::function<void(const BatchVisitor&)>& for_each, int64_t samples,
                    DType compute_dtype) {
  NoGradGuard no_grad;
  nn::EvalModeGuard eval_mode(model);  // a flag only: accumulated gradients are left alone
  Evaluation e;
  for_each([&](const data::Batch& b) {
    e.loss += task.loss(model, to_compute_dtype(b, compute_dtype), 1.0, &e.metrics).item();
  });
  const double n = double(std::max<int64_t>(samples, 1));
  e.loss /= n;
  for (auto& [name, sum] : e.metrics) sum /= n;
  task.add_derived_metrics(e.loss, e.metrics);
  return e;
}

Evaluation evaluate(nn::Module& model, Task& task, const data::Source& source, data::HeldOut which,
                    int64_t batch_size, Device device, DType compute_dtype) {
  return evaluate(
      model, task,
      [&](const BatchVisitor& visit) { source.for_each_held_out(which, batch_size, device, visit); },
      source.held_out_size(which), compute_dtype);
}

Evaluation evaluate(nn::Module& model, Task& task, const data::Dataset& set,
                    const std::vector<int64_t>& rows, int64_t batch_size, Device device,
                    DType compute_dtype) {
  return evaluate(
      model, task,
      [&](const BatchVisitor& visit) { data::for_each_batch(set, rows, batch_size, device, visit); },
      int64_t(rows.size()), compute_dtype);
}

std::string metrics_text(const Metrics& metrics, const std::string& prefix) {
  std::string out;
  for (const auto& [name, v] : metrics) out += fmt::format(" | {}{} {:.4f}", prefix, name, v);
  return out;
}

}  // namespace mt::train
