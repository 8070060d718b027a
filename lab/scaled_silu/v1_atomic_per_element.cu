// Scaled-SiLU backward, v1: the math, translated directly.
//
// One thread per element, scalar bf16 loads, and dw as one atomicAdd per element into the single
// fp32 cell. It is correct, and a lesson in why it is not enough: every element's atomic goes to
// the same address, and the L2 slice that owns it performs them one at a time, so the kernel runs
// at the atomic unit's rate, not HBM's. The rounding of dw also depends on the arrival order.
#include "core/cuda/check.h"
#include "lab/common.cuh"
#include "lab/lab.h"

namespace mt::lab::silu_v1 {
namespace {

__global__ void backward_kernel(const bf16* x, const float* w, const bf16* dy, bf16* dx,
                                float* dw, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float xv = to_float(x[i]), g = to_float(dy[i]);
  const float s = 1.0f / (1.0f + expf(-xv));
  dx[i] = from_float<bf16>(g * *w * (s + xv * s * (1.0f - s)));  // dx = dy·w·(s + x·s·(1 − s))
  atomicAdd(dw, g * xv * s);                                     // dw += dy·x·s, one at a time
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

}  // namespace mt::lab::silu_v1
