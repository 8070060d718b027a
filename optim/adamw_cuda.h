#pragma once
// The fused CUDA AdamW update and the global gradient norm used for clipping.
//
// One launch updates every parameter (a multi-tensor kernel, as in apex's multi_tensor_apply):
// per-parameter launches would cost more in launch latency than the update itself for the many
// small tensors of a model. All state is fp32: param (the master weight), m, v; the grad is the
// fp32 .grad. Everything that changes from step to step is read through device pointers: the
// learning rate and bias corrections (written by the host before the step with write_floats, one
// launch) and the gradient scale that carries clipping (the loss scaler unscales .grad itself,
// before). So a step never waits for the host, and a CUDA graph that recorded it once replays
// any later step.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

struct AdamWTensor {
  float* param;        // fp32 master weight, updated in place
  const float* grad;   // fp32 gradient
  float* m;            // fp32 first moment
  float* v;            // fp32 second moment
  void* lowp;          // nullable: the compute-dtype copy of param, rewritten in the same pass
  const float* hyper;  // device {lr, bc1, bc2} of this tensor's step
  int64_t n;           // elements
  float weight_decay;  // decoupled decay for this tensor (0 for biases and norms, if so chosen)
};

// For every tensor, elementwise, in fp32:
//   g = grad * (*grad_scale)                       (grad_scale nullable: 1)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p * (1 - lr * weight_decay)                (decoupled decay, as torch.optim.AdamW)
//   p = p - lr * (m / bc1) / (sqrt(v / bc2) + eps)
//   lowp = p rounded to lowp_dt (bf16 or f16), where lowp is given
// lr, bc1 = 1 - b1^step and bc2 = 1 - b2^step are read from each tensor's `hyper` (computed on the
// host in double, rounded once). tensors_host is a host array; tensors with grad == nullptr must
// not be in it. Tensors with and without lowp share the launch: lowp_dt is the dtype of every
// lowp given (f32 when none is).
void adamw_step(const AdamWTensor* tensors_host, int num_tensors, float b1, float b2, float eps,
                const float* grad_scale, DType lowp_dt, cudaStream_t s);

// dst[0, n) ('=') = src_host[0, n): the values travel as kernel parameters (up to 4096 floats a
// launch), so the host buffer is free when this returns, nothing waits, and, recorded outside a
// CUDA graph, it refreshes what a replay reads.
void write_floats(float* dst, const float* src_host, int n, cudaStream_t s);

// *out_sq ('=') = sum over all tensors of sum g^2, in fp32, in a fixed order (per-block partials,
// then one block adds them in index order): two launches, the same bits on every run.
// grads_host and sizes are host arrays of num device pointers and their element counts. The
// partials come from the framework's stream-ordered pool: `s` must be mt::cuda::stream(device).
void grad_norm_sq(const float* const* grads_host, const int64_t* sizes, int num, float* out_sq,
                  cudaStream_t s);

// *factor = min(1, max_norm / (sqrt(*norm_sq) + 1e-6)), on the device (one thread). An inf norm
// gives 0; a NaN norm gives 1 (the gradients are NaN anyway: the non-finite check catches them).
void clip_factor(const float* norm_sq, float max_norm, float* factor, cudaStream_t s);

}  // namespace mt::cuda
