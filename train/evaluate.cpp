#include "train/evaluate.h"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

#include "core/autograd.h"

namespace mt::train {

Evaluation evaluate(nn::Module& model, Task& task, const data::Dataset& set,
                    const std::vector<int64_t>& rows, int64_t batch_size, Device device,
                    DType compute_dtype) {
  NoGradGuard no_grad;
  model.eval();  // a flag only: accumulated gradients are left alone
  Evaluation e;
  for (size_t begin = 0; begin < rows.size(); begin += size_t(batch_size)) {
    std::vector<int64_t> part(rows.begin() + long(begin),
                              rows.begin() + long(std::min(rows.size(), begin + size_t(batch_size))));
    auto [x, y] = set.gather(part, device);
    e.loss += task.loss(model, {x.to(compute_dtype), y}, 1.0, &e.metrics).item();
  }
  model.train();
  const double n = double(std::max<size_t>(rows.size(), 1));
  e.loss /= n;
  for (auto& [name, sum] : e.metrics) sum /= n;
  return e;
}

std::string metrics_text(const Metrics& metrics, const std::string& prefix) {
  std::string out;
  for (const auto& [name, v] : metrics) out += fmt::format(" | {}{} {:.4f}", prefix, name, v);
  return out;
}

}  // namespace mt::train
