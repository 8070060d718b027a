// SGD's registered CUDA kernel (optim/kernels.h; the CPU reference and the math: sgd.cpp).
#include "core/cuda/runtime.h"
#include "core/cuda/tensor_ops.h"
#include "core/registry.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "optim/kernels.h"

namespace mt::optim {
namespace {

// The same steps with the elementwise launchers, fp32, on the framework stream.
void sgd_step_cuda(const Tensor& p, const Tensor& g, const Tensor& buf, double lr,
                   double weight_decay, double momentum, bool nesterov) {
  MT_CHECK(p.dtype() == DType::f32, "SGD: CUDA parameters must be f32, got ", dtype_name(p.dtype()));
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

}  // namespace

MT_REGISTER_KERNEL(sgd_step, Forward, CUDA, sgd_step_cuda);

}  // namespace mt::optim
