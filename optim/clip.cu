// CUDA kernels for clip_grad_norm_: see optim/clip_cuda.h.
#include "optim/clip_cuda.h"

#include <climits>
#include <cstdint>

#include "core/cuda/check.h"
#include "core/error.h"

namespace mt::cuda {
namespace {

// One launch scales (or zeroes) every tensor, as AdamW's multi-tensor update (optim/adamw.cu):
// each tensor is cut into chunks of kChunk elements and block b owns one (tensor, chunk), found
// by binary search over the tensors' first blocks; the descriptors travel as the kernel's
// __grid_constant__ parameter (5 KB), so a CUDA graph records them by value. More than
// kMaxTensors tensors take one more launch per kMaxTensors.
constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;  // elements per block: 64 per thread
constexpr int kMaxTensors = 256;

struct ScaleBatch {
  float* g[kMaxTensors];
  int64_t n[kMaxTensors];
  int first_block[kMaxTensors];  // block index where tensor i's chunks start (increasing)
  int num;
};

// g *= *factor, or g = 0 when factor is null.
__global__ void __launch_bounds__(kThreads)
    scale_kernel(const __grid_constant__ ScaleBatch batch, const float* factor) {
  const float f = factor != nullptr ? *factor : 0.0f;
  if (factor != nullptr && f == 1.0f) return;  // nothing to clip, the usual case: no write
  int lo = 0, hi = batch.num - 1;  // the last tensor whose first block is <= blockIdx.x
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (batch.first_block[mid] <= int(blockIdx.x)) lo = mid;
    else hi = mid - 1;
  }
  float* g = batch.g[lo];
  const int64_t begin = int64_t(blockIdx.x - batch.first_block[lo]) * kChunk;
  const int64_t end = begin + kChunk < batch.n[lo] ? begin + kChunk : batch.n[lo];
  if (factor == nullptr) {
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) g[i] = 0.0f;
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) g[i] *= f;
  }
}

// scale_kernel over every non-empty tensor, kMaxTensors at a time.
void launch_over(float* const* grads_host, const int64_t* sizes, int num, const float* factor,
                 cudaStream_t s) {
  ScaleBatch batch{};
  int blocks = 0;
  auto launch = [&] {
    if (batch.num > 0) {
      scale_kernel<<<unsigned(blocks), kThreads, 0, s>>>(batch, factor);
      MT_CUDA_CHECK_LAUNCH();
    }
    batch.num = 0, blocks = 0;
  };
  for (int k = 0; k < num; ++k) {
    if (sizes[k] == 0) continue;
    const int64_t chunks = (sizes[k] + kChunk - 1) / kChunk;
    if (batch.num == kMaxTensors || int64_t(blocks) + chunks > int64_t(INT32_MAX)) launch();
    batch.g[batch.num] = grads_host[k];
    batch.n[batch.num] = sizes[k];
    batch.first_block[batch.num] = blocks;
    ++batch.num;
    blocks += int(chunks);
  }
  launch();
}

__global__ void sqrt_kernel(float* x) { *x = sqrtf(*x); }

}  // namespace

void scale_by_device_scalar(float* const* grads_host, const int64_t* sizes, int num,
                            const float* factor, cudaStream_t s) {
  MT_CHECK(factor != nullptr, "scale_by_device_scalar: null factor");
  launch_over(grads_host, sizes, num, factor, s);
}

void zero_many(float* const* grads_host, const int64_t* sizes, int num, cudaStream_t s) {
  launch_over(grads_host, sizes, num, nullptr, s);
}

void sqrt_scalar(float* x, cudaStream_t s) {
  sqrt_kernel<<<1, 1, 0, s>>>(x);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
