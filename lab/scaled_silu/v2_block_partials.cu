// Scaled-SiLU backward, v2: reduce in the block first, then one atomic per block.
//
// What changed: each thread's dy·x·s goes into a block-wide sum (warp shuffles, then the 8 warp
// totals), and only thread 0 touches dw. 256 times fewer atomics: the atomic unit stops being the
// bottleneck, and the kernel becomes what it should be, a pass over memory. Still one element per
// thread with 2-byte loads: a warp asks for 64 bytes at a time, too little to keep HBM busy.
#include "core/cuda/check.h"
#include "lab/common.cuh"
#include "lab/lab.h"

namespace mt::lab::silu_v2 {
namespace {

__global__ void backward_kernel(const bf16* x, const float* w, const bf16* dy, bf16* dx,
                                float* dw, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float term = 0.0f;  // this thread's dy·x·s (0 past the end: every thread joins the sum)
  if (i < n) {
    const float xv = to_float(x[i]), g = to_float(dy[i]);
    const float s = 1.0f / (1.0f + expf(-xv));
    dx[i] = from_float<bf16>(g * *w * (s + xv * s * (1.0f - s)));
    term = g * xv * s;
  }
  const float total = cuda::block_sum(term);  // valid in thread 0
  if (threadIdx.x == 0) atomicAdd(dw, total);
}

}  // namespace

void backward(const void* x, const float* w, const void* dy, void* dx, float* dw, int64_t n,
              cudaStream_t s) {
  if (n == 0) return;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  backward_kernel<<<unsigned(blocks), kThreads, 0, s>>>(static_cast<const bf16*>(x), w,
                                                       static_cast<const bf16*>(dy),
                                                       static_cast<bf16*>(dx), dw, n);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::lab::silu_v2
