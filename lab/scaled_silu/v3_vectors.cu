// Scaled-SiLU backward, v3: 16-byte loads and stores.
//
// What changed: a thread moves one 16-byte pack (8 bf16) of x, dy and dx instead of one element,
// so a warp's request is 512 contiguous bytes and far fewer instructions are issued per byte. This
// version requires what the pack needs, n a multiple of 8 and 16-byte aligned buffers (an
// mt::Error otherwise); production also runs a scalar tail and falls back to V = 1.
#include "core/cuda/check.h"
#include "core/error.h"
#include "lab/common.cuh"
#include "lab/lab.h"

namespace mt::lab::silu_v3 {
namespace {

using P = Pack<bf16, kPack>;

__global__ void backward_kernel(const P* x, const float* w, const P* dy, P* dx, float* dw,
                                int64_t packs) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float term = 0.0f;
  if (i < packs) {
    const P xin = x[i], gin = dy[i];
    const float wv = *w;
    P out;
#pragma unroll
    for (int k = 0; k < kPack; ++k) {
      const float xv = to_float(xin.v[k]), g = to_float(gin.v[k]);
      const float s = 1.0f / (1.0f + expf(-xv));
      out.v[k] = from_float<bf16>(g * wv * (s + xv * s * (1.0f - s)));
      term += g * xv * s;
    }
    dx[i] = out;
  }
  const float total = cuda::block_sum(term);
  if (threadIdx.x == 0) atomicAdd(dw, total);
}

}  // namespace

void backward(const void* x, const float* w, const void* dy, void* dx, float* dw, int64_t n,
              cudaStream_t s) {
  MT_CHECK(n % kPack == 0 && cuda::aligned(x, 16) && cuda::aligned(dy, 16) && cuda::aligned(dx, 16),
           "lab silu v3: needs n a multiple of ", kPack, " and 16-byte aligned buffers (n = ", n, ")");
  if (n == 0) return;
  const int64_t packs = n / kPack, blocks = (packs + kThreads - 1) / kThreads;
  backward_kernel<<<unsigned(blocks), kThreads, 0, s>>>(
      static_cast<const P*>(x), w, static_cast<const P*>(dy), static_cast<P*>(dx), dw, packs);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::lab::silu_v3
