#include "optim/schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace mt::optim {

ConstantLR::ConstantLR(double lr) : lr_(lr) {
  MT_CHECK(lr >= 0, "ConstantLR: the learning rate must be >= 0, got ", lr);
}

WarmupCosineLR::WarmupCosineLR(double max_lr, int64_t warmup_steps, int64_t total_steps, double min_lr)
    : max_lr_(max_lr), min_lr_(min_lr), warmup_(warmup_steps), total_(total_steps) {
  MT_CHECK(0 <= min_lr && min_lr <= max_lr, "WarmupCosineLR: need 0 <= min_lr <= max_lr, got min_lr ",
           min_lr, " and max_lr ", max_lr);
  MT_CHECK(0 <= warmup_steps && warmup_steps <= total_steps, "WarmupCosineLR: need 0 <= warmup_steps "
           "<= total_steps, got ", warmup_steps, " and ", total_steps);
}

double WarmupCosineLR::lr_at(int64_t step) const {
  MT_CHECK(step >= 0, "WarmupCosineLR: step must be >= 0, got ", step);
  if (step < warmup_) return max_lr_ * double(step + 1) / double(warmup_);
  if (step >= total_) return min_lr_;
  const double progress = double(step - warmup_) / double(total_ - warmup_);
  return min_lr_ + (max_lr_ - min_lr_) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace mt::optim
