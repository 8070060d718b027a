#pragma once
// AdamW (Loshchilov & Hutter), with PyTorch's torch.optim.AdamW semantics. Per parameter, with t
// its own step count (a parameter without a .grad is skipped and its t does not advance):
//
//   p  = p · (1 − lr · weight_decay)           decoupled decay: not part of the gradient
//   m  = β1 · m + (1 − β1) · g
//   v  = β2 · v + (1 − β2) · g²
//   p  = p − lr · (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + eps)
//
// State per parameter: exp_avg (m) and exp_avg_sq (v), fp32 (f64 for f64 parameters).
// On the CPU this is a plain loop per parameter. On CUDA every parameter of a device is updated by
// ONE fused launch (optim/adamw_cuda.h), which also rewrites each bf16/f16 compute copy in the
// same pass; parameters without a copy ride in the same launch. Only bf16 and f16 copies side by
// side on one device take two.
//
// Folded gradient clipping, set_grad_scale(factor): every update then uses
//
//   g  = .grad · factor                         factor read at update time, .grad left unscaled
//
// in place of g above, which is bitwise what clip_grad_norm_ followed by step() computes when
// factor is the one grad_norm_and_clip_factor (optim/clip.h) wrote: on the CPU g = T(.grad ·
// factor) with factor the f64 tensor's double value, rounded to T as the in-place clip rounds
// it; on CUDA one f32 multiply by the f32 device scalar, as the in-place clip's kernel does. The
// point is the pass it saves: the in-place clip reads and rewrites every gradient (8 bytes per
// parameter), here the update reads .grad anyway. After step() .grad holds the unclipped gradient.
//
// Capturable: the host keeps the step counts (they are what a checkpoint saves) and computes
// lr, 1 − β1^t and 1 − β2^t in double; prepare_step() writes them, three floats per parameter, to
// a device buffer allocated once, and the kernel reads them there. So apply_step() launches the
// same kernels with the same arguments every step, which is what a CUDA graph needs to replay it.
#include <map>
#include <utility>
#include <vector>

#include "optim/optimizer.h"

namespace mt::optim {

struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options);
  AdamW(const std::vector<Tensor>& params, AdamWOptions options)
      : AdamW(std::vector<ParamGroup>{{params, std::nullopt, std::nullopt}}, options) {}
  void step() override;
  bool capturable() const override { return true; }
  void prepare_step() override;
  void apply_step() override;
  // Folds `factor` (a 0-dim tensor on the parameters' device: f32 on CUDA, read through its
  // pointer, so a CUDA graph of apply_step() reads each replay's value; any float dtype on the
  // CPU, read as a double) into every later update, as above; an undefined tensor ends it.
  bool set_grad_scale(Tensor factor) override;

 private:
  // One parameter's update as prepare_step() decided it.
  struct Pending {
    size_t index;   // across groups
    Tensor param;
    double lr, weight_decay, bc1, bc2;
  };
  AdamWOptions options_;
  std::vector<Pending> pending_;
  std::map<int, Tensor> hyper_;  // per CUDA device: f32 [3 · parameters], {lr, bc1, bc2} each
  Tensor grad_scale_;            // set_grad_scale's factor, or undefined
};

}  // namespace mt::optim
