// RMSNorm on the GPU, x viewed as [rows, d], weight w an fp32 vector [d]: the launchers and the
// op's registered CUDA kernels. The kernels, their grids and accumulation order are in
// rms_norm_kernels.cuh, shared with the fused rms_norm_scaled_silu (rms_norm_scaled_silu.cu).
//
// Math:
//   forward    rstd_r = 1 / sqrt(mean_j x_rj^2 + eps)
//              y_rj   = x_rj rstd_r w_j
//   backward   xhat = x rstd,  g = dy w,  c_r = mean_j g_rj xhat_rj
//              dx_rj  = rstd_r (g_rj - xhat_rj c_r)
//              dw_j  += sum_r dy_rj xhat_rj
//   rstd depends on the whole row (d rstd / d x_j = -rstd^3 x_j / d), which is where the
//   row-wide correction c comes from.
//
// Saved vs recomputed: the forward saves rstd, one fp32 per row (4 bytes against the row's 2d
// bytes in bf16), so the backward needs no extra pass over x before it can start. xhat and g
// are recomputed from x and dy, which the backward reads anyway.
#include "core/registry.h"
#include "core/switches.h"
#include "ops/rms_norm/rms_norm.h"
#include "ops/rms_norm/rms_norm_kernels.cuh"

namespace mt::cuda {

void rms_norm_forward(const void* x, const float* weight, void* y, float* rstd, int64_t rows,
                      int64_t d, float eps, DType dt, cudaStream_t s) {
  check_shape("rms_norm_forward", rows, d);
  if (rows == 0) return;
  MT_CHECK(x != nullptr && weight != nullptr && y != nullptr && rstd != nullptr,
           "rms_norm_forward: null pointer");
  dispatch_float</*kWithF64=*/false>(dt, "rms_norm_forward", [&](auto t) {
    forward_as<decltype(t), Plain>(x, weight, nullptr, y, rstd, rows, int(d), eps, s);
  });
}

// dx '=' in dt; dweight[:] '+=' in fp32 (fixed-order column reduce, or atomicAdd): see the top.
void rms_norm_backward(const void* x, const float* weight, const float* rstd, const void* dy,
                       void* dx, float* dweight, int64_t rows, int64_t d, DType dt,
                       bool deterministic, cudaStream_t s) {
  check_shape("rms_norm_backward", rows, d);
  if (rows == 0 || (dx == nullptr && dweight == nullptr)) return;
  MT_CHECK(x != nullptr && weight != nullptr && rstd != nullptr && dy != nullptr,
           "rms_norm_backward: null pointer");
  dispatch_float</*kWithF64=*/false>(dt, "rms_norm_backward", [&](auto t) {
    backward_as<decltype(t), Plain>(x, weight, nullptr, rstd, dy, dx, dweight, nullptr, rows,
                                    int(d), deterministic, s);
  });
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for rms_norm on CUDA (the Function: rms_norm.cpp) --------
namespace mt {
namespace {

void rms_norm_forward_cuda(const Tensor& x, const Tensor& weight, double eps, const Tensor& y,
                           const Tensor& rstd) {
  const int64_t d = weight.numel();
  MT_CHECK(d <= cuda::kRmsNormMaxD, "rms_norm: CUDA rows are at most ", cuda::kRmsNormMaxD,
           " wide, got ", d);
  cuda::rms_norm_forward(x.data_ptr(), cuda::ptr<const float>(weight), y.data_ptr(),
                         cuda::ptr<float>(rstd), x.numel() / d, d, float(eps), x.dtype(),
                         cuda::stream_of(x));
}

// dx '=' in x's dtype; dweight is the weight's fp32 .grad (the sink) or fresh zeros: the column
// reduce adds into it ('+=').
void rms_norm_backward_cuda(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                            const Tensor& dy, const Tensor& dx, const Tensor& dweight) {
  const int64_t d = weight.numel();
  cuda::rms_norm_backward(x.data_ptr(), cuda::ptr<const float>(weight), cuda::ptr<const float>(rstd),
                          dy.data_ptr(), cuda::ptr(dx), cuda::ptr<float>(dweight), x.numel() / d, d,
                          x.dtype(), deterministic(), cuda::stream_of(x));
}

}  // namespace

MT_REGISTER_KERNEL(rms_norm, Forward, CUDA, rms_norm_forward_cuda);
MT_REGISTER_KERNEL(rms_norm, Backward, CUDA, rms_norm_backward_cuda);

}  // namespace mt
