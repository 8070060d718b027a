// Attention forward, v3: tiles in shared memory. A block takes 64 query rows, one thread each,
// and walks the keys in tiles of 32: the block loads a tile of k and v into shared memory once
// and every one of its 64 rows uses it, where v2 read each key once per row from L2. The online
// softmax moves from once per key to once per tile: the tile's 32 scores go to registers, the
// running max is raised once, the partial output rescaled once, then the 32 keys are added in.
// This is FlashAttention's schedule (parallel over heads and query tiles, a loop over key tiles),
// still on CUDA cores: every score is a d-long loop of fused multiply-adds in one thread.
//
// What limits it: each thread holds its output row (d fp32 registers: 128 at d = 128) and reads
// q from shared memory (rows padded by one word so the 64 threads hit 64 banks' worth of
// distinct words); the multiply-adds run on the CUDA cores, a sixteenth of what the tensor
// cores offer. v4 hands the two products of each tile, S = q·kᵀ and o += P·v, to the tensor cores.
//
// Grid: one block of 64 threads per (head, 64-row query tile); a block stops at the key tile
// holding its last row (the causal mask), and masks inside the diagonal tile.
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "lab/attention/attention.h"
#include "lab/common.cuh"

namespace mt::lab::attn_v3 {
namespace {

constexpr int kRows = 64;  // query rows per block, one per thread
constexpr int kKeys = 32;  // keys per tile

template <int D>
__global__ void __launch_bounds__(kRows) forward_kernel(const bf16* q, const bf16* k, const bf16* v,
                                                        bf16* o, float* L, int64_t T, float scale) {
  __shared__ bf16 qs[kRows][D + 2];  // + 2: a one-word pad, so row r starts in bank r mod 32
  __shared__ bf16 ks[kKeys][D], vs[kKeys][D];
  const int64_t h = blockIdx.y, i0 = int64_t(blockIdx.x) * kRows, i = i0 + threadIdx.x;
  const bf16 *qh = q + h * T * D, *kh = k + h * T * D, *vh = v + h * T * D;
  for (int e = threadIdx.x; e < kRows * D; e += kRows) {
    const int64_t r = e / D;
    qs[r][e % D] = i0 + r < T ? qh[(i0 + r) * D + e % D] : from_float<bf16>(0.0f);
  }
  float acc[D];
#pragma unroll
  for (int c = 0; c < D; ++c) acc[c] = 0;
  float m = -INFINITY, l = 0;
  const int64_t last_key = std::min<int64_t>(i0 + kRows, T);  // keys [0, last_key) matter here
  for (int64_t j0 = 0; j0 < last_key; j0 += kKeys) {
    __syncthreads();  // the previous tile is no longer read (and, at first, q is in)
    for (int e = threadIdx.x; e < kKeys * D; e += kRows) {
      const int64_t j = j0 + e / D;
      ks[e / D][e % D] = j < T ? kh[j * D + e % D] : from_float<bf16>(0.0f);
      vs[e / D][e % D] = j < T ? vh[j * D + e % D] : from_float<bf16>(0.0f);
    }
    __syncthreads();
    float s[kKeys];
    float tile_max = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < kKeys; ++jj) {
      float dot = 0;
#pragma unroll
      for (int c = 0; c < D; ++c) dot += to_float(qs[threadIdx.x][c]) * to_float(ks[jj][c]);
      s[jj] = j0 + jj <= i ? dot * scale : -INFINITY;  // the causal mask (and keys past T)
      tile_max = fmaxf(tile_max, s[jj]);
    }
    const float m_new = fmaxf(m, tile_max);
    if (m_new == -INFINITY) continue;  // a row past T, or a tile wholly above the diagonal
    const float rescale = expf(m - m_new);
    l *= rescale;
#pragma unroll
    for (int c = 0; c < D; ++c) acc[c] *= rescale;
#pragma unroll
    for (int jj = 0; jj < kKeys; ++jj) {
      const float p = expf(s[jj] - m_new);
      l += p;
#pragma unroll
      for (int c = 0; c < D; ++c) acc[c] += p * to_float(vs[jj][c]);
    }
    m = m_new;
  }
  if (i >= T) return;
#pragma unroll
  for (int c = 0; c < D; ++c) o[(h * T + i) * D + c] = from_float<bf16>(acc[c] / l);
  L[h * T + i] = m + logf(l);
}

}  // namespace

void forward(const void* q, const void* k, const void* v, void* o, float* L, float* /*P*/,
             AttnShape s, cudaStream_t stream) {
  const dim3 grid(unsigned((s.T + kRows - 1) / kRows), unsigned(s.heads));
  const auto *qb = static_cast<const bf16*>(q), *kb = static_cast<const bf16*>(k),
             *vb = static_cast<const bf16*>(v);
  auto* ob = static_cast<bf16*>(o);
  const float scale = 1.0f / sqrtf(float(s.d));
  switch (s.d) {
    case 32: forward_kernel<32><<<grid, kRows, 0, stream>>>(qb, kb, vb, ob, L, s.T, scale); return;
    case 64: forward_kernel<64><<<grid, kRows, 0, stream>>>(qb, kb, vb, ob, L, s.T, scale); return;
    case 128: forward_kernel<128><<<grid, kRows, 0, stream>>>(qb, kb, vb, ob, L, s.T, scale); return;
  }
  MT_THROW("attention lab v3: d = ", s.d, " (32, 64 or 128)");
}

}  // namespace mt::lab::attn_v3
