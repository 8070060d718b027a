#include "train/forensics.h"

#include <cmath>
#include <unordered_map>

#include "core/autograd.h"
#include "core/error.h"

namespace mt::train {

std::string non_finite_values(const Tensor& t) {
  const std::vector<double> v = t.to_vector();
  int64_t count = 0;
  double first = 0;
  for (double x : v)
    if (!std::isfinite(x) && count++ == 0) first = x;
  return count == 0 ? "" : detail::concat(count, " of ", v.size(), " values, e.g. ", first);
}

std::string first_non_finite(const nn::StateDict& state) {
  for (const auto& [name, t] : state)
    if (std::string bad = non_finite_values(t); !bad.empty()) return name + " (" + bad + ")";
  return "";
}

std::string find_non_finite(nn::Module& model, Task& task, const std::vector<Batch>& batches,
                            double normalizer) {
  const nn::StateDict named = model.named_parameters();
  if (std::string bad = first_non_finite(named); !bad.empty()) return "non-finite parameter " + bad;

  // Modules are named by their path from the model, the prefix of their parameters' names.
  std::unordered_map<const nn::Module*, std::string> names{{&model, "the model"}};
  for (const auto& [name, m] : model.named_modules()) names.emplace(m.get(), name);
  std::string activation;  // the first non-finite module output of the replay
  NoGradGuard no_grad;
  nn::ForwardHookGuard hook([&](const nn::Module& m, const Tensor& out) {
    if (!activation.empty()) return;
    if (std::string bad = non_finite_values(out); !bad.empty()) {
      auto it = names.find(&m);
      activation = (it == names.end() ? "a module outside the model" : it->second) + " " +
                   m.repr() + " (" + bad + ")";
    }
  });
  for (const Batch& b : batches) {
    if (std::string bad = non_finite_values(b.x); !bad.empty())
      return detail::concat("non-finite input in ", dtype_name(b.x.dtype()), " (", bad, ")");
    task.loss(model, b, normalizer, nullptr);
    if (!activation.empty()) return "non-finite activation: the output of " + activation;
  }
  for (const auto& [name, p] : named)
    if (p.grad().defined())
      if (std::string bad = non_finite_values(p.grad()); !bad.empty())
        return "non-finite gradient in " + name + " (" + bad + ")";
  return "non-finite loss (every parameter, activation and gradient of this step is finite)";
}

}  // namespace mt::train
