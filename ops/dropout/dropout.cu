// Dropout on the GPU: one grid-stride map that regenerates the mask from (seed, offset, i).
// The math, why the mask is not saved, and the grids are in dropout.h; the generator is
// philox.h's, the CPU reference's, so both devices draw the same words.
//
// Bytes: the input read and the output written once (x -> y forward, dy -> dx backward); the
// floor is those at copy bandwidth. One Philox call (10 rounds of two 32-bit multiplies) gives
// the words of four elements.
#include "ops/dropout/dropout_cuda.h"

#include "core/cuda/check.h"
#include "core/cuda/glue.h"
#include "core/cuda/map.cuh"
#include "core/registry.h"
#include "ops/dropout/dropout.h"
#include "ops/dropout/philox.h"

namespace mt::cuda {
namespace {

// V elements per step: V a multiple of 4 (whole Philox groups; packs start at multiples of V),
// or V = 1 (the unaligned path, which draws each element's group and keeps one word).
template <class T, int V>
__global__ void dropout_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n,
                               uint32_t threshold, Acc<T> scale, uint64_t seed, uint64_t offset) {
  static_assert(V == 1 || V % 4 == 0);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / V;
  for (int64_t i = tid; i < packs; i += stride) {
    const Pack<T, V> x = reinterpret_cast<const Pack<T, V>*>(in)[i];
    Pack<T, V> y;
    if constexpr (V == 1) {
      const philox::U32x4 r = philox::draw(seed, offset, uint64_t(i) / 4);
      y.v[0] = r.v[i % 4] >= threshold ? convert<T>(widen(x.v[0]) * scale) : convert<T>(Acc<T>(0));
    } else {
#pragma unroll
      for (int g = 0; g < V / 4; ++g) {
        const philox::U32x4 r = philox::draw(seed, offset, uint64_t(i) * (V / 4) + g);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const T v = x.v[4 * g + k];
          y.v[4 * g + k] =
              r.v[k] >= threshold ? convert<T>(widen(v) * scale) : convert<T>(Acc<T>(0));
        }
      }
    }
    reinterpret_cast<Pack<T, V>*>(out)[i] = y;
  }
  // The n % V tail (V > 1): a multiple of 4 starts it, so element j's word is j % 4 of group j / 4.
  for (int64_t j = packs * V + tid; j < n; j += stride) {
    const philox::U32x4 r = philox::draw(seed, offset, uint64_t(j) / 4);
    out[j] = r.v[j % 4] >= threshold ? convert<T>(widen(in[j]) * scale) : convert<T>(Acc<T>(0));
  }
}

}  // namespace

void dropout_apply(const void* in, void* out, int64_t n, uint32_t threshold, double scale,
                   uint64_t seed, uint64_t offset, DType dt, cudaStream_t s) {
  MT_CHECK(n >= 0, "dropout: negative element count ", n);
  if (n == 0) return;
  MT_CHECK(in != nullptr && out != nullptr, "dropout: null pointer");
  dispatch_float(dt, "dropout", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T) >= 4 ? 16 / sizeof(T) : 1;  // f64's pack of 2: one at a time
    const T* pi = static_cast<const T*>(in);
    T* po = static_cast<T*>(out);
    const Acc<T> sc = Acc<T>(scale);
    if (V > 1 && aligned(in, 16) && aligned(out, 16))
      dropout_kernel<T, V><<<map_blocks(n / V), kMapThreads, 0, s>>>(pi, po, n, threshold, sc,
                                                                      seed, offset);
    else
      dropout_kernel<T, 1><<<map_blocks(n), kMapThreads, 0, s>>>(pi, po, n, threshold, sc, seed,
                                                                 offset);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::cuda

// ---- Tensor-level kernel registered for dropout on CUDA (both phases) ----------------------
namespace mt {
namespace {

// out '=' in in's dtype, a new tensor.
void dropout_cuda(const Tensor& in, uint32_t threshold, double scale, uint64_t seed,
                  uint64_t offset, const Tensor& out) {
  cuda::dropout_apply(in.data_ptr(), out.data_ptr(), in.numel(), threshold, scale, seed, offset,
                      in.dtype(), cuda::stream_of(in));
}

}  // namespace

MT_REGISTER_KERNEL(dropout, Forward, CUDA, dropout_cuda);
MT_REGISTER_KERNEL(dropout, Backward, CUDA, dropout_cuda);

}  // namespace mt
