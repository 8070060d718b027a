#pragma once
// SmallMlp: the model of the accumulation tests (microbatches, data-parallel ranks), written with
// the ops themselves so that every parameter is a plain leaf:
//   x [B, D] → linear(W1, b1) → rms_norm(g) → scaled_silu(w) → linear(W2, b2) → cross_entropy
// Parameters are drawn from the default generator (seed it first): two instances built after the
// same seed are equal.
#include <vector>

#include "core/tensor.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/linear/linear.h"
#include "ops/rms_norm/rms_norm.h"
#include "ops/scaled_silu/scaled_silu.h"
#include "tests/gradcheck.h"

namespace mt::test {

struct SmallMlp {
  static constexpr int64_t D = 6, H = 9, C = 5;  // inputs, hidden width, classes
  static constexpr int64_t kIgnore = -100;       // cross_entropy's ignore_index
  Tensor W1, b1, g, w, W2, b2;

  explicit SmallMlp(DType dtype)
      : W1(param({H, D}, -0.8, 0.8, dtype)), b1(param({H}, -0.5, 0.5, dtype)),
        g(param({H}, 0.5, 1.5, dtype)), w(param({1}, 0.5, 1.5, dtype)),
        W2(param({C, H}, -0.8, 0.8, dtype)), b2(param({C}, -0.5, 0.5, dtype)) {}

  std::vector<Tensor> params() const { return {W1, b1, g, w, W2, b2}; }

  // The summed cross-entropy of the batch (targets kIgnore skipped) divided by `normalizer`.
  Tensor loss(const Tensor& x, const Tensor& targets, double normalizer) const {
    Tensor h = scaled_silu(rms_norm(linear(x.to(W1.dtype()), W1, b1), g), w);
    return cross_entropy(linear(h, W2, b2), targets, kIgnore, normalizer);
  }

 private:
  static Tensor param(const Shape& shape, double lo, double hi, DType dtype) {
    Tensor p = random_leaf(shape, lo, hi, /*grad=*/false).to(dtype);
    p.set_requires_grad();
    return p;
  }
};

}  // namespace mt::test
