// CUDA kernels for clip_grad_norm_: see optim/clip_cuda.h.
#include "optim/clip_cuda.h"

#include <algorithm>

#include "core/cuda/check.h"

namespace mt::cuda {
namespace {

__global__ void scale_kernel(float* g, int64_t n, const float* factor) {
  const float f = *factor;
  if (f == 1.0f) return;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    g[i] *= f;
}

__global__ void sqrt_kernel(float* x) { *x = sqrtf(*x); }

}  // namespace

void scale_by_device_scalar(float* const* grads_host, const int64_t* sizes, int num,
                            const float* factor, cudaStream_t s) {
  constexpr int kThreads = 256;
  for (int k = 0; k < num; ++k) {
    if (sizes[k] == 0) continue;
    const int64_t blocks = std::min<int64_t>((sizes[k] + kThreads - 1) / kThreads, 4096);
    scale_kernel<<<unsigned(blocks), kThreads, 0, s>>>(grads_host[k], sizes[k], factor);
    MT_CUDA_CHECK_LAUNCH();
  }
}

void sqrt_scalar(float* x, cudaStream_t s) {
  sqrt_kernel<<<1, 1, 0, s>>>(x);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
