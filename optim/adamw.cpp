#include "optim/adamw.h"

#include <cmath>
#include <map>

#include "core/autograd.h"
#include "nn/module.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/runtime.h"
#include "optim/adamw_cuda.h"
#endif

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

}  // namespace

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
#ifdef MT_WITH_CUDA
  std::map<int, std::vector<float>> hyper;  // per device, indexed like hyper_
#endif
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
#ifdef MT_WITH_CUDA
      if (p.device().is_cuda()) {
        MT_CHECK(p.dtype() == DType::f32, "AdamW: CUDA parameters must be f32, got ", dtype_name(p.dtype()));
        std::vector<float>& h = hyper[p.device().index];
        if (h.empty()) h.resize(3 * num_params);
        const Pending& u = pending_.back();
        h[3 * i] = float(u.lr), h[3 * i + 1] = float(u.bc1), h[3 * i + 2] = float(u.bc2);
      }
#endif
    }
  }
#ifdef MT_WITH_CUDA
  for (const auto& [device, values] : hyper) {
    Tensor& buf = hyper_[device];
    if (!buf.defined() || buf.numel() != int64_t(values.size()))
      buf = zeros({int64_t(values.size())}, DType::f32, cuda_device(device));
    cuda::write_floats(buf.data<float>(), values.data(), int(values.size()), cuda::stream(device));
  }
#endif
  ++steps_;
}

void AdamW::apply_step() {
  NoGradGuard no_grad;
  const auto [b1, b2] = options_.betas;
  // Read once: a CPU factor is a host value (a CUDA one is read by the kernel).
  const double cpu_grad_scale =
      grad_scale_.defined() && grad_scale_.device().is_cpu() ? grad_scale_.item() : 1.0;
#ifdef MT_WITH_CUDA
  // Per device, the tensors by their compute copy's dtype (f32: no copy).
  std::map<int, std::map<DType, std::vector<cuda::AdamWTensor>>> launches;
#endif
  for (const Pending& u : pending_) {
    const Tensor& p = u.param;
    const Tensor g = p.grad();
    MT_CHECK(g.defined(), "AdamW: parameter ", u.index, " lost its .grad between prepare_step and "
             "apply_step");
    MT_CHECK(!grad_scale_.defined() || grad_scale_.device() == p.device(), "AdamW: the gradient "
             "scale is on ", grad_scale_.device().str(), ", parameter ", u.index, " on ", p.device().str());
    const Tensor m = buffer(u.index, "exp_avg", p, p.dtype());
    const Tensor v = buffer(u.index, "exp_avg_sq", p, p.dtype());
    if (p.device().is_cpu()) {
      auto update = p.dtype() == DType::f64 ? adamw_cpu<double> : adamw_cpu<float>;
      update(p, g, m, v, u.lr, u.weight_decay, b1, b2, options_.eps, u.bc1, u.bc2, cpu_grad_scale);
      nn::refresh_compute_copies({p});
    } else {
#ifdef MT_WITH_CUDA
      const Tensor lowp = p.compute_copy();
      launches[p.device().index][lowp.defined() ? lowp.dtype() : DType::f32].push_back(
          {p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(),
           lowp.defined() ? lowp.data_ptr() : nullptr,
           hyper_.at(p.device().index).data<float>() + 3 * u.index, p.numel(),
           float(u.weight_decay)});
#endif
    }
    p.bump_version();
  }
#ifdef MT_WITH_CUDA
  const float* grad_scale = grad_scale_.defined() && grad_scale_.device().is_cuda()
                               ? grad_scale_.data<float>() : nullptr;
  for (auto& [device, by_dtype] : launches) {
    // The tensors without a copy join a launch with copies: the kernel skips a null copy's store.
    if (by_dtype.size() > 1) {
      if (auto plain = by_dtype.extract(DType::f32)) {
        std::vector<cuda::AdamWTensor>& into = by_dtype.begin()->second;
        into.insert(into.end(), plain.mapped().begin(), plain.mapped().end());
      }
    }
    for (const auto& [lowp_dt, tensors] : by_dtype)
      cuda::adamw_step(tensors.data(), int(tensors.size()), float(b1), float(b2), float(options_.eps),
                       grad_scale, /*skip_step=*/nullptr, lowp_dt, cuda::stream(device));
  }
#endif
}

}  // namespace mt::optim
