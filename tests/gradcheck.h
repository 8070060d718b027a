#pragma once
// A reusable finite-difference gradient checker, in f64.
//
// For f(inputs) -> out, it projects the output on a fixed random tensor R (so every output
// element matters, with different weights) and compares, for every element of every input that
// requires grad, the analytic gradient of <out, R> from backward(R) with the central difference
//   (<f(x + h e_j), R> - <f(x - h e_j), R>) / 2h.
// Tolerance: |analytic - numeric| <= atol + rtol * |numeric|.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace mt::test {

struct GradcheckOptions {
  double h = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-5;
};

inline double dot_with(const Tensor& out, const std::vector<double>& r) {
  std::vector<double> v = out.to_vector();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * r[i];
  return s;
}

// inputs: f64 CPU leaves; those with requires_grad are checked.
inline void expect_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                             std::vector<Tensor> inputs, const std::string& what,
                             GradcheckOptions opt = {}) {
  for (auto& x : inputs)
    if (x.requires_grad()) x.zero_grad();
  Tensor out = f(inputs);
  ASSERT_TRUE(out.requires_grad()) << what << ": output does not require grad";
  Generator g(1234);
  std::vector<double> r(size_t(out.numel()));
  for (auto& v : r) v = g.normal();
  out.backward(from_vector(r, out.shape(), out.dtype()));

  NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor x = inputs[k];
    if (!x.requires_grad()) continue;
    ASSERT_TRUE(x.grad().defined()) << what << ": input " << k << " got no gradient";
    std::vector<double> analytic = x.grad().to_vector();
    double* p = x.data<double>();
    for (int64_t j = 0; j < x.numel(); ++j) {
      const double orig = p[j];
      p[j] = orig + opt.h;
      double fp = dot_with(f(inputs), r);
      p[j] = orig - opt.h;
      double fm = dot_with(f(inputs), r);
      p[j] = orig;
      double numeric = (fp - fm) / (2 * opt.h);
      EXPECT_LE(std::abs(analytic[size_t(j)] - numeric), opt.atol + opt.rtol * std::abs(numeric))
          << what << ": input " << k << " element " << j << " analytic " << analytic[size_t(j)]
          << " numeric " << numeric;
    }
  }
}

// Random f64 leaf with values in [lo, hi), never all zeros.
inline Tensor random_leaf(const Shape& shape, double lo = -2, double hi = 2, bool grad = true) {
  Tensor t = rand(shape, DType::f64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  if (grad) t.set_requires_grad();
  return t;
}

}  // namespace mt::test
