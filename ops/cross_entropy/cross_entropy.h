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
//
// A padded vocabulary (valid_classes < C: GPT-2's 50257 tokens stored as 50304 columns, a
// multiple of 64 that keeps every row 16-byte aligned and the output GEMM on whole tiles): the
// columns c >= valid_classes never count, as if their logits were −inf: they are left out of
// lse, a target must be below valid_classes, and their dlogits are 0 ('=', so the GEMM that
// produced them gets an exact zero gradient). Nothing is sliced or copied.
//
// Memory, at a large vocabulary. The probabilities are never materialized: the forward keeps
// one lse per row, and the backward recomputes softmax = exp(logit − lse) as it writes dlogits,
// so the backward holds the saved logits and its own dlogits (two rows × C buffers: 412 MB each
// at 4096 rows × 50304 in bf16), never a third. It does not
// write dlogits over the logits: the Function contract says a saved tensor is not modified
// (Context::save_for_backward checks its version), the op check verifies inputs intact, and
// the caller may still hold the logits (an evaluation reading them after backward). An op that
// owned its logits (a fused output projection + loss whose logits never leave it) could reuse
// their memory for dlogits and keep the contract; this op does not own them.
#include <cstdint>

#include "core/tensor.h"

namespace mt {

// logits [rows, C] (f64/f32/bf16/f16), targets [rows] i64. normalizer <= 0 means "the number of
// non-ignored targets in this call". valid_classes in [1, C] (0: C) is how many leading columns
// are real classes; the rest are padding. Returns a 0-dim loss in the grad dtype (f32, f64 for f64).
// A target outside [0, C) that is not ignore_index is an error: at once on the CPU; on CUDA at the
// next host synchronization with the device (item(), to(kCPU), check_device_errors), with the
// same message, because the op itself never waits for the GPU (ops/cross_entropy/bad_target.h).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     double normalizer = 0, int64_t valid_classes = 0);

// valid: the resolved valid_classes, in [1, C].
using CrossEntropyForwardFn = void(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                   double normalizer, int64_t valid, const Tensor& loss,
                                   const Tensor& lse);
using CrossEntropyBackwardFn = void(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                    const Tensor& dloss, int64_t ignore_index, double normalizer,
                                    int64_t valid, const Tensor& dlogits);

}  // namespace mt
