#pragma once
// CUDA launchers of the LayerNorm op on raw, contiguous device buffers, x viewed as [rows, d]
// (the math, the grids and the accumulation rules: layer_norm.h and the top of layer_norm.cu).
// Nothing here waits for the device.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// y = (x − mean) · rstd · weight + bias ('=', dt); mean, rstd [rows] fp32 ('='). weight, bias
// fp32 [d]. res (nullable): the rows normalized are s = x + res, rounded to dt and written to
// sum_out ('=') first.
void layer_norm_forward(const void* x, const void* res, const float* weight, const float* bias,
                        void* sum_out, void* y, float* mean, float* rstd, int64_t rows, int64_t d,
                        float eps, DType dt, cudaStream_t s);

// dx = dres + rstd · (g − mean(g) − x̂ · mean(g · x̂)), g = dy · weight ('=', dt, rounded once;
// nullable: skip; dres nullable: none). dweight[:] += Σ_r dy · x̂ and dbias[:] += Σ_r dy (fp32;
// each nullable), by per-block partials and a fixed-order column reduce: the same bits on every
// run.
void layer_norm_backward(const void* x, const float* weight, const float* mean, const float* rstd,
                         const void* dy, const void* dres, void* dx, float* dweight, float* dbias,
                         int64_t rows, int64_t d, DType dt, cudaStream_t s);

}  // namespace mt::cuda
