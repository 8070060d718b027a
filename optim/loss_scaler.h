#pragma once
// Loss scaling for f16 training: PyTorch's torch.amp.GradScaler, as one small class.
//
// f16 has 5 exponent bits: its smallest subnormal is 2^-24 ≈ 6e-8 and its largest value 65504.
// Activation gradients in a backward pass are often smaller than that floor (a cross-entropy
// gradient is (softmax − onehot) / batch) and would flush to zero. Scaling the loss by S before
// backward scales every gradient by S (backward is linear in its seed), lifting them into f16's
// range; the fp32 parameter gradients are divided by S again before clipping and the optimizer.
// bf16 has fp32's exponent range and needs none of this (mode none).
//
//   optim::LossScaler scaler({LossScaleMode::dynamic});
//   for (microbatch : step) loss(microbatch).backward(scaler.seed_for(loss));   // dL/dθ · S
//   const bool overflow = scaler.unscale_and_check(params);                      // .grad /= S
//   if (!scaler.update(overflow)) { clip_grad_norm_(params, 1.0); optimizer.step(); }
//   optimizer.zero_grad();                                                       // either way
//
// Dynamic mode (GradScaler's rule): start at 2^16; a step whose gradients hold an inf or NaN is
// skipped and the scale halves (never below 1); after growth_interval clean steps in a row the
// scale doubles. The scale is always a power of two times the initial scale, so with the default
// initial scale scaling and unscaling are exact: multiplying by 2^k changes only exponents.
//
// Modes:
//   dynamic  the rule above
//   fixed    one scale for the whole run; an overflowing step is still skipped (applying inf
//            gradients would destroy the weights), but the scale does not move
//   none     scale 1: seed_for gives the default seed, unscale_and_check and update do nothing.
//            What bf16, f32 and f64 training use.
//
// unscale_and_check is the one place a step waits for the device: whether to skip the step is a
// host decision (it decides whether clipping and the optimizer run, and it is logged), so the
// overflow flag is read back once per step. Everything else stays on the device.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"

namespace mt::optim {

enum class LossScaleMode { none, fixed, dynamic };

struct LossScalerOptions {
  LossScaleMode mode = LossScaleMode::dynamic;
  double init_scale = 65536.0;   // dynamic: where the scale starts; fixed: the scale
  int64_t growth_interval = 200;  // dynamic: clean steps in a row before the scale doubles
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  LossScaleMode mode() const { return options_.mode; }
  bool enabled() const { return options_.mode != LossScaleMode::none; }
  // The current scale (1 in mode none).
  double scale() const { return scale_; }
  // Steps update() reported as skipped, over the whole run (restored on resume).
  int64_t skipped_steps() const { return skipped_; }
  // Clean steps since the scale last changed or overflowed (dynamic mode).
  int64_t growth_tracker() const { return growth_tracker_; }

  // The gradient to start `loss.backward(...)` from: a tensor shaped like the loss (0-dim for a
  // scalar loss), filled with the scale, in the loss's dtype and on its device. Mode none returns
  // an undefined tensor, which backward reads as its default seed of ones.
  Tensor seed_for(const Tensor& loss) const;

  // Divides every parameter's .grad by the scale in place and returns whether any of them holds
  // an inf or NaN (an overflow somewhere in the scaled backward). Parameters without a .grad are
  // skipped. Mode none returns false without touching anything. Reads one flag back from the
  // device (see above).
  bool unscale_and_check(const std::vector<Tensor>& params);

  // Ends a step: returns true when the step must be skipped (found_inf), and moves the scale by
  // the mode's rule. Call it once per optimizer step, after unscale_and_check.
  bool update(bool found_inf);

  // Checkpoint form: "scale" (f64), "growth_tracker" and "skipped_steps" (i64), all 0-dim; empty
  // in mode none. load_state_dict restores them (a fixed scale stays the configured one); a
  // missing, unexpected or mistyped entry is an mt::Error naming the key. Mode none ignores the
  // dict, so a run can switch to bf16 on resume.
  nn::StateDict state_dict() const;
  void load_state_dict(const nn::StateDict& dict);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace mt::optim
