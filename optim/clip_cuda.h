#pragma once
// The CUDA halves of clip_grad_norm_ that act on device scalars (the fused norm reduction and the
// clip factor are in optim/adamw_cuda.h), and the multi-tensor zero fill of Optimizer::zero_grad.
// All run on `s` and never wait for the device.
#include <cstdint>

#include <cuda_runtime.h>

namespace mt::cuda {

// grads[k][i] *= *factor for every tensor k (host array of num device pointers and sizes), in
// one launch for up to 256 tensors. A factor of exactly 1 (nothing to clip, the usual case)
// writes nothing.
void scale_by_device_scalar(float* const* grads_host, const int64_t* sizes, int num,
                            const float* factor, cudaStream_t s);

// grads[k][i] = 0 for every tensor k, in one launch for up to 256 tensors (same arguments).
void zero_many(float* const* grads_host, const int64_t* sizes, int num, cudaStream_t s);

// *x = sqrt(*x): turns the squared norm into the norm, on the device.
void sqrt_scalar(float* x, cudaStream_t s);

}  // namespace mt::cuda
