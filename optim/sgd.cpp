#include "optim/sgd.h"

#include "core/autograd.h"
#include "nn/module.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/runtime.h"
#include "core/cuda/tensor_ops.h"
#include "ops/elementwise/elementwise_cuda.h"
#endif

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

#ifdef MT_WITH_CUDA
// The same steps with the elementwise launchers, fp32, on the framework stream.
void sgd_cuda(const Tensor& p, const Tensor& g, const Tensor& buf, double lr, double weight_decay,
              double momentum, bool nesterov) {
  cudaStream_t s = cuda::stream(p.device().index);
  const int64_t n = p.numel();
  const DType f32 = DType::f32;
  // d starts as the gradient itself; it is copied before anything writes to it (never to .grad).
  Tensor d = (weight_decay != 0 || nesterov) ? g.clone() : g;
  if (weight_decay != 0) cuda::axpy(float(weight_decay), p.data_ptr(), d.data_ptr(), n, f32, s);
  if (buf.defined()) {
    cuda::scale(buf.data_ptr(), float(momentum), buf.data_ptr(), n, f32, s);
    cuda::axpy(1.0f, d.data_ptr(), buf.data_ptr(), n, f32, s);
    if (nesterov) cuda::axpy(float(momentum), buf.data_ptr(), d.data_ptr(), n, f32, s);
    else d = buf;
  }
  cuda::axpy(float(-lr), d.data_ptr(), p.data_ptr(), n, f32, s);
}
#endif

}  // namespace

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
      if (p.device().is_cpu()) {
        auto update = p.dtype() == DType::f64 ? sgd_cpu<double> : sgd_cpu<float>;
        update(p, g, buf, *group.lr, *group.weight_decay, options_.momentum, options_.nesterov);
      } else {
#ifdef MT_WITH_CUDA
        MT_CHECK(p.dtype() == DType::f32, "SGD: CUDA parameters must be f32, got ", dtype_name(p.dtype()));
        sgd_cuda(p, g, buf, *group.lr, *group.weight_decay, options_.momentum, options_.nesterov);
#endif
      }
      p.bump_version();
      nn::refresh_compute_copies({p});
      ++state(i).step;
    }
  }
  ++steps_;
}

}  // namespace mt::optim
