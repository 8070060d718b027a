#pragma once
// CUDA launchers of the GELU op on raw, contiguous device buffers (the math, the grids and the
// accumulation rules: gelu.h). Nothing here waits for the device.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// y = gelu(x) ('=', dt), n elements; tanh_approx picks the form. dt: f32, bf16, f16 (or f64).
void gelu_forward(const void* x, void* y, int64_t n, bool tanh_approx, DType dt, cudaStream_t s);

// dx = dy · gelu'(x) ('=', dt), the derivative recomputed from x.
void gelu_backward(const void* x, const void* dy, void* dx, int64_t n, bool tanh_approx, DType dt,
                   cudaStream_t s);

}  // namespace mt::cuda
