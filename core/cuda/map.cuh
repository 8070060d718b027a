#pragma once
// The grid-stride elementwise map behind cast, add, mul, scale and axpy: 256 threads a block, at
// most 2048 blocks, each thread moving one 16-byte pack per step when every pointer is 16-byte
// aligned, else one element; the last n % pack elements are a scalar tail. Such maps are pure
// bandwidth: the floor is (bytes read + bytes written) / copy bandwidth.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/check.h"
#include "core/cuda/vec.cuh"
#include "core/dtype.h"
#include "core/error.h"

namespace mt::cuda {

constexpr int kMapThreads = 256;
constexpr int64_t kMapMaxBlocks = 2048;

// Blocks for a grid-stride loop over `work` items.
inline unsigned map_blocks(int64_t work) {
  const int64_t b = (work + kMapThreads - 1) / kMapThreads;
  return unsigned(b < 1 ? 1 : (b > kMapMaxBlocks ? kMapMaxBlocks : b));
}

// out[i] = op(a[i], b[i]), or op(a[i], a[i]) when kUnary.
template <class T, int V, bool kUnary, class Op>
__global__ void map_kernel(const T* a, const T* b, T* out, int64_t n, Op op) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / V;
  for (int64_t i = tid; i < nv; i += stride) {
    const Pack<T, V> x = reinterpret_cast<const Pack<T, V>*>(a)[i];
    Pack<T, V> y;
    if constexpr (kUnary) y = x;
    else y = reinterpret_cast<const Pack<T, V>*>(b)[i];
    Pack<T, V> z;
#pragma unroll
    for (int j = 0; j < V; ++j) z.v[j] = op(x.v[j], y.v[j]);
    reinterpret_cast<Pack<T, V>*>(out)[i] = z;
  }
  for (int64_t i = nv * V + tid; i < n; i += stride) out[i] = op(a[i], kUnary ? a[i] : b[i]);
}

// Launches map_kernel on `s` for a floating dtype. b == nullptr selects the unary kernel (op sees
// a[i] twice and reads it once).
template <class Op>
void launch_map(const char* name, const void* a, const void* b, void* out, int64_t n, DType dt,
                Op op, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_float(dt, name, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    auto* pa = static_cast<const T*>(a);
    auto* pb = static_cast<const T*>(b);
    auto* po = static_cast<T*>(out);
    const bool vec = aligned(a, 16) && aligned(b, 16) && aligned(out, 16);  // nullptr is aligned
    const unsigned blocks = vec ? map_blocks(n / V) : map_blocks(n);
    if (b == nullptr) {
      if (vec) map_kernel<T, V, true><<<blocks, kMapThreads, 0, s>>>(pa, pb, po, n, op);
      else map_kernel<T, 1, true><<<blocks, kMapThreads, 0, s>>>(pa, pb, po, n, op);
    } else {
      if (vec) map_kernel<T, V, false><<<blocks, kMapThreads, 0, s>>>(pa, pb, po, n, op);
      else map_kernel<T, 1, false><<<blocks, kMapThreads, 0, s>>>(pa, pb, po, n, op);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::cuda
