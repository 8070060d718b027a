#pragma once
// CUDA launchers of the RMSNorm op on raw, contiguous device buffers, x viewed as [rows, d]. The
// op's Function (rms_norm.cpp) checks shapes, dtypes and devices and calls these; the math, the
// grids and the accumulation rules are written out at the top of rms_norm.cu and
// rms_norm_kernels.cuh (the fused op's launchers: rms_norm_scaled_silu.cu). Rows up to
// kRmsNormMaxD elements are supported (a longer d is an mt::Error).
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// A backward thread keeps 16 elements of a long row in registers and a team is at most 1024
// threads (the fused op's backward: 32 elements, at most 512 threads).
inline constexpr int64_t kRmsNormMaxD = 16 * 1024;

// y[r,:] = x[r,:] * rstd[r] * weight[:],  rstd[r] = 1/sqrt(mean(x[r,:]^2) + eps).
// x, y in dt; weight fp32 [d] (the master weight; tiny); rstd fp32 [rows] written with '=' (saved for backward: 4 bytes per row vs re-reading the row).
void rms_norm_forward(const void* x, const float* weight, void* y, float* rstd, int64_t rows,
                      int64_t d, float eps, DType dt, cudaStream_t s);

// dx[r,:] = rstd * (g - xhat * mean(g*xhat)),  g = dy*weight, xhat = x*rstd   ('=' , nullable)
// dweight[:] += sum_r dy[r,:] * x[r,:] * rstd[r]   (fp32, nullable). deterministic: per-block fp32 partials [blocks, d]
// then a fixed-order column reduce that ADDS into dweight. deterministic=false: atomicAdd per column.
void rms_norm_backward(const void* x, const float* weight, const float* rstd, const void* dy,
                       void* dx, float* dweight, int64_t rows, int64_t d, DType dt,
                       bool deterministic, cudaStream_t s);

// The fused rms_norm_scaled_silu (rms_norm_scaled_silu.h): the same kernels, with
// y = silu_w · h · σ(h) for h = x * rstd * weight, silu_w one fp32 scalar on the device.
void rms_norm_scaled_silu_forward(const void* x, const float* weight, const float* silu_w,
                                  void* y, float* rstd, int64_t rows, int64_t d, float eps,
                                  DType dt, cudaStream_t s);

// dx '=' (nullable); dweight[:] += and dsilu_w[0] += in fp32, both or neither (null).
void rms_norm_scaled_silu_backward(const void* x, const float* weight, const float* silu_w,
                                   const float* rstd, const void* dy, void* dx, float* dweight,
                                   float* dsilu_w, int64_t rows, int64_t d, DType dt,
                                   bool deterministic, cudaStream_t s);

}  // namespace mt::cuda
