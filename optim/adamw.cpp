#include "optim/adamw.h"

#include <cmath>

#include "core/autograd.h"
#include "nn/module.h"
#ifdef MT_WITH_CUDA
#include <map>
#include <tuple>

#include "core/cuda/runtime.h"
#include "optim/adamw_cuda.h"
#endif

namespace mt::optim {
namespace {

// The CPU reference, in the parameter's dtype T (float, or double for f64 parameters). bc1 and
// bc2 are the bias corrections 1 − β^t, computed in double by the caller.
template <class T>
void adamw_cpu(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
               double lr, double weight_decay, double b1, double b2, double eps, double bc1, double bc2) {
  T* p = param.data<T>();
  const T* g = grad.data<T>();
  T* m = exp_avg.data<T>();
  T* v = exp_avg_sq.data<T>();
  for (int64_t i = 0; i < param.numel(); ++i) {
    p[i] *= T(1) - T(lr) * T(weight_decay);
    m[i] = T(b1) * m[i] + (T(1) - T(b1)) * g[i];
    v[i] = T(b2) * v[i] + (T(1) - T(b2)) * g[i] * g[i];
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

void AdamW::step() {
  NoGradGuard no_grad;
  const auto [b1, b2] = options_.betas;
#ifdef MT_WITH_CUDA
  // CUDA parameters are gathered per (device, lr, step, compute-copy dtype), the values one launch
  // shares; with set_lr and every parameter updated each step that is a single launch.
  std::map<std::tuple<int, double, int64_t, DType>, std::vector<cuda::AdamWTensor>> launches;
#endif
  size_t index = 0;
  for (const ParamGroup& group : groups_) {
    for (const Tensor& p : group.params) {
      const size_t i = index++;
      const Tensor g = p.grad();
      if (!g.defined()) continue;  // not part of this step's loss
      MT_CHECK(p.is_contiguous() && g.is_contiguous() && g.dtype() == p.dtype(), "AdamW: parameter ",
               i, " and its .grad must be contiguous and of one dtype, got ", dtype_name(p.dtype()),
               " and ", dtype_name(g.dtype()));
      const int64_t t = ++state(i).step;
      const Tensor m = buffer(i, "exp_avg", p, p.dtype());
      const Tensor v = buffer(i, "exp_avg_sq", p, p.dtype());
      const double lr = *group.lr, wd = *group.weight_decay;
      if (p.device().is_cpu()) {
        auto update = p.dtype() == DType::f64 ? adamw_cpu<double> : adamw_cpu<float>;
        update(p, g, m, v, lr, wd, b1, b2, options_.eps, 1 - std::pow(b1, t), 1 - std::pow(b2, t));
        nn::refresh_compute_copies({p});
      } else {
#ifdef MT_WITH_CUDA
        MT_CHECK(p.dtype() == DType::f32, "AdamW: CUDA parameters must be f32, got ", dtype_name(p.dtype()));
        const Tensor lowp = p.compute_copy();
        const DType lowp_dt = lowp.defined() ? lowp.dtype() : DType::f32;
        launches[{p.device().index, lr, t, lowp_dt}].push_back(
            {p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(),
             lowp.defined() ? lowp.data_ptr() : nullptr, p.numel(), float(wd)});
#endif
      }
      p.bump_version();
    }
  }
#ifdef MT_WITH_CUDA
  for (const auto& [key, tensors] : launches) {
    const auto& [device, lr, t, lowp_dt] = key;
    cuda::adamw_step(tensors.data(), int(tensors.size()), float(lr), float(b1), float(b2),
                     float(options_.eps), float(1 - std::pow(b1, t)), float(1 - std::pow(b2, t)),
                     /*grad_scale=*/nullptr, /*skip_step=*/nullptr, lowp_dt, cuda::stream(device));
  }
#endif
  ++steps_;
}

}  // namespace mt::optim
