// CUDA kernels for clip_grad_norm_: see optim/clip_cuda.h.
#include "optim/clip_cuda.h"

#include <climits>
#include <cstdint>
#include <map>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/error.h"
#include "core/registry.h"
#include "optim/adamw_cuda.h"
#include "optim/kernels.h"

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

// ---- Tensor-level kernels registered on CUDA (optim/kernels.h): grad_norm_and_clip_factor and
// scale_grads for clip.cpp, zero_grads for Optimizer::zero_grad ---------------------------------
namespace mt::optim {
namespace {

// The gradients' device pointers and sizes, as the multi-tensor kernels take them.
struct DevicePtrs {
  std::vector<float*> ptrs;
  std::vector<int64_t> sizes;
};

DevicePtrs device_ptrs(const std::vector<Tensor>& grads) {
  DevicePtrs out;
  for (const Tensor& t : grads) {
    out.ptrs.push_back(t.data<float>());
    out.sizes.push_back(t.numel());
  }
  return out;
}

void grad_norm_and_clip_factor_cuda(const std::vector<Tensor>& grads, double max_norm,
                                    const SumOverRanks& sum_over_ranks, const Tensor& norm,
                                    const Tensor& factor) {
  const DevicePtrs d = device_ptrs(grads);
  cudaStream_t s = cuda::stream(norm.device().index);
  if (d.ptrs.empty()) norm.fill_(0.0);
  else cuda::grad_norm_sq(d.ptrs.data(), d.sizes.data(), int(d.ptrs.size()), norm.data<float>(), s);
  if (sum_over_ranks) sum_over_ranks(norm);
  cuda::clip_factor(norm.data<float>(), float(max_norm), factor.data<float>(), s);
  cuda::sqrt_scalar(norm.data<float>(), s);
  norm.bump_version();
  factor.bump_version();
}

void scale_grads_cuda(const std::vector<Tensor>& grads, const Tensor& factor) {
  const DevicePtrs d = device_ptrs(grads);
  cuda::scale_by_device_scalar(d.ptrs.data(), d.sizes.data(), int(d.ptrs.size()),
                               factor.data<float>(), cuda::stream(factor.device().index));
}

// One launch per device; versions bumped as fill_ does.
void zero_grads_cuda(const std::vector<Tensor>& grads) {
  std::map<int, std::vector<Tensor>> on_device;
  for (const Tensor& g : grads) on_device[g.device().index].push_back(g);
  for (const auto& [device, of_device] : on_device) {
    const DevicePtrs d = device_ptrs(of_device);
    cuda::set_device(device);
    cuda::zero_many(d.ptrs.data(), d.sizes.data(), int(d.ptrs.size()), cuda::stream(device));
    for (const Tensor& g : of_device) g.bump_version();
  }
}

}  // namespace

MT_REGISTER_KERNEL(grad_norm_and_clip_factor, Forward, CUDA, grad_norm_and_clip_factor_cuda);
MT_REGISTER_KERNEL(scale_grads, Forward, CUDA, scale_grads_cuda);
MT_REGISTER_KERNEL(zero_grads, Forward, CUDA, zero_grads_cuda);

}  // namespace mt::optim
