#pragma once
// What every lab kernel shares: the bf16 type, a block-wide sum that every thread receives (the
// lab's RMSNorm versions reduce once per row, so it must be reusable), and the persistent grid.
#include <cuda_bf16.h>

#include "core/cuda/reduce.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/vec.cuh"
#include "lab/lab.h"

namespace mt::lab {

using bf16 = __nv_bfloat16;
using cuda::Pack;
using cuda::from_float;
using cuda::to_float;

constexpr int kThreads = 256;  // every lab kernel: 8 warps

// Σ v over the block (blockDim.x == kThreads), in a fixed order, returned to every thread. The
// second barrier lets the next call reuse the scratch.
__device__ inline float block_sum_all(float v) {
  __shared__ float warp_total[kThreads / 32];
  v = cuda::warp_sum(v);
  if (threadIdx.x % 32 == 0) warp_total[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) total += warp_total[i];
  __syncthreads();
  return total;
}

// max v over the block, returned to every thread (the same shape as block_sum_all).
__device__ inline float block_max_all(float v) {
  __shared__ float warp_max[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int i = 0; i < kThreads / 32; ++i) m = fmaxf(m, warp_max[i]);
  __syncthreads();
  return m;
}

// A persistent grid: `per_sm` blocks on every SM, at most `work` blocks.
inline int persistent_grid(int per_sm, int64_t work) {
  const int64_t cap = int64_t(cuda::sm_count(cuda::current_device())) * per_sm;
  return int(work < 1 ? 1 : work < cap ? work : cap);
}

}  // namespace mt::lab
