#pragma once
// attention: causal scaled dot-product self-attention, one head at a time, on [B, H, T, d].
//
// For one (batch, head), rows i and keys j in [0, T), scale s = 1/√d:
//   S[i, j] = s · q_i · k_j                          (j ≤ i; j > i is masked out: the causal rule)
//   m_i     = max_{j ≤ i} S[i, j]
//   ℓ_i     = Σ_{j ≤ i} exp(S[i, j] − m_i)
//   L_i     = m_i + log ℓ_i                          the row's log-sum-exp
//   P[i, j] = exp(S[i, j] − L_i)                     the softmax: each row sums to 1
//   O_i     = Σ_{j ≤ i} P[i, j] · v_j
//
// Backward, derived. With dO = dL/dO (the upstream gradient):
//   dV_j     = Σ_{i ≥ j} P[i, j] · dO_i                         O is linear in v
//   dP[i, j] = dO_i · v_j                                       the same, for P
// The softmax couples a row: ∂P[i, j]/∂S[i, k] = P[i, j] · (δ_jk − P[i, k]), so
//   dS[i, k] = Σ_j dP[i, j] · P[i, j] · (δ_jk − P[i, k]) = P[i, k] · (dP[i, k] − D_i),
//   D_i      = Σ_j P[i, j] · dP[i, j] = Σ_j P[i, j] · (dO_i · v_j) = dO_i · O_i = rowsum(dO ∘ O)
// so the row-wide correction D needs only dO and O (d numbers a row), not the row of P: the
// backward computes it first, in a pass of its own. Then through S = s · q kᵀ:
//   dQ_i = s · Σ_{j ≤ i} dS[i, j] · k_j         dK_j = s · Σ_{i ≥ j} dS[i, j] · q_i
// Check: for dO_i = O_i · c (scaling a row of O), dP[i, j] = c · O_i · v_j and D_i = c·|O_i|²;
// a masked entry (j > i) has P = 0 and so dS = 0: no gradient crosses the causal mask.
//
// Saved vs recomputed: the forward saves q, k, v (inputs), O (the output: D needs it) and L,
// one number per row (fp32; f64 for f64 inputs). P is RECOMPUTED as exp(S − L) in the backward,
// never saved: at T = 1024 and d = 64, P in bf16 is 2·T² = 2 MiB per head against 4·T = 4 KiB
// for L, 512 times less, and re-forming S costs one T×T×d GEMM (2·T²·d FLOPs, a fifth of the
// backward's work) that the tensor cores finish faster than the GPU could read those 2 MiB back.
// L rather than m and ℓ: P = exp(S − L) is one subtraction, and L alone is what the softmax needs
// (using m without the − log ℓ gives rows that do not sum to 1; tests/test_attention.cpp shows
// the check failing for both wrong statistics).
//
// The CPU reference materializes S and P (T×T, in f64: it is the gradient check's oracle) and
// produces L too, so the contract is the same on both devices. The CUDA kernels (attention.cu
// has the grids) never form a T×T matrix: the forward walks K/V in tiles with the online softmax
// (a running m and ℓ per row, the partial output rescaled by exp(m_old − m_new) when m grows),
// the backward recomputes P tile by tile from L.
//
// Accumulation: every output is written with '=': O and L by the forward; dQ, dK and dV (new
// tensors in the input dtype) by the backward, all sums in fp32 (f64 in f64) in a fixed order,
// so the same inputs give the same bits on every run. The engine adds them into .grad (+=).
#include "core/tensor.h"

namespace mt {

// q, k, v [B, H, T, d], one floating dtype and one device; returns O [B, H, T, d]. Any T ≥ 0;
// on CUDA d ≤ kAttentionMaxD (tensor cores for bf16 and f16 at d = 32, 64, 128).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v);

inline constexpr int64_t kAttentionMaxD = 256;

// Kernels on contiguous [B, H, T, d] tensors; lse [B, H, T] in the grad dtype (f32, f64 for f64).
// o '=', lse '='.
using AttentionForwardFn = void(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& o, const Tensor& lse);
// dq, dk, dv '=' (all three defined), in the input dtype; D = rowsum(dout ∘ o) computed inside.
using AttentionBackwardFn = void(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& o, const Tensor& lse, const Tensor& dout,
                                 const Tensor& dq, const Tensor& dk, const Tensor& dv);

}  // namespace mt
