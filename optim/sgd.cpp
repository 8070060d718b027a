#include "optim/sgd.h"

#include "core/autograd.h"
#include "core/registry.h"
#include "nn/module.h"
#include "optim/kernels.h"

namespace mt::optim {
namespace {

// The CPU reference, in the parameter's dtype T (float, or double for f64 parameters).
template <class T>
void sgd_cpu(const Tensor& param, const Tensor& grad, const Tensor& buffer, double lr,
             double weight_decay, double momentum, bool nesterov) {
  T* p = param.data<T>();
  const T* g = grad.data<T>();
  T* b = buffer.defined() ? buffer.data<T>() : nullptr;
  for (int64_t i = 0; i < param.numel(); ++i) {
    T d = g[i] + T(weight_decay) * p[i];
    if (b) {
      b[i] = T(momentum) * b[i] + d;
      d = nesterov ? d + T(momentum) * b[i] : b[i];
    }
    p[i] -= T(lr) * d;
  }
}

// The registered CPU kernel: the reference in the parameter's dtype.
void sgd_step_cpu(const Tensor& p, const Tensor& g, const Tensor& buffer, double lr,
                  double weight_decay, double momentum, bool nesterov) {
  auto update = p.dtype() == DType::f64 ? sgd_cpu<double> : sgd_cpu<float>;
  update(p, g, buffer, lr, weight_decay, momentum, nesterov);
}

}  // namespace

MT_DEFINE_OP(sgd_step, "SGD: d = g + wd p (through the momentum buffer); p -= lr d", SGDStepFn, void);
MT_REGISTER_KERNEL(sgd_step, Forward, CPU, sgd_step_cpu);

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options)
    : Optimizer(std::move(groups), options.lr, options.weight_decay,
                options.momentum != 0 ? std::vector<std::string>{"momentum_buffer"}
                                      : std::vector<std::string>{}),
      options_(options) {
  MT_CHECK(options.momentum >= 0, "SGD: momentum must be >= 0, got ", options.momentum);
  MT_CHECK(!options.nesterov || options.momentum > 0, "SGD: nesterov needs momentum > 0");
}

void SGD::step() {
  NoGradGuard no_grad;
  size_t index = 0;
  for (const ParamGroup& group : groups_) {
    for (const Tensor& p : group.params) {
      const size_t i = index++;
      const Tensor g = p.grad();
      if (!g.defined()) continue;  // not part of this step's loss
      MT_CHECK(p.is_contiguous() && g.is_contiguous() && g.dtype() == p.dtype(), "SGD: parameter ", i,
               " and its .grad must be contiguous and of one dtype, got ", dtype_name(p.dtype()),
               " and ", dtype_name(g.dtype()));
      const Tensor buf = options_.momentum != 0 ? buffer(i, "momentum_buffer", p, p.dtype()) : Tensor();
      kernel<SGDStepFn>("sgd_step", Phase::Forward, p.device())(
          p, g, buf, *group.lr, *group.weight_decay, options_.momentum, options_.nesterov);
      p.bump_version();
      nn::refresh_compute_copies({p});
      ++state(i).step;
    }
  }
  ++steps_;
}

}  // namespace mt::optim
