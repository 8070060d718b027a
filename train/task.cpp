#include "train/task.h"

#include <algorithm>
#include <vector>

#include "ops/cross_entropy/cross_entropy.h"

namespace mt::train {

Batch to_compute_dtype(const Batch& b, DType compute_dtype) {
  return {is_floating(b.x.dtype()) ? b.x.to(compute_dtype) : b.x, b.y};
}

int64_t count_correct(const Tensor& logits, const Tensor& targets) {
  const std::vector<double> l = logits.detach().to_vector(), t = targets.to_vector();
  const size_t C = size_t(logits.size(1));
  int64_t correct = 0;
  for (size_t r = 0; r < t.size(); ++r) {
    const auto row = l.begin() + long(r * C);
    correct += std::max_element(row, row + long(C)) - row == long(t[r]);
  }
  return correct;
}

namespace {

class Classification : public Task {
 public:
  Tensor loss(nn::Module& model, const Batch& batch, double normalizer, Metrics* metrics) override {
    Tensor logits = model(batch.x);
    if (metrics != nullptr) (*metrics)["accuracy"] += double(count_correct(logits, batch.y));
    return cross_entropy(logits, batch.y, -100, normalizer);
  }
};

}  // namespace

std::shared_ptr<Task> classification() { return std::make_shared<Classification>(); }

}  // namespace mt::train
