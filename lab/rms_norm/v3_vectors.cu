// RMSNorm backward, v3: 16-byte loads and stores.
//
// What changed: thread t owns packs t, t + 256, ... of 8 columns, and moves x, dy and dx 16 bytes
// at a time (weight 2 x 16 bytes); its dweight sums stay in shared memory, 8 floats a pack. Needs
// d a multiple of 8 and 16-byte aligned buffers (an mt::Error otherwise).
#include "core/cuda/check.h"
#include "core/error.h"
#include "lab/common.cuh"
#include "lab/lab.h"

namespace mt::lab::rms_v3 {
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
                                P* dx, float* dweight, int64_t rows, int d) {
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
  for (int j = threadIdx.x; j < d; j += blockDim.x) atomicAdd(&dweight[j], acc[j]);
}

}  // namespace

void backward(const void* x, const float* weight, const float* rstd, const void* dy, void* dx,
              float* dweight, int64_t rows, int64_t d, cudaStream_t s) {
  MT_CHECK(d > 0 && d <= kRmsSharedMaxD && d % kPack == 0 && cuda::aligned(x, 16) &&
               cuda::aligned(dy, 16) && cuda::aligned(dx, 16) && cuda::aligned(weight, 16),
           "lab rms_norm v3: needs d a multiple of ", kPack, " up to ", kRmsSharedMaxD,
           " and 16-byte aligned buffers (d = ", d, ")");
  if (rows == 0) return;
  const int grid = persistent_grid(kBlocksPerSm, rows);
  backward_kernel<<<grid, kThreads, d * sizeof(float), s>>>(
      static_cast<const P*>(x), weight, rstd, static_cast<const P*>(dy), static_cast<P*>(dx),
      dweight, rows, int(d));
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::lab::rms_v3
