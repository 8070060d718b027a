// gelu_mlp on CUDA: linear's cuBLASLt GEMMs, two of them with GELU in the epilogue. No kernel of
// its own; the math, the rounding and the saved tensors are in gelu_mlp.h.
//
// Forward   pre, h = GELU_AUX_BIAS GEMM (x, W1, b1)       one GEMM writes both [M, H]
//           y      = BIAS GEMM (h, W2, b2)
// Backward  dW2 += dyᵀ·h, db2 += Σ dy                     linear_backward without dx
//           dpre   = DGELU GEMM (dy, W2; pre)             g never leaves the accumulator
//           dx, dW1 += dpreᵀ·x, db1 += Σ dpre             linear_backward
// When H does not fit the epilogue (gelu_epilogue_fits), the GELU steps are gelu's own kernels on
// a plain GEMM's output: pre = GEMM, h = gelu(pre); g = GEMM, dpre = g · gelu'(pre).
#include "core/cuda/glue.h"
#include "core/registry.h"
#include "ops/gelu/gelu_cuda.h"
#include "ops/gelu_mlp/gelu_mlp.h"
#include "ops/linear/linear.h"
#include "ops/linear/linear_cuda.h"

namespace mt {
namespace {

// linear's forward GEMM for one layer: the bias in x's dtype (the optimizer's copy) or fp32.
void linear_layer(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& y) {
  kernel<LinearForwardFn>("linear", Phase::Forward, x.device())(x, W, b, y);
}

void gelu_mlp_forward_cuda(const Tensor& x, const Tensor& W1, const Tensor& b1, const Tensor& W2,
                           const Tensor& b2, const Tensor& pre, const Tensor& h, const Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), H = W1.size(0);
  const DType dt = x.dtype();
  const cudaStream_t s = cuda::stream_of(x);
  if (cuda::gelu_epilogue_fits(H, dt)) {
    // The epilogue adds a bias of the output's dtype: an fp32 one is rounded first.
    const Tensor b = b1.defined() && b1.dtype() != dt ? b1.to(dt) : b1;
    cuda::linear_gelu_forward(x.data_ptr(), W1.data_ptr(), b.defined() ? b.data_ptr() : nullptr,
                              h.data_ptr(), pre.data_ptr(), M, H, K, dt, s);
  } else {
    linear_layer(x, W1, b1, pre);
    cuda::gelu_forward(pre.data_ptr(), h.data_ptr(), pre.numel(), /*tanh_approx=*/true, dt, s);
  }
  linear_layer(h, W2, b2, y);
}

void gelu_mlp_backward_cuda(const Tensor& x, const Tensor& W1, const Tensor& W2, const Tensor& pre,
                            const Tensor& h, const Tensor& dy, const Tensor& dpre,
                            const Tensor& dx, const Tensor& dW1, const Tensor& db1,
                            const Tensor& dW2, const Tensor& db2) {
  const int64_t M = x.size(0), K = x.size(1), H = W1.size(0), N = W2.size(0);
  const DType dt = x.dtype();
  const cudaStream_t s = cuda::stream_of(x);
  if (dW2.defined() || db2.defined())
    cuda::linear_backward(h.data_ptr(), W2.data_ptr(), dy.data_ptr(), nullptr,
                          cuda::ptr<float>(dW2), 1.0f, cuda::ptr<float>(db2), M, N, H, dt, s);
  if (!dpre.defined()) return;
  if (cuda::gelu_epilogue_fits(H, dt)) {
    cuda::linear_dgelu_backward(W2.data_ptr(), dy.data_ptr(), pre.data_ptr(), dpre.data_ptr(), M,
                                N, H, dt, s);
  } else {
    Tensor g = empty(pre.shape(), dt, x.device());
    cuda::linear_backward(h.data_ptr(), W2.data_ptr(), dy.data_ptr(), g.data_ptr(), nullptr, 0.f,
                          nullptr, M, N, H, dt, s);
    cuda::gelu_backward(pre.data_ptr(), g.data_ptr(), dpre.data_ptr(), pre.numel(),
                        /*tanh_approx=*/true, dt, s);
  }
  cuda::linear_backward(x.data_ptr(), W1.data_ptr(), dpre.data_ptr(), cuda::ptr(dx),
                        cuda::ptr<float>(dW1), 1.0f, cuda::ptr<float>(db1), M, H, K, dt, s);
}

}  // namespace

MT_REGISTER_KERNEL(gelu_mlp, Forward, CUDA, gelu_mlp_forward_cuda);
MT_REGISTER_KERNEL(gelu_mlp, Backward, CUDA, gelu_mlp_backward_cuda);

}  // namespace mt
