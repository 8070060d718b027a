#pragma once
// Stochastic gradient descent with momentum, PyTorch's torch.optim.SGD (dampening 0):
//
//   d = g + weight_decay · p                  (coupled L2 decay: part of the gradient)
//   b = momentum · b + d                      (b starts at 0, so the first step has b = d)
//   d = nesterov ? d + momentum · b : b       (when momentum > 0)
//   p = p − lr · d
//
// State per parameter: momentum_buffer (only when momentum > 0), in the grad dtype.
#include <vector>

#include "optim/optimizer.h"

namespace mt::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  bool nesterov = false;
  double weight_decay = 0;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SGDOptions options);
  SGD(const std::vector<Tensor>& params, SGDOptions options)
      : SGD(std::vector<ParamGroup>{{params, std::nullopt, std::nullopt}}, options) {}
  void step() override;

 private:
  SGDOptions options_;
};

}  // namespace mt::optim
