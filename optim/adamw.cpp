#include "optim/adamw.h"

#include <cmath>
#include <map>

#include "core/autograd.h"
#include "core/registry.h"
#include "nn/module.h"
#include "optim/kernels.h"

namespace mt::optim {
namespace {

// The CPU reference, in the parameter's dtype T (float, or double for f64 parameters). bc1 and
// bc2 are the bias corrections 1 − β^t, computed in double by the caller. The gradient is
// T(grad · grad_scale), rounded as clip_grad_norm_ rounds its scaled gradient (grad_scale 1
// leaves it exact).
template <class T>
void adamw_cpu(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               double lr, double weight_decay, double b1, double b2, double eps, double bc1, double bc2,
               double grad_scale) {
  T* p = param.data<T>();
  const T* grad_data = grad.data<T>();
  T* m = exp_avg.data<T>();
  T* v = exp_avg_sq.data<T>();
  for (int64_t i = 0; i < param.numel(); ++i) {
    const T g = T(grad_data[i] * grad_scale);
    p[i] *= T(1) - T(lr) * T(weight_decay);
    m[i] = T(b1) * m[i] + (T(1) - T(b1)) * g;
    v[i] = T(b2) * v[i] + (T(1) - T(b2)) * g * g;
    p[i] -= T(lr) * (m[i] / T(bc1)) / (std::sqrt(v[i] / T(bc2)) + T(eps));
  }
}

// The registered CPU kernel: the reference for each parameter, the factor read once as a host
// value.
void adamw_step_cpu(const std::vector<AdamWParam>& params, double b1, double b2, double eps,
                    const Tensor& grad_scale) {
  const double scale = grad_scale.defined() ? grad_scale.item() : 1.0;
  for (const AdamWParam& u : params) {
    auto update = u.param.dtype() == DType::f64 ? adamw_cpu<double> : adamw_cpu<float>;
    update(u.param, u.grad, u.exp_avg, u.exp_avg_sq, u.lr, u.weight_decay, b1, b2, eps, u.bc1,
           u.bc2, scale);
    nn::refresh_compute_copies({u.param});
  }
}

}  // namespace

MT_DEFINE_OP(adamw_step, "AdamW: m, v = moments of g; p = p(1 - lr wd) - lr m^/(sqrt(v^) + eps)",
             AdamWStepFn, void);
MT_REGISTER_KERNEL(adamw_step, Forward, CPU, adamw_step_cpu);
MT_DEFINE_OP(adamw_hyper, "hyper[i] = {lr, 1 - b1^t, 1 - b2^t} of parameter i, on the device",
             AdamWHyperFn, void);
MT_OP_BACKENDS(adamw_hyper, CUDA);

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Optimizer(std::move(groups), options.lr, options.weight_decay, {"exp_avg", "exp_avg_sq"}),
      options_(options) {
  const auto [b1, b2] = options.betas;
  MT_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1 && options.eps >= 0, "AdamW: betas must be in [0, 1) "
           "and eps >= 0, got betas (", b1, ", ", b2, ") and eps ", options.eps);
}

bool AdamW::set_grad_scale(Tensor factor) {
  MT_CHECK(!factor.defined() || (factor.dim() == 0 && is_floating(factor.dtype()) &&
                                 (factor.device().is_cpu() || factor.dtype() == DType::f32)),
           "AdamW::set_grad_scale: the factor must be a 0-dim float tensor (f32 on CUDA), got ",
           factor.defined() ? factor.str() : "");
  grad_scale_ = std::move(factor);
  return true;
}

void AdamW::step() {
  prepare_step();
  apply_step();
}

void AdamW::prepare_step() {
  const auto [b1, b2] = options_.betas;
  pending_.clear();
  size_t index = 0, num_params = 0;
  for (const ParamGroup& group : groups_) num_params += group.params.size();
  std::map<int, std::vector<float>> hyper;  // per CUDA device, indexed like hyper_
  for (const ParamGroup& group : groups_) {
    for (const Tensor& p : group.params) {
      const size_t i = index++;
      const Tensor g = p.grad();
      if (!g.defined()) continue;  // not part of this step's loss
      MT_CHECK(p.is_contiguous() && g.is_contiguous() && g.dtype() == p.dtype(), "AdamW: parameter ",
               i, " and its .grad must be contiguous and of one dtype, got ", dtype_name(p.dtype()),
               " and ", dtype_name(g.dtype()));
      const int64_t t = ++state(i).step;
      pending_.push_back({i, p, *group.lr, *group.weight_decay, 1 - std::pow(b1, double(t)),
                          1 - std::pow(b2, double(t))});
      if (p.device().is_cuda()) {
        MT_CHECK(p.dtype() == DType::f32, "AdamW: CUDA parameters must be f32, got ", dtype_name(p.dtype()));
        std::vector<float>& h = hyper[p.device().index];
        if (h.empty()) h.resize(3 * num_params);
        const Pending& u = pending_.back();
        h[3 * i] = float(u.lr), h[3 * i + 1] = float(u.bc1), h[3 * i + 2] = float(u.bc2);
      }
    }
  }
  for (const auto& [device, values] : hyper) {
    Tensor& buf = hyper_[device];
    if (!buf.defined() || buf.numel() != int64_t(values.size()))
      buf = zeros({int64_t(values.size())}, DType::f32, cuda_device(device));
    kernel<AdamWHyperFn>("adamw_hyper", Phase::Forward, buf.device())(buf, values);
  }
  ++steps_;
}

void AdamW::apply_step() {
  NoGradGuard no_grad;
  const auto [b1, b2] = options_.betas;
  // The parameters by device type: one kernel call each (the CUDA one launches per device).
  std::map<DeviceType, std::vector<AdamWParam>> by_type;
  for (const Pending& u : pending_) {
    const Tensor& p = u.param;
    const Tensor g = p.grad();
    MT_CHECK(g.defined(), "AdamW: parameter ", u.index, " lost its .grad between prepare_step and "
             "apply_step");
    MT_CHECK(!grad_scale_.defined() || grad_scale_.device() == p.device(), "AdamW: the gradient "
             "scale is on ", grad_scale_.device().str(), ", parameter ", u.index, " on ", p.device().str());
    const Tensor m = buffer(u.index, "exp_avg", p, p.dtype());
    const Tensor v = buffer(u.index, "exp_avg_sq", p, p.dtype());
    const Tensor hyper = p.device().is_cuda() ? hyper_.at(p.device().index) : Tensor();
    by_type[p.device().type].push_back({p, g, m, v, u.lr, u.weight_decay, u.bc1, u.bc2, hyper, u.index});
  }
  for (const auto& [type, params] : by_type)
    kernel<AdamWStepFn>("adamw_step", Phase::Forward, params[0].param.device())(
        params, b1, b2, options_.eps, grad_scale_);
  for (const Pending& u : pending_) u.param.bump_version();
}

}  // namespace mt::optim
