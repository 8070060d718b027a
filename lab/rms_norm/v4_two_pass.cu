// RMSNorm backward, v4: deterministic dweight, per-block partials and a column reduce.
//
// What changed: the row loop is v3's, but at the end a block stores its sums in its own row of
// partials[grid, d] ('='), and a second kernel (a thread per column) adds the rows of partials in
// block order and does dweight[j] += total. No atomics: the same inputs give the same bits on
// every run. The partials are grid·d floats (528 x 4096 x 4 = 8.6 MB on an H200), read once.
#include "core/cuda/check.h"
#include "core/error.h"
#include "lab/common.cuh"
#include "lab/lab.h"

namespace mt::lab::rms_v4 {
namespace {

using P = Pack<bf16, kPack>;
constexpr int kBlocksPerSm = 4;

__device__ __forceinline__ void load_weight(const float* w, int col, float (&out)[kPack]) {
  const float4 a = *reinterpret_cast<const float4*>(w + col);
  const float4 b = *reinterpret_cast<const float4*>(w + col + 4);
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

__global__ void backward_kernel(const P* x, const float* weight, const float* rstd, const P* dy,
                                P* dx, float* partials, int64_t rows, int d) {
  extern __shared__ float acc[];  // [d]
  const int packs = d / kPack;
  for (int j = threadIdx.x; j < d; j += blockDim.x) acc[j] = 0.0f;
  __syncthreads();  // zeroed by element, used by pack: other threads' columns
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float rs = rstd[row];
    float dot = 0.0f;
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xin = x[row * packs + p], gin = dy[row * packs + p];
      float w[kPack];
      load_weight(weight, p * kPack, w);
#pragma unroll
      for (int k = 0; k < kPack; ++k) dot += to_float(gin.v[k]) * w[k] * (to_float(xin.v[k]) * rs);
    }
    const float c = block_sum_all(dot) / float(d);
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const P xin = x[row * packs + p], gin = dy[row * packs + p];
      float w[kPack];
      load_weight(weight, p * kPack, w);
      P out;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float xhat = to_float(xin.v[k]) * rs, g = to_float(gin.v[k]) * w[k];
        out.v[k] = from_float<bf16>(rs * (g - xhat * c));
        acc[p * kPack + k] += to_float(gin.v[k]) * xhat;
      }
      dx[row * packs + p] = out;
    }
  }
  __syncthreads();  // written by pack, read by element
  for (int j = threadIdx.x; j < d; j += blockDim.x) partials[int64_t(blockIdx.x) * d + j] = acc[j];
}

// Thread j adds column j of partials over the blocks, in block order; dweight '+='.
__global__ void column_reduce_kernel(const float* partials, int blocks, int d, float* dweight) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float total = 0.0f;
  for (int b = 0; b < blocks; ++b) total += partials[int64_t(b) * d + j];
  dweight[j] += total;
}

}  // namespace

void backward(const void* x, const float* weight, const float* rstd, const void* dy, void* dx,
              float* dweight, int64_t rows, int64_t d, cudaStream_t s) {
  MT_CHECK(d > 0 && d <= kRmsSharedMaxD && d % kPack == 0 && cuda::aligned(x, 16) &&
               cuda::aligned(dy, 16) && cuda::aligned(dx, 16) && cuda::aligned(weight, 16),
           "lab rms_norm v4: needs d a multiple of ", kPack, " up to ", kRmsSharedMaxD,
           " and 16-byte aligned buffers (d = ", d, ")");
  if (rows == 0) return;
  const int grid = persistent_grid(kBlocksPerSm, rows);
  const int dev = cuda::current_device();
  auto* partials = static_cast<float*>(cuda::alloc_on(s, size_t(grid) * d * sizeof(float), dev));
  backward_kernel<<<grid, kThreads, d * sizeof(float), s>>>(
      static_cast<const P*>(x), weight, rstd, static_cast<const P*>(dy), static_cast<P*>(dx),
      partials, rows, int(d));
  MT_CUDA_CHECK_LAUNCH();
  column_reduce_kernel<<<unsigned((d + kThreads - 1) / kThreads), kThreads, 0, s>>>(partials, grid,
                                                                                 int(d), dweight);
  MT_CUDA_CHECK_LAUNCH();
  cuda::free_on(s, partials);
}

}  // namespace mt::lab::rms_v4
