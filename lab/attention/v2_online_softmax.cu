// Attention, v2: no T×T matrix in memory. One warp walks one query row over its keys j <= i with
// the online softmax: a running max m and sum ℓ, and the partial output rescaled by
// exp(m_old − m_new) whenever m grows, so one pass gives o = Σ_j exp(S_ij − m)·v_j / ℓ and
// L = m + log ℓ. The backward recomputes every P_ij = exp(S_ij − L_i) from the saved L instead of
// reading it, after a pass of its own for D_i = rowsum(dO ∘ o)_i.
//
// What it buys: memory traffic falls from the T×T buffers to the inputs and outputs (the keys of
// a head stay in L2), and nothing of size T² is allocated. What it costs: every score is a dot
// product across the warp (d/32 products a lane, then a 5-step shuffle sum), one key at a time,
// and the backward recomputes each score twice (once for dq, once for dk and dv). The arithmetic
// is on CUDA cores and the warp waits on each shuffle: v3 reuses each loaded key for many rows.
//
// Grids (one warp per block): forward and dq: one block per (head, query row); dk, dv: one block
// per (head, key row); D: one block per (head, row). Every sum is in a fixed order: no atomics,
// the same bits on every run.
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "lab/attention/attention.h"
#include "lab/common.cuh"

namespace mt::lab::attn_v2 {
namespace {

// Lane `l` holds columns l, l + 32, ... of a row: U = d / 32 of them.
template <int U>
__device__ inline void load_row(const bf16* row, float (&r)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) r[u] = to_float(row[threadIdx.x + 32 * u]);
}

template <int U>
__device__ inline float dot(const float (&a)[U], const bf16* row) {
  float s = 0;
#pragma unroll
  for (int u = 0; u < U; ++u) s += a[u] * to_float(row[threadIdx.x + 32 * u]);
  return cuda::warp_sum(s);  // every lane gets the dot product
}

template <int U>
__global__ void forward_kernel(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* L,
                               int64_t T, float scale) {
  constexpr int d = 32 * U;
  const int64_t row = blockIdx.x, i = row % T, h = row / T;
  float qi[U], acc[U];
  load_row(q + row * d, qi);
#pragma unroll
  for (int u = 0; u < U; ++u) acc[u] = 0;
  float m = -INFINITY, l = 0;
  for (int64_t j = 0; j <= i; ++j) {
    const float s = dot(qi, k + (h * T + j) * d) * scale;
    const float m_new = fmaxf(m, s);
    const float rescale = expf(m - m_new);  // 0 at the first key (m = −inf)
    const float p = expf(s - m_new);
    l = l * rescale + p;
    const bf16* vj = v + (h * T + j) * d;
#pragma unroll
    for (int u = 0; u < U; ++u) acc[u] = acc[u] * rescale + p * to_float(vj[threadIdx.x + 32 * u]);
    m = m_new;
  }
#pragma unroll
  for (int u = 0; u < U; ++u) o[row * d + threadIdx.x + 32 * u] = from_float<bf16>(acc[u] / l);
  if (threadIdx.x == 0) L[row] = m + logf(l);
}

template <int U>
__global__ void rowsum_kernel(const bf16* dO, const bf16* o, float* D) {
  constexpr int d = 32 * U;
  const int64_t row = blockIdx.x;
  float g[U];
  load_row(dO + row * d, g);
  const float s = dot(g, o + row * d);
  if (threadIdx.x == 0) D[row] = s;
}

// dq_i = Σ_{j <= i} P_ij·(dO_i·v_j − D_i)·k_j/√d, P_ij = exp(q_i·k_j/√d − L_i).
template <int U>
__global__ void dq_kernel(const bf16* q, const bf16* k, const bf16* v, const float* L,
                          const float* D, const bf16* dO, bf16* dq, int64_t T, float scale) {
  constexpr int d = 32 * U;
  const int64_t row = blockIdx.x, i = row % T, h = row / T;
  float qi[U], gi[U], acc[U];
  load_row(q + row * d, qi);
  load_row(dO + row * d, gi);
#pragma unroll
  for (int u = 0; u < U; ++u) acc[u] = 0;
  const float Li = L[row], Di = D[row];
  for (int64_t j = 0; j <= i; ++j) {
    const bf16* kj = k + (h * T + j) * d;
    const float p = expf(dot(qi, kj) * scale - Li);
    const float ds = p * (dot(gi, v + (h * T + j) * d) - Di);
#pragma unroll
    for (int u = 0; u < U; ++u) acc[u] += ds * to_float(kj[threadIdx.x + 32 * u]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) dq[row * d + threadIdx.x + 32 * u] = from_float<bf16>(acc[u] * scale);
}

// For key j: dv_j = Σ_{i >= j} P_ij·dO_i and dk_j = Σ_{i >= j} dS_ij·q_i/√d.
template <int U>
__global__ void dkdv_kernel(const bf16* q, const bf16* k, const bf16* v, const float* L,
                            const float* D, const bf16* dO, bf16* dk, bf16* dv, int64_t T,
                            float scale) {
  constexpr int d = 32 * U;
  const int64_t row = blockIdx.x, j = row % T, h = row / T;
  float kj[U], vj[U], dk_acc[U], dv_acc[U];
  load_row(k + row * d, kj);
  load_row(v + row * d, vj);
#pragma unroll
  for (int u = 0; u < U; ++u) dk_acc[u] = dv_acc[u] = 0;
  for (int64_t i = j; i < T; ++i) {
    const bf16 *qi = q + (h * T + i) * d, *gi = dO + (h * T + i) * d;
    const float p = expf(dot(kj, qi) * scale - L[h * T + i]);
    const float ds = p * (dot(vj, gi) - D[h * T + i]);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      dv_acc[u] += p * to_float(gi[threadIdx.x + 32 * u]);
      dk_acc[u] += ds * to_float(qi[threadIdx.x + 32 * u]);
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    dk[row * d + threadIdx.x + 32 * u] = from_float<bf16>(dk_acc[u] * scale);
    dv[row * d + threadIdx.x + 32 * u] = from_float<bf16>(dv_acc[u]);
  }
}

// Calls f(std::integral_constant<int, U>) for U = d / 32.
template <class F>
void with_lanes(int64_t d, F&& f) {
  switch (d) {
    case 32: return f(std::integral_constant<int, 1>());
    case 64: return f(std::integral_constant<int, 2>());
    case 96: return f(std::integral_constant<int, 3>());
    case 128: return f(std::integral_constant<int, 4>());
  }
  MT_THROW("attention lab v2: d = ", d, " (32, 64, 96 or 128)");
}

}  // namespace

void forward(const void* q, const void* k, const void* v, void* o, float* L, float* /*P*/,
             AttnShape s, cudaStream_t stream) {
  with_lanes(s.d, [&](auto lanes) {
    forward_kernel<lanes()><<<int(s.heads * s.T), 32, 0, stream>>>(
        static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
        static_cast<bf16*>(o), L, s.T, 1.0f / sqrtf(float(s.d)));
  });
}

void backward(const void* q, const void* k, const void* v, const void* o, const float* L,
              const float* /*P*/, const void* dO, void* dq, void* dk, void* dv, float* work,
              AttnShape s, cudaStream_t stream) {
  const auto *qb = static_cast<const bf16*>(q), *kb = static_cast<const bf16*>(k),
             *vb = static_cast<const bf16*>(v), *g = static_cast<const bf16*>(dO);
  const float scale = 1.0f / sqrtf(float(s.d));
  const int rows = int(s.heads * s.T);
  with_lanes(s.d, [&](auto lanes) {
    rowsum_kernel<lanes()><<<rows, 32, 0, stream>>>(g, static_cast<const bf16*>(o), work);
    dq_kernel<lanes()><<<rows, 32, 0, stream>>>(qb, kb, vb, L, work, g, static_cast<bf16*>(dq), s.T,
                                                scale);
    dkdv_kernel<lanes()><<<rows, 32, 0, stream>>>(qb, kb, vb, L, work, g, static_cast<bf16*>(dk),
                                                  static_cast<bf16*>(dv), s.T, scale);
  });
}

}  // namespace mt::lab::attn_v2
