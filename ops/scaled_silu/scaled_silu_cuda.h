#pragma once
// CUDA launchers of the scaled-SiLU op on raw, contiguous device buffers. The op's Function
// (scaled_silu.cpp) checks shapes, dtypes and devices and calls these; the math, the grids and
// the accumulation rules are written out at the top of scaled_silu.cu.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// y = w * x * sigmoid(x), elementwise. x, y in dt (f32, bf16 or f16); w is a device fp32 scalar [1]
// (read on the device: no host sync, CUDA-graph friendly). Math in fp32, output rounded to dt.
void scaled_silu_forward(const void* x, const float* w, void* y, int64_t n, DType dt,
                         cudaStream_t s);

// dx = dy * w * (s + x*s*(1-s)), s = sigmoid(x) recomputed (not saved). dx written with '=' (nullable: skip).
// dw += sum(dy * x * s) in fp32 (nullable: skip). deterministic=true: one fp32 partial per block,
// then a fixed-order second pass (single block) that ADDS the total into *dw: same bits every run.
// deterministic=false: the lesson's single-cell atomicAdd into *dw, kept for comparison.
void scaled_silu_backward(const void* x, const float* w, const void* dy, void* dx, float* dw,
                          int64_t n, DType dt, bool deterministic, cudaStream_t s);

}  // namespace mt::cuda
