// Attention, v1: the math as matrices in memory. The forward writes S = q·kᵀ/√d into a
// [heads, T, T] fp32 buffer, turns each row into P in place (its max m, its sum ℓ, and the saved
// L = m + log ℓ), then o = P·v; the backward reads that P back and writes dS to another T×T
// buffer before the three products.
//
// Every kernel is one thread per output element, straight from the formulas. It is correct and
// it is what the rest of the road avoids: at T = 4096 each T×T buffer of a [4, 16] batch is
// 4.3 GB, and every element of it crosses the memory bus at least twice.
//
// Grids: S and dS: one thread per (head, i, j); softmax and D: one block of 256 threads per
// (head, row); o, dq, dk, dv: one thread per (head, row, column).
#include <cmath>

#include "lab/attention/attention.h"
#include "lab/common.cuh"

namespace mt::lab::attn_v1 {
namespace {

int blocks(int64_t n) { return int((n + kThreads - 1) / kThreads); }

// S[h, i, j] = q_i·k_j/√d for j <= i; the masked half is never read.
__global__ void scores_kernel(const bf16* q, const bf16* k, float* S, int64_t T, int64_t d,
                              float scale, int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t j = e % T, i = (e / T) % T, h = e / (T * T);
  if (j > i) return;
  const bf16 *qi = q + (h * T + i) * d, *kj = k + (h * T + j) * d;
  float s = 0;
  for (int64_t c = 0; c < d; ++c) s += to_float(qi[c]) * to_float(kj[c]);
  S[e] = s * scale;
}

// One block per row: m, then ℓ = Σ exp(S − m), L = m + log ℓ, and P = exp(S − L) in place
// (0 above the diagonal, so the products below may run over whole rows).
__global__ void softmax_kernel(float* S, float* L, int64_t T) {
  const int64_t row = blockIdx.x, i = row % T;
  float* s = S + row * T;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += kThreads) m = fmaxf(m, s[j]);
  m = block_max_all(m);
  float l = 0;
  for (int64_t j = threadIdx.x; j <= i; j += kThreads) l += expf(s[j] - m);
  const float lse = m + logf(block_sum_all(l));
  for (int64_t j = threadIdx.x; j < T; j += kThreads) s[j] = j <= i ? expf(s[j] - lse) : 0.0f;
  if (threadIdx.x == 0) L[row] = lse;
}

// out[h, i, c] = Σ_j A[h, i, j]·B[h, j, c]: o = P·v (A = P).
__global__ void rows_times_kernel(const float* A, const bf16* B, bf16* out, int64_t T, int64_t d,
                                  int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t c = e % d, i = (e / d) % T, h = e / (T * d);
  const float* a = A + (h * T + i) * T;
  float acc = 0;
  for (int64_t j = 0; j <= i; ++j) acc += a[j] * to_float(B[(h * T + j) * d + c]);
  out[e] = from_float<bf16>(acc);
}

// D[row] = Σ_c dO·o over the row.
__global__ void rowsum_kernel(const bf16* dO, const bf16* o, float* D, int64_t d) {
  const int64_t row = blockIdx.x;
  float acc = 0;
  for (int64_t c = threadIdx.x; c < d; c += kThreads)
    acc += to_float(dO[row * d + c]) * to_float(o[row * d + c]);
  acc = block_sum_all(acc);
  if (threadIdx.x == 0) D[row] = acc;
}

// dS[h, i, j] = P_ij·(dO_i·v_j − D_i), into its own T×T buffer.
__global__ void dscores_kernel(const float* P, const bf16* dO, const bf16* v, const float* D,
                               float* dS, int64_t T, int64_t d, int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t j = e % T, i = (e / T) % T, h = e / (T * T);
  if (j > i) {
    dS[e] = 0;
    return;
  }
  const bf16 *g = dO + (h * T + i) * d, *vj = v + (h * T + j) * d;
  float dp = 0;
  for (int64_t c = 0; c < d; ++c) dp += to_float(g[c]) * to_float(vj[c]);
  dS[e] = P[e] * (dp - D[h * T + i]);
}

// out[h, j, c] = scale·Σ_{i >= j} A[h, i, j]·B[h, i, c]: dv = Pᵀ·dO, dk = dSᵀ·q/√d.
__global__ void columns_times_kernel(const float* A, const bf16* B, bf16* out, int64_t T,
                                     int64_t d, float scale, int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t c = e % d, j = (e / d) % T, h = e / (T * d);
  float acc = 0;
  for (int64_t i = j; i < T; ++i) acc += A[(h * T + i) * T + j] * to_float(B[(h * T + i) * d + c]);
  out[e] = from_float<bf16>(acc * scale);
}

// dq[h, i, c] = Σ_j dS_ij·k_jc/√d.
__global__ void dq_kernel(const float* dS, const bf16* k, bf16* dq, int64_t T, int64_t d,
                          float scale, int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t c = e % d, i = (e / d) % T, h = e / (T * d);
  const float* ds = dS + (h * T + i) * T;
  float acc = 0;
  for (int64_t j = 0; j <= i; ++j) acc += ds[j] * to_float(k[(h * T + j) * d + c]);
  dq[e] = from_float<bf16>(acc * scale);
}

}  // namespace

void forward(const void* q, const void* k, const void* v, void* o, float* L, float* P, AttnShape s,
             cudaStream_t stream) {
  const int64_t nS = s.heads * s.T * s.T, nO = s.heads * s.T * s.d;
  const float scale = 1.0f / sqrtf(float(s.d));
  scores_kernel<<<blocks(nS), kThreads, 0, stream>>>(static_cast<const bf16*>(q),
                                                    static_cast<const bf16*>(k), P, s.T, s.d,
                                                    scale, nS);
  softmax_kernel<<<int(s.heads * s.T), kThreads, 0, stream>>>(P, L, s.T);
  rows_times_kernel<<<blocks(nO), kThreads, 0, stream>>>(P, static_cast<const bf16*>(v),
                                                        static_cast<bf16*>(o), s.T, s.d, nO);
}

void backward(const void* q, const void* k, const void* v, const void* o, const float* /*L*/,
              const float* P, const void* dO, void* dq, void* dk, void* dv, float* work,
              AttnShape s, cudaStream_t stream) {
  const int64_t nS = s.heads * s.T * s.T, nO = s.heads * s.T * s.d;
  const float scale = 1.0f / sqrtf(float(s.d));
  // work: dS (heads·T·T floats), then D (heads·T).
  float* dS = work;
  float* D = work + nS;
  const auto* g = static_cast<const bf16*>(dO);
  rowsum_kernel<<<int(s.heads * s.T), kThreads, 0, stream>>>(g, static_cast<const bf16*>(o), D, s.d);
  dscores_kernel<<<blocks(nS), kThreads, 0, stream>>>(P, g, static_cast<const bf16*>(v), D, dS,
                                                     s.T, s.d, nS);
  columns_times_kernel<<<blocks(nO), kThreads, 0, stream>>>(P, g, static_cast<bf16*>(dv), s.T, s.d,
                                                           1.0f, nO);
  columns_times_kernel<<<blocks(nO), kThreads, 0, stream>>>(dS, static_cast<const bf16*>(q),
                                                           static_cast<bf16*>(dk), s.T, s.d, scale, nO);
  dq_kernel<<<blocks(nO), kThreads, 0, stream>>>(dS, static_cast<const bf16*>(k),
                                                static_cast<bf16*>(dq), s.T, s.d, scale, nO);
}

}  // namespace mt::lab::attn_v1
