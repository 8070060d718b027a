// rms_norm_scaled_silu on the GPU: rms_norm's kernels (rms_norm_kernels.cuh) with the ScaledSiLU
// epilogue, the launchers and the op's registered CUDA kernels. The math, what is saved and the
// rounding are in rms_norm_scaled_silu.h; the Function and the CPU reference in
// rms_norm_scaled_silu.cpp.
#include "core/registry.h"
#include "core/switches.h"
#include "ops/rms_norm/rms_norm_kernels.cuh"
#include "ops/rms_norm/rms_norm_scaled_silu.h"
#include "ops/scaled_silu/silu.cuh"

namespace mt::cuda {
namespace {

// y = w·h·σ(h), w one fp32 scalar on the device (a CUDA graph replays the current value).
struct ScaledSiLUTail {
  static constexpr bool kScalar = true;
  __device__ static float forward(float h, float w) { return w * h * sigmoid(h); }
  __device__ static float backward(float h, float dy, float w, float& dw) {
    const float s = sigmoid(h);  // recomputed from h, as scaled_silu recomputes it from x
    dw += dy * h * s;            // dw = Σ dy·h·σ(h)
    return dy * w * silu_grad(h, s);  // dh = dy·w·(s + h·s·(1 − s))
  }
};

}  // namespace

void rms_norm_scaled_silu_forward(const void* x, const float* weight, const float* silu_w,
                                  void* y, float* rstd, int64_t rows, int64_t d, float eps,
                                  DType dt, cudaStream_t s) {
  check_shape("rms_norm_scaled_silu_forward", rows, d);
  if (rows == 0) return;
  MT_CHECK(x != nullptr && weight != nullptr && silu_w != nullptr && y != nullptr &&
               rstd != nullptr,
           "rms_norm_scaled_silu_forward: null pointer");
  dispatch_float</*kWithF64=*/false>(dt, "rms_norm_scaled_silu_forward", [&](auto t) {
    forward_as<decltype(t), ScaledSiLUTail>(x, weight, silu_w, y, rstd, rows, int(d), eps, s);
  });
}

void rms_norm_scaled_silu_backward(const void* x, const float* weight, const float* silu_w,
                                   const float* rstd, const void* dy, void* dx, float* dweight,
                                   float* dsilu_w, int64_t rows, int64_t d, DType dt,
                                   bool deterministic, cudaStream_t s) {
  check_shape("rms_norm_scaled_silu_backward", rows, d);
  MT_CHECK((dweight == nullptr) == (dsilu_w == nullptr),
           "rms_norm_scaled_silu_backward: dweight and dsilu_w are wanted together or not at all");
  if (rows == 0 || (dx == nullptr && dweight == nullptr)) return;
  MT_CHECK(x != nullptr && weight != nullptr && silu_w != nullptr && rstd != nullptr &&
               dy != nullptr,
           "rms_norm_scaled_silu_backward: null pointer");
  dispatch_float</*kWithF64=*/false>(dt, "rms_norm_scaled_silu_backward", [&](auto t) {
    backward_as<decltype(t), ScaledSiLUTail>(x, weight, silu_w, rstd, dy, dx, dweight, dsilu_w,
                                             rows, int(d), deterministic, s);
  });
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for rms_norm_scaled_silu on CUDA ---------------------------
namespace mt {
namespace {

// The fused op: the same kernels with the ScaledSiLU epilogue. dweight and dw are the .grads
// (sinks) or fresh zeros, both defined or both not (the Function allocates the pair).
void rms_norm_scaled_silu_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& w,
                                       double eps, const Tensor& y, const Tensor& rstd) {
  const int64_t d = weight.numel();
  MT_CHECK(d <= cuda::kRmsNormMaxD, "rms_norm_scaled_silu: CUDA rows are at most ",
           cuda::kRmsNormMaxD, " wide, got ", d);
  cuda::rms_norm_scaled_silu_forward(x.data_ptr(), cuda::ptr<const float>(weight),
                                     cuda::ptr<const float>(w), y.data_ptr(),
                                     cuda::ptr<float>(rstd), x.numel() / d, d, float(eps),
                                     x.dtype(), cuda::stream_of(x));
}

void rms_norm_scaled_silu_backward_cuda(const Tensor& x, const Tensor& weight, const Tensor& w,
                                        const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                                        const Tensor& dweight, const Tensor& dw) {
  const int64_t d = weight.numel();
  cuda::rms_norm_scaled_silu_backward(
      x.data_ptr(), cuda::ptr<const float>(weight), cuda::ptr<const float>(w),
      cuda::ptr<const float>(rstd), dy.data_ptr(), cuda::ptr(dx), cuda::ptr<float>(dweight),
      cuda::ptr<float>(dw), x.numel() / d, d, x.dtype(), deterministic(), cuda::stream_of(x));
}

}  // namespace

MT_REGISTER_KERNEL(rms_norm_scaled_silu, Forward, CUDA, rms_norm_scaled_silu_forward_cuda);
MT_REGISTER_KERNEL(rms_norm_scaled_silu, Backward, CUDA, rms_norm_scaled_silu_backward_cuda);

}  // namespace mt
