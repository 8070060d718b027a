#pragma once
// The small CUDA kernels the trainer needs between the big ops: fills, casts, the elementwise
// arithmetic of gradient accumulation and loss scaling, a deterministic sum, a non-finite check
// and a row argmax for accuracy.
//
// All pointers are device pointers to contiguous buffers of n elements; every launcher is
// asynchronous on `s` and never waits for the device. Floating dtypes are f32, bf16, f16 and f64;
// arithmetic on bf16/f16 is done in fp32 and rounded once (round to nearest even) on store.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// p[i] = value for every dtype (integers included). The value is converted on the host once
// (double -> float -> bf16/f16 for the 16-bit types) and its bit pattern is written.
void fill(void* p, double value, int64_t n, DType dt, cudaStream_t s);

// dst[i] = src[i] converted: any pair among f32/bf16/f16/f64 (round to nearest even, one
// rounding: f64 -> bf16/f16 converts directly), and i32/i64 -> any of those. Same dtypes copy.
void cast(const void* src, DType src_dt, void* dst, DType dst_dt, int64_t n, cudaStream_t s);

// out = a + b, out = a * b, out = alpha * x, y += alpha * x. `out` may alias an input.
void add(const void* a, const void* b, void* out, int64_t n, DType dt, cudaStream_t s);
void mul(const void* a, const void* b, void* out, int64_t n, DType dt, cudaStream_t s);
void scale(const void* x, float alpha, void* out, int64_t n, DType dt, cudaStream_t s);
void axpy(float alpha, const void* x, void* y, int64_t n, DType dt, cudaStream_t s);

// *out = sum(x) (accumulate = false) or *out += sum(x) (accumulate = true), summed in fp32 in a
// fixed order (per-block partials, then one block adds them up), so the bits never change
// between runs. Scratch comes from the framework's stream-ordered pool: `s` must be
// mt::cuda::stream(current device).
void sum_to_f32(const void* x, int64_t n, DType dt, float* out, bool accumulate, cudaStream_t s);

// Sets *flag = 1 if any element is inf or NaN; never clears it (the caller zeroes it once and
// may check many tensors into the same flag).
void count_nonfinite(const void* x, int64_t n, DType dt, int* flag, cudaStream_t s);

// out[r] = index of the largest x[r, :] (first one on ties; a NaN counts as the largest, like
// torch.argmax). One block per row.
void argmax_rows(const void* x, int64_t rows, int64_t C, DType dt, int64_t* out, cudaStream_t s);

}  // namespace mt::cuda
