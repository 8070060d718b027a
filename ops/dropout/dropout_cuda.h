#pragma once
// CUDA launcher of the dropout op on raw, contiguous device buffers (the math, the RNG and the
// grids: dropout.h). The forward and the backward are this one map, on x and on dy.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// out[i] = in[i] · scale where Philox word i of (seed, offset) >= threshold, else 0 ('=', dt).
// scale is rounded to fp32 (f64 for f64), as on the CPU.
void dropout_apply(const void* in, void* out, int64_t n, uint32_t threshold, double scale,
                   uint64_t seed, uint64_t offset, DType dt, cudaStream_t s);

}  // namespace mt::cuda
