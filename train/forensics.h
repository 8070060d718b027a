#pragma once
// Where a NaN or inf came from, looked for when a step's loss or gradient norm is non-finite and
// before its update, so that the tensors that show the origin are still intact.
#include <string>
#include <vector>

#include "nn/module.h"
#include "train/task.h"

namespace mt::train {

// "3 of 64 values, e.g. nan" when `t` holds NaN or inf values; empty when it is all finite.
std::string non_finite_values(const Tensor& t);

// The first tensor of `state` that holds a NaN or inf, as "name (3 of 64 values, e.g. nan)";
// empty when all are finite.
std::string first_non_finite(const nn::StateDict& state);

// The origin of a step's non-finite loss, in the order a NaN spreads: a parameter of `model`;
// else an input of `batches`; else an activation, found by replaying task.loss on each
// microbatch with a forward hook (nn::ForwardHookGuard) that names the first module, by its dotted
// path in `model`, whose output is non-finite; else a gradient (the backward pass); else the loss.
// Returns one phrase, e.g. "non-finite activation: the output of layers.1 RMSNorm(...) (...)".
std::string find_non_finite(nn::Module& model, Task& task, const std::vector<Batch>& batches,
                            double normalizer);

}  // namespace mt::train
