// The loss scaler's registered CUDA kernel (optim/kernels.h; the CPU reference: loss_scaler.cpp).
#include "core/cuda/runtime.h"
#include "core/registry.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "optim/kernels.h"

namespace mt::optim {
namespace {

// g *= the fp32 reciprocal of the scale, in g's dtype; one flag counts the non-finite elements.
bool unscale_grads_cuda(const std::vector<Tensor>& grads, double scale) {
  const int device = grads[0].device().index;
  cuda::set_device(device);
  cudaStream_t s = cuda::stream(device);
  // One flag for all gradients: the kernels only ever set it, so it is zeroed once here.
  Tensor flag = zeros({}, DType::i32, grads[0].device());
  for (const Tensor& g : grads) {
    cuda::count_nonfinite(g.data_ptr(), g.numel(), g.dtype(), flag.data<int32_t>(), s);
    cuda::scale(g.data_ptr(), float(1.0 / scale), g.data_ptr(), g.numel(), g.dtype(), s);
  }
  return flag.item() != 0;  // the step's one host synchronization
}

}  // namespace

MT_REGISTER_KERNEL(unscale_grads, Forward, CUDA, unscale_grads_cuda);

}  // namespace mt::optim
