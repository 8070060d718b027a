#pragma once
// Learning-rate schedules: a pure function of the step, so resuming at step s gives exactly the
// learning rate an uninterrupted run had there. The training loop calls, before each step,
//
//   optimizer.set_lr(schedule.lr_at(step));
//
// with `step` the run's step, a skipped one (an f16 overflow) counted too, as PyTorch's
// scheduler.step() runs after every step (not the optimizer's steps_taken(), which skips it).
// Steps count from 0: lr_at(0) is the learning rate of the first update.
#include <cstdint>

namespace mt::optim {

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  virtual double lr_at(int64_t step) const = 0;
};

class ConstantLR : public LRSchedule {
 public:
  explicit ConstantLR(double lr);
  double lr_at(int64_t) const override { return lr_; }

 private:
  double lr_;
};

// Linear warmup to max_lr, then cosine decay to min_lr at total_steps, then min_lr:
//
//   step < warmup:          max_lr · (step + 1) / warmup
//   warmup <= step < total: min_lr + (max_lr − min_lr) · (1 + cos(π · (step − warmup) / (total − warmup))) / 2
//   step >= total:          min_lr
//
// This is PyTorch's SequentialLR([LinearLR(start_factor = 1/warmup, total_iters = warmup − 1),
// CosineAnnealingLR(T_max = total − warmup, eta_min = min_lr)], milestones = [warmup]) in closed
// form, except that past total_steps it stays at min_lr where CosineAnnealingLR would rise again.
// Warmup starts at max_lr / warmup rather than 0, so the first step is not wasted.
class WarmupCosineLR : public LRSchedule {
 public:
  WarmupCosineLR(double max_lr, int64_t warmup_steps, int64_t total_steps, double min_lr = 0);
  double lr_at(int64_t step) const override;

 private:
  double max_lr_, min_lr_;
  int64_t warmup_, total_;
};

}  // namespace mt::optim
