#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/autograd.h"
#include "core/registry.h"
#include "optim/kernels.h"

namespace mt::optim {
namespace {

// The dynamic scale never goes below 1, so it can neither start nor be restored there.
bool valid_scale(LossScaleMode mode, double scale) {
  return std::isfinite(scale) && scale > 0 && (mode != LossScaleMode::dynamic || scale >= 1);
}

// g *= inv in g's own precision (the CUDA `scale` kernel multiplies by the fp32 reciprocal too),
// returning whether any element is inf or NaN. For a power-of-two scale the product is exact.
template <class T>
bool unscale_cpu(const Tensor& grad, double scale) {
  T* g = grad.data<T>();
  const T inv = T(1.0 / scale);
  bool found_inf = false;
  for (int64_t i = 0; i < grad.numel(); ++i) {
    g[i] *= inv;
    found_inf = found_inf || !std::isfinite(g[i]);
  }
  return found_inf;
}

// The registered CPU kernel.
bool unscale_grads_cpu(const std::vector<Tensor>& grads, double scale) {
  bool found_inf = false;
  for (const Tensor& g : grads)
    found_inf |= g.dtype() == DType::f64 ? unscale_cpu<double>(g, scale) : unscale_cpu<float>(g, scale);
  return found_inf;
}

const Tensor& entry(const nn::StateDict& dict, const std::string& key, DType dtype) {
  auto it = std::find_if(dict.begin(), dict.end(), [&](const auto& e) { return e.first == key; });
  MT_CHECK(it != dict.end(), "LossScaler::load_state_dict: no '", key, "' entry (was the state "
           "saved by a run without loss scaling?)");
  MT_CHECK(it->second.numel() == 1 && it->second.dtype() == dtype, "LossScaler::load_state_dict: '",
           key, "' must be one ", dtype_name(dtype), " value, got ", dtype_name(it->second.dtype()),
           " of shape ", shape_str(it->second.shape()));
  return it->second;
}

}  // namespace

MT_DEFINE_OP(unscale_grads, "g *= 1/scale for every gradient; whether any is inf or NaN",
             UnscaleGradsFn, void);
MT_REGISTER_KERNEL(unscale_grads, Forward, CPU, unscale_grads_cpu);

LossScaler::LossScaler(LossScalerOptions options)
    : options_(options), scale_(options.mode == LossScaleMode::none ? 1.0 : options.init_scale) {
  MT_CHECK(valid_scale(options.mode, scale_),
           "LossScaler: the scale must be finite and positive (at least 1 when dynamic), got ",
           options.init_scale);
  MT_CHECK(options.growth_interval >= 1, "LossScaler: growth_interval must be at least 1, got ",
           options.growth_interval);
}

Tensor LossScaler::seed_for(const Tensor& loss) const {
  if (!enabled()) return Tensor();
  return full(loss.shape(), scale_, loss.dtype(), loss.device());
}

bool LossScaler::unscale_and_check(const std::vector<Tensor>& params) {
  if (!enabled()) return false;
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return false;
  for (const Tensor& g : grads)
    MT_CHECK(g.device() == grads[0].device() && g.is_contiguous() &&
                 (g.dtype() == DType::f32 || g.dtype() == DType::f64),
             "LossScaler::unscale_and_check: every .grad must be a contiguous f32 or f64 tensor on "
             "one device; got ", dtype_name(g.dtype()), " on ", g.device().str(), " beside ",
             grads[0].device().str());
  NoGradGuard no_grad;
  const bool found_inf =
      kernel<UnscaleGradsFn>("unscale_grads", Phase::Forward, grads[0].device())(grads, scale_);
  for (const Tensor& g : grads) g.bump_version();
  return found_inf;
}

bool LossScaler::update(bool found_inf) {
  if (!enabled()) return false;
  if (found_inf) {
    ++skipped_;
    growth_tracker_ = 0;
    if (options_.mode == LossScaleMode::dynamic) scale_ = std::max(1.0, scale_ / 2);
    return true;
  }
  if (options_.mode == LossScaleMode::dynamic && ++growth_tracker_ >= options_.growth_interval) {
    scale_ *= 2;
    growth_tracker_ = 0;
  }
  return false;
}

nn::StateDict LossScaler::state_dict() const {
  if (!enabled()) return {};
  return {{"scale", full({}, scale_, DType::f64)},
          {"growth_tracker", from_vector(std::vector<int64_t>{growth_tracker_}, {})},
          {"skipped_steps", from_vector(std::vector<int64_t>{skipped_}, {})}};
}

void LossScaler::load_state_dict(const nn::StateDict& dict) {
  if (!enabled()) return;
  // Every entry is checked before any is used: a bad dict changes nothing.
  for (const auto& [key, _] : dict)
    MT_CHECK(key == "scale" || key == "growth_tracker" || key == "skipped_steps",
             "LossScaler::load_state_dict: unexpected key '", key, "'");
  const double scale = entry(dict, "scale", DType::f64).item();
  const double tracker = entry(dict, "growth_tracker", DType::i64).item();
  const double skipped = entry(dict, "skipped_steps", DType::i64).item();
  MT_CHECK(valid_scale(options_.mode, scale) && tracker >= 0 && skipped >= 0,
           "LossScaler::load_state_dict: impossible state: scale ", scale, ", growth_tracker ",
           tracker, ", skipped_steps ", skipped);
  if (options_.mode == LossScaleMode::dynamic) scale_ = scale;
  growth_tracker_ = int64_t(tracker);
  skipped_ = int64_t(skipped);
}

}  // namespace mt::optim
