#pragma once
// Linear layer on CUDA: one GEMM forward, two GEMMs and a column sum backward; and, for gelu_mlp,
// the forward and dx GEMMs with GELU and its derivative in cuBLASLt's epilogue.
//
//   forward   y[M,N]  = x[M,K] · W[N,K]^T (+ bias[N])
//   backward  dx[M,K] = dy[M,N] · W[N,K]
//             dW[N,K] = dy^T · x            (the weight's fp32 .grad)
//             db[N]   = sum over rows of dy (the bias's fp32 .grad)
//
// Saved vs recomputed: backward needs x and W (saved by the caller, never copied here); y is not
// needed. Tensors are row-major and contiguous; transposes are cuBLAS op flags, never copies.
// GEMMs run in cuBLASLt with fp32 accumulation (CUBLAS_COMPUTE_32F), on the current device.
// Plans (descriptors, layouts, chosen algorithm) are built on the first call for a shape and
// reused, so a training step never re-plans. Nothing here waits for the device, except a plan
// built with gemm_autotune() on (core/switches.h), which times cuBLASLt's candidates once.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// y ('=', in dt) = x · W^T (+ bias). x, W, y in dt (f32, bf16, f16); bias fp32 [N] or nullptr,
// added in the GEMM's epilogue before y is rounded (for bf16/f16 y the bias is first rounded to
// dt in pool scratch, so then `s` must be mt::cuda::stream(current device)).
void linear_forward(const void* x, const void* W, const float* bias, void* y, int64_t M, int64_t N,
                    int64_t K, DType dt, cudaStream_t s);
// The same with the bias already in dt (the optimizer's rounded copy of an fp32 bias): the
// epilogue reads it as it is, with no cast and no scratch.
void linear_forward_dt_bias(const void* x, const void* W, const void* bias, void* y, int64_t M,
                            int64_t N, int64_t K, DType dt, cudaStream_t s);

// Each output is optional (nullptr skips its work):
//   dx ('=', in dt)          = dy · W
//   dW (fp32)                = dy^T · x + beta_dW * dW: beta_dW = 1 adds straight into an
//                              existing fp32 .grad (the grad sink), beta_dW = 0 stores a fresh one
//   db ('+=', fp32)          += column sums of dy, in a fixed order (the same bits every run)
// x, W, dy in dt. db's scratch comes from the framework's stream-ordered pool, so with db given
// `s` must be mt::cuda::stream(current device).
void linear_backward(const void* x, const void* W, const void* dy, void* dx, float* dW,
                     float beta_dW, float* db, int64_t M, int64_t N, int64_t K, DType dt,
                     cudaStream_t s);

// The GELU MLP's two fused GEMMs (ops/gelu_mlp), GELU in its tanh form in cuBLASLt's epilogue.
// Both need gelu_epilogue_fits(hidden, dt): hidden (N of the forward, K of the backward) a
// multiple of 8, dt f32, bf16 or f16.
bool gelu_epilogue_fits(int64_t hidden, DType dt);
// pre ('=', dt) = x · W^T (+ bias) and h ('=', dt) = gelu(pre), both from the fp32 accumulator in
// one GEMM (GELU_AUX_BIAS). bias in dt or nullptr.
void linear_gelu_forward(const void* x, const void* W, const void* bias, void* h, void* pre,
                         int64_t M, int64_t N, int64_t K, DType dt, cudaStream_t s);
// dpre ('=', dt) = (dy · W) ∘ gelu'(pre): linear's dx GEMM with the derivative applied to its
// fp32 accumulator (DGELU). dy [M, N], W [N, K], pre and dpre [M, K].
void linear_dgelu_backward(const void* W, const void* dy, const void* pre, void* dpre, int64_t M,
                           int64_t N, int64_t K, DType dt, cudaStream_t s);

// GEMM plans built so far in this process: how many, how many chose by measuring (gemm_autotune()
// on, more than one candidate), and how many of those kept a candidate other than the heuristic's
// first.
struct GemmPlanStats {
  int plans = 0, measured = 0, not_first = 0;
};
GemmPlanStats gemm_plan_stats();

}  // namespace mt::cuda
