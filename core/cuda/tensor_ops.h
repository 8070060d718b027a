#pragma once
// The two vector kernels the core itself runs on the GPU: the dtype cast behind Tensor::to(dtype)
// and the y += alpha * x behind gradient accumulation (core/accumulate.h). The ops' own
// elementwise kernels are in ops/elementwise/elementwise_cuda.h.
//
// Pointers are device pointers to contiguous buffers of n elements; both launchers are
// asynchronous on `s`. Arithmetic on bf16/f16 is done in fp32 and rounded once on store.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// dst[i] = src[i] converted: any pair among f32/bf16/f16/f64 (round to nearest even, one
// rounding: f64 -> bf16/f16 converts directly), and i32/i64 -> any of those. Same dtypes copy.
void cast(const void* src, DType src_dt, void* dst, DType dst_dt, int64_t n, cudaStream_t s);

// y += alpha * x, in the dtype of y through fp32 (f64 stays f64). x and y: f32, bf16, f16, f64.
void axpy(float alpha, const void* x, void* y, int64_t n, DType dt, cudaStream_t s);

}  // namespace mt::cuda
