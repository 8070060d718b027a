#pragma once
// layer_norm: each row of x centred and scaled to unit variance, then by a learned weight and
// shifted by a learned bias.
//
//   mean[r] = (1/d) Σ_j x[r, j]
//   rstd[r] = 1 / sqrt((1/d) Σ_j (x[r, j] − mean[r])² + eps)
//   x̂[r, j] = (x[r, j] − mean[r]) · rstd[r]
//   y[r, j] = x̂[r, j] · weight[j] + bias[j]
//
// Backward, one row (r dropped), g_j = dy_j · weight_j = dL/dx̂_j. x_i reaches x̂_j directly,
// through the mean and through rstd:  d x̂_j / d x_i = rstd · (δ_ij − 1/d − x̂_i x̂_j / d), so
//   dx     = rstd · (g − mean_j(g) − x̂ · mean_j(g · x̂))     per row, '=' into a new tensor
//   dweight += Σ_r dy[r, :] · x̂[r, :]                         '+=' (fp32; f64 for f64) into
//   dbias   += Σ_r dy[r, :]                                   weight's and bias' .grad (sinks)
// Check: g = a + b · x̂ (a, b constants) gives dx = 0 (mean(x̂) = 0, mean(x̂²) ≈ 1): shifting or
// scaling a row does not change x̂.
//
// Saved vs recomputed: x, weight (inputs) and mean and rstd, one fp32 each per row (f64 for f64
// x): 8 bytes a row against re-reading the row (2·d bytes in bf16) and two reductions to get
// them back. x̂ is recomputed from them in the backward (one multiply-add per element, on x the
// backward reads anyway): saving it would cost a d-wide write and read.
//
// Grids (CUDA, layer_norm.cu). Rows of at most 32 elements a lane (d ≤ 1024) whose packs are
// 16-byte aligned: one warp per row, the row in registers, reductions by shuffles, weight and bias
// staged once per block in shared memory. Both passes launch one wave of blocks of 8 warps, each
// warp striding over rows with the next row's load in flight; the backward keeps its columns'
// dweight and dbias sums in registers, combined per block in warp order and written as one fp32
// partial row per block. Any other d: a block of 256 threads per row re-reading the row from
// cache, and dweight/dbias from a separate pass over row chunks, one partial row per chunk. Both
// then end in one column reduce that sums the partial rows in index order and adds (+=) into
// dweight and dbias: deterministic, the same bits on every run, no atomics. y, mean, rstd and dx are written with '='.
#include "core/tensor.h"

namespace mt {

// Normalizes over the last dimension of x (any leading shape). weight, bias [d], the grad dtype
// (f32; f64 for f64 x).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// Kernels over x viewed as [rows, d]. mean, rstd [rows] in the grad dtype, written '='.
using LayerNormForwardFn = void(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                double eps, const Tensor& y, const Tensor& mean,
                                const Tensor& rstd);
// dx '=' (undefined: skip); dweight, dbias '+=' [d] in the grad dtype (undefined: skip).
using LayerNormBackwardFn = void(const Tensor& x, const Tensor& weight, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                                 const Tensor& dweight, const Tensor& dbias);

}  // namespace mt
