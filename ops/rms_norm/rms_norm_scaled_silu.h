#pragma once
// rms_norm_scaled_silu: rms_norm followed by scaled_silu, one kernel each way.
//
//   rstd[r] = 1 / sqrt(mean_j x[r, j]² + eps)
//   h[r, j] = x[r, j] · rstd[r] · weight[j]                 (rms_norm, rms_norm.h)
//   y[r, j] = w · h · σ(h)                                  (scaled_silu, scaled_silu.h)
//
// Backward: the chain rule through the two ops, with s = σ(h):
//   dh  = dy · w · (s + h · s · (1 − s))                    scaled_silu's dx, per element
//   dw += Σ_{r,j} dy · h · s                                scaled_silu's dw, '+=' in fp32
//   then rms_norm's backward with dh for dy (x̂ = x · rstd, g = dh · weight, c = mean_j g · x̂):
//   dx  = rstd · (g − x̂ · c)                                '=' into a new tensor
//   dweight += Σ_r dh · x̂                                    '+=' in fp32
//
// What the fusion saves. Unfused, h is written by rms_norm's forward and read back by
// scaled_silu's (and saved for its backward), and dh is written by scaled_silu's backward and
// read back by rms_norm's: 8 bytes per element in bf16, of the 20 the pair moves per element
// forward and backward (fused: x read, y written; x, dy read, dx written = 10). And one kernel
// each way instead of two, which a small step counts.
//
// Saved vs recomputed: x, weight, w and rstd (one fp32 per row) are saved; h and s are
// recomputed in the backward from x and rstd (two multiplies and one exp per element, against a
// 2-byte write and read of h). Rounding: h is never rounded to x's dtype, where the unfused pair
// rounds it once (rms_norm's output) and dh once (scaled_silu's dx). In fp32 and f64 the two
// paths agree to a few ulp; in bf16 the fused one is the more accurate (docs/kernels.md gives
// the measured difference).
//
// Grids: rms_norm's kernels (rms_norm_kernels.cuh) with the ScaledSiLU epilogue; the backward's block
// partials carry one more column, w's, and the column reduce adds it into w's .grad. Its block
// teams hold 32 elements a thread (the plain backward 16), enough registers to keep g = dh·weight
// from the first pass to the second, so σ(h) is computed once per element (as in the warp teams
// of 32 elements; those of 16 or fewer, aligned rows of at most 512, recompute it).
//
// nn::Sequential runs an nn::RMSNorm followed by an nn::ScaledSiLU through this op (nn/modules.h).
#include "core/tensor.h"

namespace mt {

// x: any shape, f64/f32/bf16/f16, normalized over its last dimension. weight [d] and w [1] in
// the grad dtype (f32, f64 for f64 x).
Tensor rms_norm_scaled_silu(const Tensor& x, const Tensor& weight, const Tensor& w,
                            double eps = 1e-5);

// Kernels over x viewed as [rows, d]; rstd [rows] in the grad dtype, written '=' by forward.
using RMSNormScaledSiLUForwardFn = void(const Tensor& x, const Tensor& weight, const Tensor& w,
                                        double eps, const Tensor& y, const Tensor& rstd);
// dx '=' (undefined: skip); dweight [d] and dw [1] '+=' in the grad dtype, both defined or both
// undefined (skip).
using RMSNormScaledSiLUBackwardFn = void(const Tensor& x, const Tensor& weight, const Tensor& w,
                                         const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                                         const Tensor& dweight, const Tensor& dw);

}  // namespace mt
