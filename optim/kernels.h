#pragma once
// The optimizers' device work, dispatched as ops dispatch theirs: each is an entry of the op
// registry (core/registry.h, `train --list-ops`), defined with its Tensor-level signature in the
// optimizer's .cpp, with its CPU kernel there and its CUDA kernel in the optimizer's .cu, and the
// optimizer calls whichever the tensors' device names:
//
//   kernel<SGDStepFn>("sgd_step", Phase::Forward, p.device())(p, g, buf, lr, wd, momentum, nesterov);
//
// A CUDA build adds the .cu files and their registrations; no optimizer source says which build
// it is in, and a CUDA tensor in a build without CUDA is the registry's error naming the entry.
// Entries that only a GPU needs (one launch for many tensors, device scalars a CUDA graph reads)
// are declared for CUDA alone (MT_OP_BACKENDS); the CPU does that work inline.
//
// These are the optimizers' internals: the public API is in their own headers.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "optim/clip.h"

namespace mt::optim {

// ---- AdamW (adamw.cpp, adamw.cu) ----

// One parameter of an AdamW step: its tensors (contiguous, one dtype) and its step's values.
// hyper (CUDA): the device buffer that holds {lr, bc1, bc2} of every parameter, 3 floats each,
// and `index` this parameter's place in it.
struct AdamWParam {
  Tensor param, grad, exp_avg, exp_avg_sq;
  double lr, weight_decay, bc1, bc2;
  Tensor hyper;
  size_t index;
};

// "adamw_step": every parameter of `params` (all on one device type) updated in place, its
// compute copy refreshed; grad_scale (undefined: 1) multiplies each gradient first, a host value
// on the CPU and a device f32 scalar on CUDA. The CUDA kernel is one multi-tensor launch per
// device and compute dtype.
using AdamWStepFn = void(const std::vector<AdamWParam>& params, double b1, double b2, double eps,
                         const Tensor& grad_scale);

// "adamw_hyper" (CUDA): hyper[0, n) = values, without waiting: the values travel as kernel
// parameters, so a CUDA graph recorded once replays with each step's learning rate.
using AdamWHyperFn = void(const Tensor& hyper, const std::vector<float>& values);

// ---- SGD (sgd.cpp, sgd.cu) ----

// "sgd_step": p -= lr·d, d = g + weight_decay·p, through the momentum buffer when `buffer` is
// defined (d = buffer = momentum·buffer + d, or d + momentum·buffer with nesterov).
using SGDStepFn = void(const Tensor& p, const Tensor& g, const Tensor& buffer, double lr,
                       double weight_decay, double momentum, bool nesterov);

// ---- clipping (clip.cpp, clip.cu; CUDA only: the CPU computes in double inline) ----

// "grad_norm_and_clip_factor" (CUDA): *norm = sqrt(Σ g²) (summed over the ranks) and
// *factor = min(1, max_norm / (norm + 1e-6)), f32 device scalars, without waiting for the device.
using GradNormAndClipFactorFn = void(const std::vector<Tensor>& grads, double max_norm,
                                     const SumOverRanks& sum_over_ranks, const Tensor& norm,
                                     const Tensor& factor);

// "scale_grads" (CUDA): every grad *= *factor (a device f32 scalar), in one launch; a factor of
// exactly 1 writes nothing.
using ScaleGradsFn = void(const std::vector<Tensor>& grads, const Tensor& factor);

// ---- loss scaling (loss_scaler.cpp, loss_scaler.cu) ----

// "unscale_grads": every grad *= 1/scale in its own precision (f32 or f64, one device);
// returns whether any element is inf or NaN. The CUDA kernel waits for its one flag.
using UnscaleGradsFn = bool(const std::vector<Tensor>& grads, double scale);

// ---- zero_grad (optimizer.cpp; CUDA only, in clip.cu beside the multi-tensor scale it shares) ----

// "zero_grads" (CUDA): every grad (contiguous f32) = 0, one launch per device.
using ZeroGradsFn = void(const std::vector<Tensor>& grads);

}  // namespace mt::optim
