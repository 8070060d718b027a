#pragma once
// gelu_mlp: a transformer's feed-forward block, Linear → GELU (tanh form) → Linear, as one node.
//
//   pre = x · W1ᵀ + b1      x [..., K], W1 [H, K], b1 [H]     the pre-activation   [M, H]
//   h   = gelu(pre)         GELU's tanh form (ops/gelu/gelu.h)                        [M, H]
//   y   = h · W2ᵀ + b2      W2 [N, H], b2 [N]                                         [..., N]
//
// Backward, with g = dy · W2 (the gradient reaching h):
//   dW2 += dyᵀ · h,  db2 += Σ_rows dy
//   dpre = g ∘ gelu'(pre)                                           '=' into scratch, x's dtype
//   dx  = dpre · W1  ('='),  dW1 += dpreᵀ · x,  db1 += Σ_rows dpre  (the grad sinks, fp32)
//
// Why one node. The same math as linear → gelu → linear, but the GELU can then live in the
// GEMMs' epilogues (cuBLASLt, on CUDA): the first GEMM writes pre and h together, applying GELU
// to its fp32 accumulator (GELU_AUX_BIAS), and the GEMM that makes g applies gelu'(pre) to its
// accumulator and writes dpre directly (DGELU). That second fusion crosses the boundary between
// two ops (g belongs to the second Linear's backward, gelu'(pre) to the GELU's), so it needs the
// whole block in one Function. It removes GELU's own passes over [M, H] (a read of pre and a
// write of h forward; reads of pre and g and a write of dpre backward) and g's round trip.
//
// Rounding (16-bit x): h = gelu(pre) is computed from pre in fp32 and rounded once, pre is stored
// rounded; dpre = g ∘ gelu'(pre) from g in fp32 and the stored pre, rounded once. The separate
// ops round pre before GELU and g before the product: the results agree to a rounding, not
// bitwise. f32 and f64 have no rounding between the steps, and then the CPU reference equals the
// chain of separate ops bit for bit.
//
// Saved: x, W1 and W2 as the GEMMs read them (inputs: a GEMM cannot be redone from anything
// smaller), pre (for gelu') and h (for dW2) — what the three separate ops would save. h could be
// recomputed from pre (a pass over [M, H] each backward) to save its memory; the GPT's step is
// under PyTorch's memory without that, so it is kept.
//
// Kernels (CUDA, gelu_mlp.cu): no kernel of its own. Forward: the GELU_AUX_BIAS GEMM, then linear's
// forward GEMM with the bias epilogue. Backward: linear's dW GEMM and column sum for W2 and b2,
// the DGELU GEMM for dpre, then linear's backward for x, W1 and b1 (ops/linear/linear_cuda.h).
// cuBLASLt's aux matrix needs H to be a multiple of 8 (and f32, bf16 or f16); other widths run the
// same steps with a GEMM and gelu's own kernels between them (gelu_epilogue_fits()).
// Mixed precision is linear's rule (ops/linear/linear.h) for each layer: W1 and W2 x's dtype, or
// f32 master weights with optional compute copies.
#include "core/tensor.h"

namespace mt {

Tensor gelu_mlp(const Tensor& x, const Tensor& W1, const Tensor& b1, const Tensor& W2,
                const Tensor& b2, const Tensor& W1_compute = Tensor(),
                const Tensor& b1_compute = Tensor(), const Tensor& W2_compute = Tensor(),
                const Tensor& b2_compute = Tensor());

// Kernels. x [M, K], W1 [H, K], W2 [N, H] in the compute dtype; b1, b2 as linear's kernels take
// them (the grad dtype, or x's 16-bit dtype; undefined: no bias); pre, h [M, H] and y [M, N] '='.
using GeluMlpForwardFn = void(const Tensor& x, const Tensor& W1, const Tensor& b1,
                              const Tensor& W2, const Tensor& b2, const Tensor& pre,
                              const Tensor& h, const Tensor& y);
// dpre [M, H] scratch in x's dtype, defined when dx, dW1 or db1 is; dx '=' (undefined: skip);
// dW1, db1, dW2, db2 '+=' in the grad dtype (undefined: skip).
using GeluMlpBackwardFn = void(const Tensor& x, const Tensor& W1, const Tensor& W2,
                               const Tensor& pre, const Tensor& h, const Tensor& dy,
                               const Tensor& dpre, const Tensor& dx, const Tensor& dW1,
                               const Tensor& db1, const Tensor& dW2, const Tensor& db2);

}  // namespace mt
