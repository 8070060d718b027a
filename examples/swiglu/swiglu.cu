// swiglu's CUDA kernels: the forward map and the backward map (the math is in swiglu.h).
//
//   forward   y  = a · s · b                         reads a, b; writes y        3 tensors moved
//   backward  da = dy · b · (s + a · s · (1 − s))    reads a, b, dy; writes      5 tensors moved
//             db = dy · a · s                        da and db (either may be skipped)
//
// Both are bandwidth-bound maps, so both use one grid: 256-thread blocks, grid-stride over 16-byte
// packs (each thread loads 16 bytes of every input per step, the widest load a thread issues),
// at most 2048 blocks (enough to keep every SM's memory pipeline full, few enough that the loop,
// not the launch, covers a large tensor), and a scalar tail for the last n % V elements. When
// any pointer is not 16-byte aligned (a view at an odd offset), the same kernel runs with V = 1.
// Math is fp32 whatever the storage dtype; each result is rounded once, on the store.
#include <cstdint>

#include "core/cuda/check.h"
#include "core/cuda/glue.h"
#include "core/cuda/map.cuh"
#include "core/cuda/vec.cuh"
#include "swiglu.h"

namespace swiglu_example {
namespace {

using mt::cuda::Pack;
using mt::cuda::from_float;
using mt::cuda::to_float;

__device__ __forceinline__ float sigmoid(float a) { return 1.0f / (1.0f + __expf(-a)); }

template <class T, int V>
__global__ void forward_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                               int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = tid; i < n / V; i += stride) {
    const Pack<T, V> av = reinterpret_cast<const Pack<T, V>*>(a)[i];
    const Pack<T, V> bv = reinterpret_cast<const Pack<T, V>*>(b)[i];
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float x = to_float(av.v[k]);
      out.v[k] = from_float<T>(x * sigmoid(x) * to_float(bv.v[k]));
    }
    reinterpret_cast<Pack<T, V>*>(y)[i] = out;
  }
  for (int64_t i = n / V * V + tid; i < n; i += stride) {  // the tail
    const float x = to_float(a[i]);
    y[i] = from_float<T>(x * sigmoid(x) * to_float(b[i]));
  }
}

// da and db may be null (not needed): the branch is uniform across the grid.
template <class T, int V>
__global__ void backward_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                const T* __restrict__ dy, T* __restrict__ da, T* __restrict__ db,
                                int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  auto grads = [](float x, float bb, float g, float& ga, float& gb) {
    const float s = sigmoid(x);  // recomputed, not saved
    ga = g * bb * (s + x * s * (1.0f - s));
    gb = g * x * s;
  };
  for (int64_t i = tid; i < n / V; i += stride) {
    const Pack<T, V> av = reinterpret_cast<const Pack<T, V>*>(a)[i];
    const Pack<T, V> bv = reinterpret_cast<const Pack<T, V>*>(b)[i];
    const Pack<T, V> gv = reinterpret_cast<const Pack<T, V>*>(dy)[i];
    Pack<T, V> oa, ob;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float ga, gb;
      grads(to_float(av.v[k]), to_float(bv.v[k]), to_float(gv.v[k]), ga, gb);
      oa.v[k] = from_float<T>(ga);
      ob.v[k] = from_float<T>(gb);
    }
    if (da) reinterpret_cast<Pack<T, V>*>(da)[i] = oa;
    if (db) reinterpret_cast<Pack<T, V>*>(db)[i] = ob;
  }
  for (int64_t i = n / V * V + tid; i < n; i += stride) {
    float ga, gb;
    grads(to_float(a[i]), to_float(b[i]), to_float(dy[i]), ga, gb);
    if (da) da[i] = from_float<T>(ga);
    if (db) db[i] = from_float<T>(gb);
  }
}

bool all_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (!mt::cuda::aligned(p, 16)) return false;  // nullptr counts as aligned
  return true;
}

void forward_cuda(const Tensor& a, const Tensor& b, const Tensor& y) {
  const int64_t n = a.numel();
  if (n == 0) return;
  const cudaStream_t s = mt::cuda::stream_of(a);
  mt::cuda::dispatch_float<false>(a.dtype(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const T* pa = mt::cuda::ptr<const T>(a);
    const T* pb = mt::cuda::ptr<const T>(b);
    T* py = mt::cuda::ptr<T>(y);
    if (all_aligned({pa, pb, py}))
      forward_kernel<T, V><<<mt::cuda::map_blocks(n / V), mt::cuda::kMapThreads, 0, s>>>(pa, pb, py, n);
    else
      forward_kernel<T, 1><<<mt::cuda::map_blocks(n), mt::cuda::kMapThreads, 0, s>>>(pa, pb, py, n);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void backward_cuda(const Tensor& a, const Tensor& b, const Tensor& dy, const Tensor& da,
                   const Tensor& db) {
  const int64_t n = a.numel();
  if (n == 0 || (!da.defined() && !db.defined())) return;
  const cudaStream_t s = mt::cuda::stream_of(a);
  mt::cuda::dispatch_float<false>(a.dtype(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const T* pa = mt::cuda::ptr<const T>(a);
    const T* pb = mt::cuda::ptr<const T>(b);
    const T* pg = mt::cuda::ptr<const T>(dy);
    T* pda = mt::cuda::ptr<T>(da);
    T* pdb = mt::cuda::ptr<T>(db);
    if (all_aligned({pa, pb, pg, pda, pdb}))
      backward_kernel<T, V><<<mt::cuda::map_blocks(n / V), mt::cuda::kMapThreads, 0, s>>>(
          pa, pb, pg, pda, pdb, n);
    else
      backward_kernel<T, 1><<<mt::cuda::map_blocks(n), mt::cuda::kMapThreads, 0, s>>>(
          pa, pb, pg, pda, pdb, n);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

MT_REGISTER_KERNEL(swiglu, Forward, CUDA, forward_cuda);
MT_REGISTER_KERNEL(swiglu, Backward, CUDA, backward_cuda);

}  // namespace swiglu_example
