// Scaled SiLU on the GPU: y = w * x * sigmoid(x), with w one learned fp32 scalar.
//
// Math, with s = sigmoid(x) = 1 / (1 + e^-x) and s' = s (1 - s):
//   forward    y  = w x s
//   backward   dx = dy w (s + x s (1 - s))          d/dx (x s) = s + x s'
//              dw += sum_i dy_i x_i s_i             the scalar's gradient, summed over all elements
//
// Saved vs recomputed: the backward gets x (saved by the op) and recomputes s. One exp per
// element costs nothing in a kernel that waits on memory, while saving s would cost a write in
// the forward and a read in the backward (2 bytes per element each in bf16). w stays on the
// device and is read there: no launch synchronizes with the host, so both can go in a CUDA graph.
//
// Grids (blocks of kThreads threads; thread t handles 16-byte packs t, t + stride, ..., so a warp
// covers 512 contiguous bytes). The n % V leftover elements, and everything when a pointer is
// not 16-byte aligned, go through the same kernels with V = 1.
//   forward    one pack per thread, as many blocks as that takes (the loop only strides when n
//              passes kMaxGrid blocks). Short-lived blocks let the hardware block scheduler keep
//              HBM busy; a persistent one-wave grid measured about 10% of copy bandwidth slower.
//   backward   persistent: kBackwardBlocksPerSm blocks per SM, each looping over its packs,
//              because every block costs one partial of dw and the reduction tail must stay
//              negligible. At 4 blocks of 256 a thread may use 64 registers, enough for the
//              compiler to keep loads of the next iterations in flight.
//
// Accumulation:
//   forward     y  =  (in dt, rounded from fp32)
//   backward    dx =  (in dt; skipped when dx is null), in the same pass that reads x and dy for dw.
//               Each thread sums dy x s in an fp32 register; the block reduces those in a fixed
//               tree. deterministic: the block writes partials[block] = (fp32), then one block of
//               kReduceThreads sums the partials in a fixed order and does *dw += total (fp32).
//               Same inputs, same grid (it depends only on the SM count), same bits. Otherwise:
//               atomicAdd(dw, block total) (fp32); the blocks' arrival order changes the rounding.
//
// Precision: inputs convert to fp32, all math is fp32, outputs round to nearest even. The
// sigmoid uses the special-function unit (__expf, __fdividef): a few ulp in fp32 (the relative
// error grows like |x| * 6e-8 from exp's range reduction; at x = -87 and below, where 1 + e^-x
// passes 2^126, s flushes to 0 instead of a denormal). Invisible after rounding to bf16 or f16
// and well inside the f32 parity tolerance; it keeps the kernel memory-bound.
#include "ops/scaled_silu/scaled_silu_cuda.h"

#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda/check.h"
#include "core/cuda/glue.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/vec.cuh"
#include "core/registry.h"
#include "core/switches.h"
#include "ops/scaled_silu/scaled_silu.h"
#include "ops/scaled_silu/silu.cuh"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGrid = 1 << 20;           // 2^28 threads: thread indices fit in 32 bits
constexpr int kBackwardBlocksPerSm = 4;     // 4 x 256 threads: half an SM, 64 registers each
constexpr int kReduceThreads = 1024;

// At most kMaxGrid blocks, so a thread's index fits in 32 bits.
__device__ __forceinline__ int thread_index() { return blockIdx.x * blockDim.x + threadIdx.x; }

template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ x, const float* __restrict__ w, T* __restrict__ y,
                   int64_t n) {
  using P = Pack<T, V>;
  const P* xp = reinterpret_cast<const P*>(x);
  P* yp = reinterpret_cast<P*>(y);
  const int64_t packs = n / V;
  const int stride = gridDim.x * blockDim.x;
  const float wv = *w;

  for (int64_t i = thread_index(); i < packs; i += stride) {
    const P in = xp[i];
    P out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float xv = to_float(in.v[k]);
      out.v[k] = from_float<T>(wv * xv * sigmoid(xv));
    }
    yp[i] = out;
  }
  for (int64_t j = packs * V + thread_index(); j < n; j += stride) {
    const float xv = to_float(x[j]);
    y[j] = from_float<T>(wv * xv * sigmoid(xv));
  }
}

