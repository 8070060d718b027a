#pragma once
// Fused log-softmax + negative log-likelihood on CUDA: the loss every classifier ends with.
//
//   lse[r]   = log sum_c exp(logits[r, c])
//   loss     = (sum over rows r with t_r != ignore_index of (lse[r] - logits[r, t_r])) / normalizer
//   dlogits  = dloss / normalizer * (softmax(logits[r, :]) - onehot(t_r)), 0 for ignored rows
//
// Saved vs recomputed: the forward saves one fp32 lse per row; the backward recomputes
// softmax = exp(logit - lse) from the logits (which autograd keeps anyway) instead of storing a
// rows x C probability matrix. The normalizer is the caller's (the full batch's count of
// non-ignored targets, for gradient-accumulation microbatches).
//
// Device pointers; logits and dlogits are [rows, C] contiguous in dt (f32, bf16, f16); targets
// int64 [rows]. The columns c >= valid (valid in [1, C]) are padding: out of lse, never a target,
// dlogits 0. Nothing here waits for the device.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"
#include "ops/cross_entropy/bad_target.h"

namespace mt::cuda {

// loss[0] = ... as above ('=', fp32, rows added in a fixed order: the same bits on every run).
// lse[r] ('=', fp32); ignored rows get 0. A non-ignored target outside [0, C) makes loss[0] NaN and
// goes to note_bad_target(*bad_target, lowest such row, ...) (bad_target: device-accessible,
// nullable); never cleared here.
void cross_entropy_forward(const void* logits, const int64_t* targets, float* loss, float* lse,
                           BadTargetRecord* bad_target, int64_t rows, int64_t C, int64_t valid,
                           int64_t ignore_index, float normalizer, DType dt, cudaStream_t s);

// dlogits ('=', in dt) as above; dloss is a device fp32 scalar (the seed gradient of the loss).
void cross_entropy_backward(const void* logits, const int64_t* targets, const float* lse,
                            const float* dloss, void* dlogits, int64_t rows, int64_t C,
                            int64_t valid, int64_t ignore_index, float normalizer, DType dt,
                            cudaStream_t s);

}  // namespace mt::cuda
