#pragma once
// Sums across a warp and across a block, in a fixed order, so the same inputs give the same bits
// on every run (no atomics).

namespace mt::cuda {

// A butterfly over the 32 lanes of a full warp; every lane gets the total.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024): a butterfly inside each warp,
// then warp 0 over the warp totals in warp order. The result is valid in thread 0. Its barrier
// also orders every earlier shared-memory write of the block before what follows. Called at most
// once per kernel (the shared buffer is not re-synchronized).
__device__ inline float block_sum(float v) {
  __shared__ float warp_total[32];
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_total[warp] = v;
  __syncthreads();
  if (warp == 0) v = warp_sum(lane < int(blockDim.x >> 5) ? warp_total[lane] : 0.f);
  return v;
}

}  // namespace mt::cuda
