#pragma once
// The grid-stride elementwise map behind cast, add, mul, scale, axpy and GELU: 256 threads a
// block, each thread moving 16-byte packs when every pointer is 16-byte aligned, else one element;
// the last n % pack elements are a scalar tail. Such maps are pure bandwidth: the floor is (bytes
// read + bytes written) / copy bandwidth. launch_map's map_kernel loads kMapUnroll packs of each
// input before it computes any, so a thread keeps that many loads in flight even when the op's
// arithmetic (a tanh, an erf) is long, and runs a few waves of blocks (what fits on the GPU at
// once, times kMapWaves), so every block has the same number of rounds. map_blocks sizes the
// simpler grid-stride loops of other kernels: one pack per thread per step, at most 2048 blocks.
#include <cuda_runtime.h>

#include <cstdint>

#include <algorithm>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
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

constexpr int kMapUnroll = 2;
constexpr int kMapWaves = 4;

// out[i] = op(a[i], b[i]), or op(a[i], a[i]) when kUnary. Thread t takes packs t, t + threads,
// ...: kMapUnroll of them loaded together per round (all loads before any store, so out may be
// b: axpy), then the rest one at a time, then the tail.
template <class T, int V, bool kUnary, class Op>
__global__ void __launch_bounds__(kMapThreads) map_kernel(const T* a, const T* b, T* out, int64_t n,
                                                          Op op) {
  using P = Pack<T, V>;
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / V;
  const P* ap = reinterpret_cast<const P*>(a);
  const P* bp = reinterpret_cast<const P*>(b);
  P* op_out = reinterpret_cast<P*>(out);
  auto apply = [&](const P& x, const P& y) {
    P z;
#pragma unroll
    for (int j = 0; j < V; ++j) z.v[j] = op(x.v[j], y.v[j]);
    return z;
  };
  int64_t i = tid;
  for (; i + (kMapUnroll - 1) * threads < nv; i += kMapUnroll * threads) {
    P x[kMapUnroll], y[kMapUnroll];
#pragma unroll
    for (int u = 0; u < kMapUnroll; ++u) {
      x[u] = ap[i + u * threads];
      if constexpr (kUnary) y[u] = x[u];
      else y[u] = bp[i + u * threads];
    }
#pragma unroll
    for (int u = 0; u < kMapUnroll; ++u) op_out[i + u * threads] = apply(x[u], y[u]);
  }
  for (; i < nv; i += threads) op_out[i] = apply(ap[i], kUnary ? ap[i] : bp[i]);
  for (int64_t j = nv * V + tid; j < n; j += threads) out[j] = op(a[j], kUnary ? a[j] : b[j]);
}

// Blocks for map_kernel over `packs`: kMapWaves waves of what fits on the GPU at once (asked once
// per kernel), fewer when there are fewer packs than kMapUnroll a thread.
template <class T, int V, bool kUnary, class Op>
unsigned map_wave_blocks(int64_t packs) {
  static const int per_sm = [] {
    int b = 0;
    MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, map_kernel<T, V, kUnary, Op>,
                                                                kMapThreads, 0));
    return std::max(b, 1);
  }();
  const int64_t cap = int64_t(per_sm) * sm_count(current_device()) * kMapWaves;
  const int64_t per_block = int64_t(kMapThreads) * kMapUnroll;
  return unsigned(std::clamp<int64_t>((packs + per_block - 1) / per_block, 1, cap));
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
    const int64_t packs = vec ? n / V : n;
    if (b == nullptr) {
      if (vec) map_kernel<T, V, true><<<map_wave_blocks<T, V, true, Op>(packs), kMapThreads, 0, s>>>(pa, pb, po, n, op);
      else map_kernel<T, 1, true><<<map_wave_blocks<T, 1, true, Op>(packs), kMapThreads, 0, s>>>(pa, pb, po, n, op);
    } else {
      if (vec) map_kernel<T, V, false><<<map_wave_blocks<T, V, false, Op>(packs), kMapThreads, 0, s>>>(pa, pb, po, n, op);
      else map_kernel<T, 1, false><<<map_wave_blocks<T, 1, false, Op>(packs), kMapThreads, 0, s>>>(pa, pb, po, n, op);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::cuda
