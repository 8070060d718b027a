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
// warp striding over rows (the forward with the next row's load in flight); the backward keeps
// its lanes' dweight and dbias sums in its warp's rows of shared memory, combined per block in
// warp order and written as one fp32 partial row per block. Any other d: a block of 256 threads
// per row re-reading the row from cache, and dweight/dbias from a separate pass over row chunks,
// one partial row per chunk. Both then end in one column reduce that sums the partial rows in
// index order and adds (+=) into dweight and dbias: deterministic, the same bits on every run, no
// atomics. y, mean, rstd and dx are written with '='. add_layer_norm runs the same grids with one
// more row read (r forward, ds backward) and, forward, s written.
#include <vector>

#include "core/tensor.h"

namespace mt {

// Normalizes over the last dimension of x (any leading shape). weight, bias [d], the grad dtype
// (f32; f64 for f64 x).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// The residual add and the LayerNorm after it in one pass, as a transformer's residual stream
// uses them (llm.c's fused residual forward):
//   s = x + r                       rounded to x's dtype, as add(x, r) rounds it
//   y = layer_norm(s, weight, bias)
// returns {s, y}: the same numbers, bit for bit, as add then layer_norm. Backward: s's gradient
// arrives from its later use (the next residual add) and through y; the kernel adds the two as it
// writes the LayerNorm's dx (one rounding), so
//   dx = dr = ds + LN_backward(dy)
// and the engine's separate sum of the two (two reads and a write of the row) is gone, as is the
// forward's re-read of s. Saved: s (an output the model keeps anyway), weight, mean, rstd.
std::vector<Tensor> add_layer_norm(const Tensor& x, const Tensor& r, const Tensor& weight,
                                   const Tensor& bias, double eps = 1e-5);

// Kernels over x viewed as [rows, d]. mean, rstd [rows] in the grad dtype, written '='.
// residual (undefined: none): the rows normalized are s = x + residual, written to sum ('=').
using LayerNormForwardFn = void(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                const Tensor& bias, double eps, const Tensor& sum,
                                const Tensor& y, const Tensor& mean, const Tensor& rstd);
// dx '=' (undefined: skip), plus dresidual when defined (then dx must be); dweight, dbias '+='
// [d] in the grad dtype (undefined: skip).
using LayerNormBackwardFn = void(const Tensor& x, const Tensor& weight, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& dy, const Tensor& dresidual,
                                 const Tensor& dx, const Tensor& dweight, const Tensor& dbias);

}  // namespace mt
