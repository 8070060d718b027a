// Scaled-SiLU backward, v4: a deterministic two-pass reduction on a persistent grid.
//
// What changed: the atomics are gone. The grid is persistent (4 blocks per SM, each looping over
// its packs), so there are only a few hundred blocks; each stores its fp32 total in
// partials[block] ('='), and a second kernel of one block adds the partials in a fixed order and
// does dw += total. The grid depends only on the SM count, so the same inputs give the same bits
// on every run: the property the trainer's `deterministic: true` promises. The second pass reads
// ~2 KB: it costs a launch, not bandwidth.
#include "core/cuda/check.h"
#include "core/error.h"
#include "lab/common.cuh"
#include "lab/lab.h"

namespace mt::lab::silu_v4 {
namespace {

using P = Pack<bf16, kPack>;
constexpr int kBlocksPerSm = 4;

__global__ void backward_kernel(const P* x, const float* w, const P* dy, P* dx, float* partials,
                                int64_t packs) {
  const float wv = *w;
  float term = 0.0f;  // this thread's share of Σ dy·x·s, over all of its packs
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const P xin = x[i], gin = dy[i];
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
  if (threadIdx.x == 0) partials[blockIdx.x] = total;  // '=': one slot per block
}

// One block: thread t adds partials t, t + 1024, ..., then the fixed block tree; dw '+='.
__global__ void sum_partials_kernel(const float* partials, int count, float* dw) {
  float v = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) v += partials[i];
  const float total = cuda::block_sum(v);
  if (threadIdx.x == 0) *dw += total;
}

}  // namespace

void backward(const void* x, const float* w, const void* dy, void* dx, float* dw, int64_t n,
              cudaStream_t s) {
  MT_CHECK(n % kPack == 0 && cuda::aligned(x, 16) && cuda::aligned(dy, 16) && cuda::aligned(dx, 16),
           "lab silu v4: needs n a multiple of ", kPack, " and 16-byte aligned buffers (n = ", n, ")");
  if (n == 0) return;
  const int64_t packs = n / kPack;
  const int grid = persistent_grid(kBlocksPerSm, (packs + kThreads - 1) / kThreads);
  const int dev = cuda::current_device();
  auto* partials = static_cast<float*>(cuda::alloc_on(s, grid * sizeof(float), dev));
  backward_kernel<<<grid, kThreads, 0, s>>>(static_cast<const P*>(x), w, static_cast<const P*>(dy),
                                            static_cast<P*>(dx), partials, packs);
  MT_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, 1024, 0, s>>>(partials, grid, dw);
  MT_CUDA_CHECK_LAUNCH();
  cuda::free_on(s, partials);  // stream-ordered: after the second pass has read it
}

}  // namespace mt::lab::silu_v4
