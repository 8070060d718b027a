#pragma once
// Parameter initialization, drawn from the seeded default generator (core/rng.h) on the CPU and
// copied in, so a seed gives the same model on every device. Each fills `t` in place.
#include "core/tensor.h"

namespace mt::nn::init {

// t ~ U(lo, hi).
void uniform_(const Tensor& t, double lo, double hi);

// t ~ N(mean, std²).
void normal_(const Tensor& t, double mean, double std);

// PyTorch's kaiming_uniform_ for a leaky-ReLU gain with negative slope `a`, fan_in mode:
//   bound = sqrt(2 / (1 + a²)) · sqrt(3 / fan_in),  t ~ U(−bound, bound),
// fan_in = t.size(1) for a [out, in] weight. nn.Linear uses a = √5, which gives bound = 1/√fan_in.
void kaiming_uniform_(const Tensor& t, double a);

}  // namespace mt::nn::init
