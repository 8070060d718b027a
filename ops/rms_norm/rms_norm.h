#pragma once
// rms_norm: each row of x scaled to unit root-mean-square, then by a learned weight.
//
//   rstd[r] = 1 / sqrt(mean_j x[r, j]² + eps)
//   y[r, j] = x[r, j] · rstd[r] · weight[j]
//
// Backward (g = dy · weight, x̂ = x · rstd):
//   dx[r, :]  = rstd[r] · (g − x̂ · mean_j(g · x̂))     per row, '=' into a new tensor
//   dweight  += Σ_r dy[r, :] · x̂[r, :]                 a reduce over rows, '+=' in fp32 into
//                                                       weight's .grad (grad sink)
//
// Saved vs recomputed: x and weight are saved (inputs); rstd is SAVED, one fp32 per row: 4 bytes
// per row against re-reading the whole row (2·d bytes in bf16) to recompute it, and it saves the
// backward a reduction pass. x̂ is recomputed (elementwise, cheap).
#include "core/tensor.h"

namespace mt {

// Normalizes over the last dimension of x (any leading shape). weight [d], f32 (f64 for f64 x).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-5);

// Kernels over x viewed as [rows, d]. rstd [rows] in the grad dtype, written '=' by forward.
using RMSNormForwardFn = void(const Tensor& x, const Tensor& weight, double eps, const Tensor& y,
                              const Tensor& rstd);
// dx '=' (undefined: skip); dweight '+=' [d] in the grad dtype (undefined: skip).
using RMSNormBackwardFn = void(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                               const Tensor& dy, const Tensor& dx, const Tensor& dweight);

}  // namespace mt
