// RMSNorm backward, v1: the math, translated directly.
//
// One block per row, scalar bf16 loads. Pass 1 over the row: c = mean_j g·x̂ (a block-wide sum,
// since every dx of the row needs it; rstd depends on the whole row). Pass 2 over the row again:
// dx = rstd·(g − x̂·c), and dweight[j] += dy·x̂ as one atomicAdd per element. The row's second
// read mostly hits L1; the atomics do not: rows·d of them on d addresses, each column's updates
// serialized in L2, and the rounding of dweight depends on their order.
#include "core/cuda/check.h"
#include "lab/common.cuh"
#include "lab/lab.h"

namespace mt::lab::rms_v1 {
namespace {

__global__ void backward_kernel(const bf16* x, const float* weight, const float* rstd,
                                const bf16* dy, bf16* dx, float* dweight, int d) {
  const int64_t row = blockIdx.x;
  const bf16* xr = x + row * d;
  const bf16* gr = dy + row * d;
  const float rs = rstd[row];
  float dot = 0.0f;  // Σ_j g·x̂ over this thread's columns
  for (int j = threadIdx.x; j < d; j += blockDim.x)
    dot += to_float(gr[j]) * weight[j] * (to_float(xr[j]) * rs);
  const float c = block_sum_all(dot) / float(d);  // mean_j g·x̂
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float xhat = to_float(xr[j]) * rs, g = to_float(gr[j]) * weight[j];
    dx[row * d + j] = from_float<bf16>(rs * (g - xhat * c));
    atomicAdd(&dweight[j], to_float(gr[j]) * xhat);
  }
}

}  // namespace

void backward(const void* x, const float* weight, const float* rstd, const void* dy, void* dx,
              float* dweight, int64_t rows, int64_t d, cudaStream_t s) {
  if (rows == 0) return;
  backward_kernel<<<unsigned(rows), kThreads, 0, s>>>(
      static_cast<const bf16*>(x), weight, rstd, static_cast<const bf16*>(dy),
      static_cast<bf16*>(dx), dweight, int(d));
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::lab::rms_v1