// One pass over x and dy: writes dx (unless null) and reduces dy x s to one number per block,
// stored in partials[blockIdx.x] or atomically added to *dw_atomic (exactly one of the two is
// non-null when the caller wants dw; both null when it does not).
template <class T, int V>
__global__ void __launch_bounds__(kThreads, kBackwardBlocksPerSm)
    backward_kernel(const T* __restrict__ x, const float* __restrict__ w,
                    const T* __restrict__ dy, T* __restrict__ dx, float* __restrict__ partials,
                    float* dw_atomic, int64_t n) {
  using P = Pack<T, V>;
  const P* xp = reinterpret_cast<const P*>(x);
  const P* gp = reinterpret_cast<const P*>(dy);
  P* dxp = reinterpret_cast<P*>(dx);
  const int64_t packs = n / V;
  const int stride = gridDim.x * blockDim.x;
  const float wv = *w;
  float acc = 0.0f;  // this thread's share of sum(dy x s)

  for (int64_t i = thread_index(); i < packs; i += stride) {
    const P xin = xp[i], gin = gp[i];
    P out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float xv = to_float(xin.v[k]), g = to_float(gin.v[k]);
      const float s = sigmoid(xv);
      acc += g * xv * s;
      out.v[k] = from_float<T>(g * wv * silu_grad(xv, s));
    }
    if (dx != nullptr) dxp[i] = out;
  }
  for (int64_t j = packs * V + thread_index(); j < n; j += stride) {
    const float xv = to_float(x[j]), g = to_float(dy[j]);
    const float s = sigmoid(xv);
    acc += g * xv * s;
    if (dx != nullptr) dx[j] = from_float<T>(g * wv * silu_grad(xv, s));
  }

  if (partials == nullptr && dw_atomic == nullptr) return;  // the same for the whole grid
  const float total = block_sum(acc);
  if (threadIdx.x == 0) {
    if (partials != nullptr)
      partials[blockIdx.x] = total;
    else
      atomicAdd(dw_atomic, total);
  }
}

// Second pass of the deterministic dw: one block, each thread a fixed strided subset of the
// partials, then the fixed block tree. Adds into *dw: it may already hold earlier gradients.
__global__ void __launch_bounds__(kReduceThreads)
    sum_partials_kernel(const float* __restrict__ partials, int count, float* __restrict__ dw) {
  float v = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) v += partials[i];
  const float total = block_sum(v);
  if (threadIdx.x == 0) *dw += total;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Blocks for `packs` units of work, one per thread, at most `cap`.
int grid_size(int64_t packs, int64_t cap) {
  return int(std::min(cap, (std::max<int64_t>(packs, 1) + kThreads - 1) / kThreads));
}

int backward_cap() { return sm_count(current_device()) * kBackwardBlocksPerSm; }

template <class T>
void forward_as(const void* x, const float* w, void* y, int64_t n, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const T* xt = static_cast<const T*>(x);
  T* yt = static_cast<T*>(y);
  if (aligned16(x) && aligned16(y))
    forward_kernel<T, V><<<grid_size(n / V, kMaxGrid), kThreads, 0, s>>>(xt, w, yt, n);
  else
    forward_kernel<T, 1><<<grid_size(n, kMaxGrid), kThreads, 0, s>>>(xt, w, yt, n);
  MT_CUDA_CHECK_LAUNCH();
}

