#pragma once
// The small CUDA kernels the ops and the optimizers need between the big ones: the elementwise
// arithmetic of the add/mul/scale ops and of loss scaling, a deterministic sum and a non-finite
// check. The cast and axpy the core itself needs are in core/cuda/tensor_ops.h.
//
// All pointers are device pointers to contiguous buffers of n elements; every launcher is
// asynchronous on `s` and never waits for the device. Floating dtypes are f32, bf16, f16 and f64;
// arithmetic on bf16/f16 is done in fp32 and rounded once (round to nearest even) on store.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// out = a + b, out = a * b, out = alpha * x. `out` may alias an input.
void add(const void* a, const void* b, void* out, int64_t n, DType dt, cudaStream_t s);
void mul(const void* a, const void* b, void* out, int64_t n, DType dt, cudaStream_t s);
void scale(const void* x, float alpha, void* out, int64_t n, DType dt, cudaStream_t s);

// *out = sum(x) (accumulate = false) or *out += sum(x) (accumulate = true), summed in fp32 in a
// fixed order (per-block partials, then one block adds them up), so the bits never change
// between runs. Scratch comes from the framework's stream-ordered pool: `s` must be
// mt::cuda::stream(current device).
void sum_to_f32(const void* x, int64_t n, DType dt, float* out, bool accumulate, cudaStream_t s);

// Sets *flag = 1 if any element is inf or NaN; never clears it (the caller zeroes it once and
// may check many tensors into the same flag).
void count_nonfinite(const void* x, int64_t n, DType dt, int* flag, cudaStream_t s);

}  // namespace mt::cuda
