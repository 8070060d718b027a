#pragma once
// cross_entropy: fused log-softmax + negative log-likelihood over rows of logits.
//
//   lse[r]  = log Σ_c exp(logits[r, c])                     (max-subtracted, fp32 or f64)
//   loss    = Σ_{r: t_r ≠ ignore_index} (lse[r] − logits[r, t_r]) / normalizer
//   dlogits = dloss / normalizer · (softmax(logits[r]) − onehot(t_r)),  0 for ignored rows ('=')
//   dlogits is '=' into a new tensor in logits' dtype (math in fp32, f64 for f64); no grad sink:
//   logits are activations, and the engine adds dlogits into .grad if they are ever a leaf.
//
// The normalizer is explicit so a microbatch can divide by the whole optimizer step's count of
// targets, not its own: Σ_k (x_k / N) over microbatches is the full-batch mean, while
// Σ_k (x_k / n_k) is not (docs/README.md, the microbatch lesson).
// Saved: logits (an input) and lse (one float per row); softmax is recomputed in backward.
#include <cstdint>

#include "core/tensor.h"

namespace mt {

// logits [rows, C] (f64/f32/bf16/f16), targets [rows] i64. normalizer <= 0 means "the number of
// non-ignored targets in this call". Returns a 0-dim loss in the grad dtype (f32, f64 for f64).
// A target outside [0, C) that is not ignore_index is an error: at once on the CPU; on CUDA at the
// next host synchronization with the device (item(), to(kCPU), check_device_errors), with the
// same message, because the op itself never waits for the GPU (ops/cross_entropy/bad_target.h).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     double normalizer = 0);

using CrossEntropyForwardFn = void(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                   double normalizer, const Tensor& loss, const Tensor& lse);
using CrossEntropyBackwardFn = void(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                    const Tensor& dloss, int64_t ignore_index, double normalizer,
                                    const Tensor& dlogits);

}  // namespace mt
