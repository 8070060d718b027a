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
//
// Dropout on P (nanoGPT's attn_dropout; PyTorch's scaled_dot_product_attention(dropout_p) in
// training): each probability is kept with probability 1 − p and scaled by 1 / (1 − p), or zeroed:
//   Z[i, j]  = keep[i, j] / (1 − p),   keep[i, j] = r_e >= round(p · 2¹⁶)
//   r_e      = 16-bit half e % 8 of philox::draw(seed, offset (+ base[0]), e / 8),
//   e        = ((b·H + h)·T + i)·T + j      (the element's index in P [B, H, T, T], contiguous)
// the very mask ops/dropout draws for a [B, H, T, T] tensor with the same (seed, offset, base):
// one convention, its counter, its device-side offset word for CUDA graphs (dropout.h). Then
//   forward   m, ℓ and L from S exactly as above (the statistics see no dropout);
//             O_i = Σ_{j ≤ i} P[i, j] · Z[i, j] · v_j
//   backward  dV_j     = Σ_{i ≥ j} P[i, j] · Z[i, j] · dO_i
//             dP[i, j] = Z[i, j] · (dO_i · v_j)
//             D_i      = Σ_j P[i, j] · dP[i, j] = dO_i · Σ_j P[i, j] · Z[i, j] · v_j = dO_i · O_i
//             dS = P ∘ (dP − D); dQ and dK from dS as above
// so D is still rowsum(dO ∘ O) (O now the dropped output), and the softmax's backward is
// unchanged: dropout acts on P after the softmax, dP is the gradient with respect to P itself.
// Saved vs recomputed: only O and L, as without dropout (and the base word, one element, so that a
// word moved before the backward is an error, as for dropout). The mask is REGENERATED in the
// backward from (seed, offset, base, e), never saved: packed to 1 bit it would still be T²/8 bytes
// a head (128 KiB at T = 1024, 32 times L), written by the forward and read back by the backward,
// where regenerating costs one Philox call (10 rounds of two 32-bit multiplies) per 8 probabilities
// on the CPU, per 2 in the CUDA forward and dQ pass (a thread's accumulators hold pairs of adjacent
// keys of a row: one call serves both unless the pair straddles two groups of 8, which only an odd
// T allows), and per 1 in the dK/dV pass (its tile is Pᵀ: a thread's pairs are two rows).
// The backward reads the base word again: advance it only before a step's first forward.
// p = 0, or training = false: no dropout, the same kernels (and bits) as attention(q, k, v); on
// CUDA, dropout is a compile-time switch of each kernel, so the p = 0 kernels are unchanged.
#include <cstdint>

#include "core/tensor.h"

namespace mt {

// q, k, v [B, H, T, d], one floating dtype and one device; returns O [B, H, T, d]. Any T ≥ 0;
// on CUDA d ≤ kAttentionMaxD (tensor cores for bf16 and f16 at d = 32, 64, 128), and one launch's
// grid bounds the rest: B·H ≤ 65535 and T ≤ 65535 · 64 = 4,194,240 (a clear error past either).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v);

// Dropout on the attention probabilities (above). p in [0, 1); base: undefined (the offset
// alone) or an i64 [1] tensor on q's device whose word is added to the offset when the kernels
// run, forward and backward (ops/dropout/dropout.h).
struct AttentionDropout {
  double p = 0;
  uint64_t seed = 0, offset = 0;
  Tensor base;
  bool training = true;
};

// attention(q, k, v) with dropout on P; p = 0 or !training is attention(q, k, v) itself.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionDropout& dropout);

// Causal self-attention straight from a fused projection: qkv [B, T, 3·C] holds q, k and v side
// by side, each cut into n_head heads of d = C / n_head columns (split_heads' reading, ops/heads);
// the result is y [B, T, C], the heads side by side (merge_heads' writing). The same numbers,
// bit for bit (deterministic mode; the atomic dQ variant's last bits vary from run to run
// anyway), as merge_heads(attention(split_heads(qkv, n_head)..., dropout)), without its four
// copies (two forward, two backward): the kernels read each head's rows where the projection
// left them and write O's rows into y, and the backward writes dq, dk and dv into one dqkv
// [B, T, 3·C]. Saves qkv (the projection's output, otherwise freed), y and L; on GPT-2 124M that
// is C numbers a token less than the split copies and O it replaces. split_heads stays for a
// model that works on q and k between the two (rotary embeddings, say).
Tensor attention_packed(const Tensor& qkv, int64_t n_head, const AttentionDropout& dropout = {});

inline constexpr int64_t kAttentionMaxD = 256;

// Kernels on [B, H, T, d] views: any strides with a row's d elements contiguous, q, k and v (and
// dq, dk, dv) sharing one set, o and dout another; on CUDA's tensor cores every buffer and stride
// a 16-byte multiple. attention gives them contiguous tensors, attention_packed views of qkv, y
// and dqkv. lse [B, H, T] contiguous, in the grad dtype (f32, f64 for f64). dropout: p = 0 (no
// dropout), or p in (0, 1) with its key, base checked (the op has applied `training` already:
// the kernels do not read it). o '=', lse '='.
using AttentionForwardFn = void(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& o, const Tensor& lse,
                                const AttentionDropout& dropout);
// dq, dk, dv '=' (all three defined), in the input dtype; D = rowsum(dout ∘ o) computed inside;
// the forward's dropout, its mask regenerated.
using AttentionBackwardFn = void(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& o, const Tensor& lse, const Tensor& dout,
                                 const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                 const AttentionDropout& dropout);

}  // namespace mt
