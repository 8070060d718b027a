// GELU on the GPU: two maps over 16-byte packs (core/cuda/map.cuh). The math, what is saved and
// the grids are in gelu.h; the formulas are gelu_math.h's, shared with the CPU reference.
//
// Bytes: forward reads x and writes y, backward reads x and dy and writes dx, each once; the
// floor is those bytes at copy bandwidth. The tanh form's exp and reciprocal per element (the
// hardware's approximations: gelu_math.h) are within what these maps hide under their memory
// traffic; an accurate tanhf is not (the forward ran at 79% of copy with one).
#include "ops/gelu/gelu_cuda.h"

#include "core/cuda/glue.h"
#include "core/cuda/map.cuh"
#include "core/registry.h"
#include "ops/gelu/gelu.h"
#include "ops/gelu/gelu_math.h"

namespace mt::cuda {
namespace {

// Unary map: y = gelu(x), fp32 math (f64 for f64), rounded once.
template <bool kTanh>
struct ForwardOp {
  template <class T>
  __device__ T operator()(T x, T) const {
    const Acc<T> v = widen(x);
    return convert<T>(kTanh ? gelu_math::tanh_forward(v) : gelu_math::erf_forward(v));
  }
};

// Binary map over (x, dy): dx = dy · gelu'(x).
template <bool kTanh>
struct BackwardOp {
  template <class T>
  __device__ T operator()(T x, T dy) const {
    const Acc<T> v = widen(x);
    return convert<T>(widen(dy) * (kTanh ? gelu_math::tanh_grad(v) : gelu_math::erf_grad(v)));
  }
};

}  // namespace

void gelu_forward(const void* x, void* y, int64_t n, bool tanh_approx, DType dt, cudaStream_t s) {
  MT_CHECK(n >= 0, "gelu_forward: negative element count ", n);
  if (n == 0) return;
  MT_CHECK(x != nullptr && y != nullptr, "gelu_forward: null pointer");
  if (tanh_approx) launch_map("gelu_forward", x, nullptr, y, n, dt, ForwardOp<true>{}, s);
  else launch_map("gelu_forward", x, nullptr, y, n, dt, ForwardOp<false>{}, s);
}

void gelu_backward(const void* x, const void* dy, void* dx, int64_t n, bool tanh_approx, DType dt,
                   cudaStream_t s) {
  MT_CHECK(n >= 0, "gelu_backward: negative element count ", n);
  if (n == 0) return;
  MT_CHECK(x != nullptr && dy != nullptr && dx != nullptr, "gelu_backward: null pointer");
  if (tanh_approx) launch_map("gelu_backward", x, dy, dx, n, dt, BackwardOp<true>{}, s);
  else launch_map("gelu_backward", x, dy, dx, n, dt, BackwardOp<false>{}, s);
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for gelu on CUDA -------------------------------------
namespace mt {
namespace {

void gelu_forward_cuda(const Tensor& x, GeluApprox approx, const Tensor& y) {
  cuda::gelu_forward(x.data_ptr(), y.data_ptr(), x.numel(), approx == GeluApprox::Tanh, x.dtype(),
                     cuda::stream_of(x));
}

// dx '=' in x's dtype, a new tensor.
void gelu_backward_cuda(const Tensor& x, const Tensor& dy, GeluApprox approx, const Tensor& dx) {
  cuda::gelu_backward(x.data_ptr(), dy.data_ptr(), dx.data_ptr(), x.numel(),
                      approx == GeluApprox::Tanh, x.dtype(), cuda::stream_of(x));
}

}  // namespace

MT_REGISTER_KERNEL(gelu, Forward, CUDA, gelu_forward_cuda);
MT_REGISTER_KERNEL(gelu, Backward, CUDA, gelu_backward_cuda);

}  // namespace mt
