#include "nn/init.h"

#include <cmath>

#include "core/autograd.h"
#include "core/rng.h"

namespace mt::nn::init {

void uniform_(const Tensor& t, double lo, double hi) {
  NoGradGuard no_grad;
  Generator& g = default_generator();
  Tensor host = empty(t.shape(), DType::f64);
  double* p = host.data<double>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = lo + (hi - lo) * g.uniform();
  t.copy_(host);
}

void normal_(const Tensor& t, double mean, double std) {
  NoGradGuard no_grad;
  Generator& g = default_generator();
  Tensor host = empty(t.shape(), DType::f64);
  double* p = host.data<double>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = mean + std * g.normal();
  t.copy_(host);
}

void kaiming_uniform_(const Tensor& t, double a) {
  MT_CHECK(t.dim() == 2, "kaiming_uniform_: expected a 2-D [out, in] weight, got shape ",
           shape_str(t.shape()));
  const double bound = std::sqrt(2.0 / (1.0 + a * a)) * std::sqrt(3.0 / double(t.size(1)));
  uniform_(t, -bound, bound);
}

}  // namespace mt::nn::init
