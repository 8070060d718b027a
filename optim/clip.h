#pragma once
// Gradient clipping by global norm, PyTorch's torch.nn.utils.clip_grad_norm_ (norm_type 2):
//
//   norm = sqrt(Σ_params Σ_i g_i²)                    over every parameter that has a .grad
//   g   *= min(1, max_norm / (norm + 1e-6))          in place, for every such parameter
//
// Returns the norm before clipping, as a 0-dim tensor on the parameters' device: f32 (f64 for f64
// gradients). On CUDA the norm is one fused reduction over all gradients and the factor is
// computed and applied on the device, so clipping never waits for the GPU (the returned norm is
// read only when it is logged). On the CPU the sum runs in double.
//
// Sharded gradients (ZeRO-1, train/zero.h), where each rank holds a disjoint part of them:
// `sum_over_ranks` is called on Σ g² of this rank's part (a 1-element f64 tensor on the CPU, the
// 0-dim f32 device scalar on CUDA) and must replace it, in place, with the sum over all ranks;
// the norm and the factor then come from that global sum. It is called on every rank, also one
// whose part is empty.
//
// grad_norm_and_clip_factor is the same computation without the last line: it leaves .grad as
// it is and writes the norm and the factor, min(1, max_norm / (norm + 1e-6)), into tensors the
// caller owns, for an optimizer that folds the factor into its update (AdamW::set_grad_scale).
// Their addresses do not change from step to step, so a CUDA graph that recorded the call writes
// the same tensors on every replay. norm_out: 0-dim, on the parameters' device, f32 on CUDA, f32
// or f64 on the CPU (the norm rounded to it). factor_out: 0-dim, on that device, f32 on CUDA (the
// factor the in-place clip scales by, computed by the same kernel), f64 on the CPU (the double
// factor the in-place clip scales by). max_norm = inf gives factor 1: the norm alone.
//
// A NaN norm gives factor 1, so the gradients stay as they are (PyTorch's factor would be NaN and
// make every gradient NaN). Either way the step is not finite and the trainer stops at its next
// check; gradients left as they are keep the first non-finite one for that check's message.
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace mt::optim {

using SumOverRanks = std::function<void(const Tensor& sum_of_squares)>;

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm,
                       const SumOverRanks& sum_over_ranks = {});

void grad_norm_and_clip_factor(const std::vector<Tensor>& params, double max_norm,
                               const Tensor& norm_out, const Tensor& factor_out,
                               const SumOverRanks& sum_over_ranks = {});

}  // namespace mt::optim
