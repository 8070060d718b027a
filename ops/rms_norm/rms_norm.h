#pragma once
// rms_norm: each row of x scaled to unit root-mean-square, then by a learned weight.
//
//   rstd[r] = 1 / sqrt(mean_j x[r, j]² + eps)
//   y[r, j] = x[r, j] · rstd[r] · weight[j]
//
// Backward, derived. Write one row (the row index r dropped), d elements, m = mean_j x_j², rstd = (m + eps)^(-1/2),
// and the names the CUDA kernel puts beside its lines:
//   x̂_j = x_j · rstd                                     "xhat"
//   g_j  = dy_j · weight_j   (dL/dx̂_j: y_j = x̂_j · weight_j)  "g"
// rstd depends on every x_i of the row:
//   d rstd / d x_i = -1/2 · (m + eps)^(-3/2) · 2 x_i / d = -rstd³ · x_i / d
// so x_i reaches L directly through x̂_i and through rstd in every x̂_j:
//   dL/dx_i = Σ_j g_j · d x̂_j / d x_i = Σ_j g_j · (δ_ij · rstd + x_j · d rstd / d x_i)
//           = rstd · g_i − (rstd³ · x_i / d) · Σ_j g_j · x_j
//           = rstd · g_i − rstd · x̂_i · (1/d) Σ_j g_j · x̂_j      (rstd² x_i x_j = x̂_i x̂_j)
// With the row-wide correction c = mean_j g_j · x̂_j ("c", one team_sum per row):
//   dx[r, :]  = rstd[r] · (g − x̂ · c)                  "dx", per row, '=' into a new tensor
// weight_j scales y_j in every row:
//   dweight  += Σ_r dy[r, :] · x̂[r, :]                 "dw", a reduce over rows, '+=' in fp32 into
//                                                       weight's .grad (grad sink)
// Check: for dy = weight⁻¹ · x̂ (g = x̂), c = mean x̂² = 1 − eps · rstd², so dx ≈ 0 when eps → 0:
// scaling x does not change x̂.
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
