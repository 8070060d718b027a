#pragma once
// CUDA launchers of the dropout op on raw, contiguous device buffers (the math, the RNG, the
// device-side offset and the grids: dropout.h). The forward and the backward are this one map,
// on x and on dy.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// out[i] = in[i] · scale where the 16-bit half i of (seed, offset + *base) >= threshold, else 0
// ('=', dt). base: a device word read when the kernel runs (nullable: 0). scale is rounded to
// fp32 (f64 for f64), as on the CPU.
void dropout_apply(const void* in, void* out, int64_t n, uint32_t threshold, double scale,
                   uint64_t seed, uint64_t offset, const uint64_t* base, DType dt,
                   cudaStream_t s);

// *base = value, or *base += stride when `s` is being captured into a CUDA graph (dropout.h).
void dropout_advance_base(uint64_t* base, uint64_t value, uint64_t stride, cudaStream_t s);

}  // namespace mt::cuda