template <class T>
void backward_as(const void* x, const float* w, const void* dy, void* dx, float* dw, int64_t n,
                 bool deterministic, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const bool vectorized = aligned16(x) && aligned16(dy) && (dx == nullptr || aligned16(dx));
  const int grid = grid_size(vectorized ? n / V : n, backward_cap());
  float* partials = nullptr;
  if (dw != nullptr && deterministic)
    partials = static_cast<float*>(alloc_on(s, grid * sizeof(float), current_device()));
  float* dw_atomic = deterministic ? nullptr : dw;

  const T* xt = static_cast<const T*>(x);
  const T* gt = static_cast<const T*>(dy);
  T* dxt = static_cast<T*>(dx);
  if (vectorized)
    backward_kernel<T, V><<<grid, kThreads, 0, s>>>(xt, w, gt, dxt, partials, dw_atomic, n);
  else
    backward_kernel<T, 1><<<grid, kThreads, 0, s>>>(xt, w, gt, dxt, partials, dw_atomic, n);
  MT_CUDA_CHECK_LAUNCH();

  if (partials != nullptr) {
    sum_partials_kernel<<<1, kReduceThreads, 0, s>>>(partials, grid, dw);
    MT_CUDA_CHECK_LAUNCH();
    free_on(s, partials);  // stream-ordered: released after the reduce has run
  }
}

}  // namespace

void scaled_silu_forward(const void* x, const float* w, void* y, int64_t n, DType dt,
                         cudaStream_t s) {
  MT_CHECK(n >= 0, "scaled_silu_forward: negative element count ", n);
  if (n == 0) return;
  MT_CHECK(x != nullptr && w != nullptr && y != nullptr, "scaled_silu_forward: null pointer");
  switch (dt) {
    case DType::f32: return forward_as<float>(x, w, y, n, s);
    case DType::bf16: return forward_as<__nv_bfloat16>(x, w, y, n, s);
    case DType::f16: return forward_as<__half>(x, w, y, n, s);
    default:
      MT_THROW("scaled_silu_forward: dtype ", dtype_name(dt),
               " is not supported on CUDA (f32, bf16, f16)");
  }
}

// dx '=' in dt; *dw '+=' one fp32 total (fixed-order second pass, or atomicAdd): see the top.
void scaled_silu_backward(const void* x, const float* w, const void* dy, void* dx, float* dw,
                          int64_t n, DType dt, bool deterministic, cudaStream_t s) {
  MT_CHECK(n >= 0, "scaled_silu_backward: negative element count ", n);
  if (n == 0 || (dx == nullptr && dw == nullptr)) return;
  MT_CHECK(x != nullptr && w != nullptr && dy != nullptr, "scaled_silu_backward: null pointer");
  switch (dt) {
    case DType::f32: return backward_as<float>(x, w, dy, dx, dw, n, deterministic, s);
    case DType::bf16: return backward_as<__nv_bfloat16>(x, w, dy, dx, dw, n, deterministic, s);
    case DType::f16: return backward_as<__half>(x, w, dy, dx, dw, n, deterministic, s);
    default:
      MT_THROW("scaled_silu_backward: dtype ", dtype_name(dt),
               " is not supported on CUDA (f32, bf16, f16)");
  }
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for scaled_silu on CUDA ------------------------------
// (The Function and the math are in scaled_silu.cpp / scaled_silu.h.)
namespace mt {
namespace {

void scaled_silu_forward_cuda(const Tensor& x, const Tensor& w, const Tensor& y) {
  cuda::scaled_silu_forward(x.data_ptr(), cuda::ptr<const float>(w), y.data_ptr(), x.numel(),
                            x.dtype(), cuda::stream_of(x));
}

// dx '=' in x's dtype; dw is w's fp32 .grad (the sink) or fresh zeros: the kernel's second pass
// adds into it ('+=').
void scaled_silu_backward_cuda(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                               const Tensor& dw) {
  cuda::scaled_silu_backward(x.data_ptr(), cuda::ptr<const float>(w), dy.data_ptr(), cuda::ptr(dx),
                             cuda::ptr<float>(dw), x.numel(), x.dtype(), deterministic(),
                             cuda::stream_of(x));
}

}  // namespace

MT_REGISTER_KERNEL(scaled_silu, Forward, CUDA, scaled_silu_forward_cuda);
MT_REGISTER_KERNEL(scaled_silu, Backward, CUDA, scaled_silu_backward_cuda);

}  // namespace mt
