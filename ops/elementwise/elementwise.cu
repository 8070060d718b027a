// Elementwise CUDA kernels: add, mul, scale (maps, core/cuda/map.cuh), relu, sum_to_f32 and
// count_nonfinite.
//
// Grids. Every kernel is grid-stride with 256 threads a block: the maps four waves of the blocks
// that fit on the GPU (map.cuh), sum_to_f32 and count_nonfinite at most 2048 blocks, relu at most
// 4096. All but relu move 16-byte packs (8 bf16/f16, 4 f32, 2 f64) when every pointer is 16-byte
// aligned, else one element, the last n % pack elements a scalar tail; relu one element a step.
//
// Precision. bf16/f16 values are widened to fp32, combined, and rounded once on store; f64 stays
// f64. add/mul/scale store ('='); sum_to_f32 stores or adds one fp32 total into *out.
//
// Determinism. sum_to_f32 is two passes: pass 1 has a grid fixed by n and the pointer's
// alignment (not by the GPU), each block writes its fp32 partial; pass 2 is one block that adds
// the partials in index order. No atomics, so the bits are the same on every run.
#include "ops/elementwise/elementwise_cuda.h"

#include <cmath>
#include <cstdint>

#include "core/cuda/check.h"
#include "core/cuda/glue.h"
#include "core/cuda/map.cuh"
#include "core/cuda/reduce.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/tensor_ops.h"
#include "core/cuda/vec.cuh"
#include "core/registry.h"
#include "ops/elementwise/elementwise.h"

namespace mt::cuda {
namespace {

struct AddOp {
  template <class T> __device__ T operator()(T a, T b) const { return convert<T>(widen(a) + widen(b)); }
};
struct MulOp {
  template <class T> __device__ T operator()(T a, T b) const { return convert<T>(widen(a) * widen(b)); }
};
// Unary, a = x: returns alpha * x.
struct ScaleOp {
  float alpha;
  template <class T> __device__ T operator()(T x, T) const { return convert<T>(Acc<T>(alpha) * widen(x)); }
};

// ---- sum_to_f32 ---------------------------------------------------------------------------------

// Pass 1: partials[block] = fp32 sum of the elements this block's threads visit.
template <class T, int V>
__global__ void sum_partials_kernel(const T* x, int64_t n, float* partials) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / V;
  float acc = 0.f;
  for (int64_t i = tid; i < nv; i += stride) {
    const Pack<T, V> p = reinterpret_cast<const Pack<T, V>*>(x)[i];
#pragma unroll
    for (int j = 0; j < V; ++j) acc += float(widen(p.v[j]));
  }
  for (int64_t i = nv * V + tid; i < n; i += stride) acc += float(widen(x[i]));
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Pass 2, one block: *out (+)= sum of the partials in index order.
__global__ void sum_final_kernel(const float* partials, int num, float* out, bool accumulate) {
  float acc = 0.f;
  for (int i = threadIdx.x; i < num; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = accumulate ? *out + acc : acc;
}

// ---- count_nonfinite ----------------------------------------------------------------------------

template <class T, int V>
__global__ void nonfinite_kernel(const T* x, int64_t n, int* flag) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / V;
  bool bad = false;
  for (int64_t i = tid; i < nv; i += stride) {
    const Pack<T, V> p = reinterpret_cast<const Pack<T, V>*>(x)[i];
#pragma unroll
    for (int j = 0; j < V; ++j) bad |= !isfinite(widen(p.v[j]));  // widening keeps inf and NaN
  }
  for (int64_t i = nv * V + tid; i < n; i += stride) bad |= !isfinite(widen(x[i]));
  // Every block that saw one writes the same 1: a benign race, no atomics needed.
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

}  // namespace

void add(const void* a, const void* b, void* out, int64_t n, DType dt, cudaStream_t s) {
  launch_map("add", a, b, out, n, dt, AddOp{}, s);
}

void mul(const void* a, const void* b, void* out, int64_t n, DType dt, cudaStream_t s) {
  launch_map("mul", a, b, out, n, dt, MulOp{}, s);
}

void scale(const void* x, float alpha, void* out, int64_t n, DType dt, cudaStream_t s) {
  launch_map("scale", x, nullptr, out, n, dt, ScaleOp{alpha}, s);
}

void sum_to_f32(const void* x, int64_t n, DType dt, float* out, bool accumulate, cudaStream_t s) {
  if (n <= 0) {
    if (!accumulate) MT_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float), s));
    return;
  }
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CHECK(s == mt::cuda::stream(dev), "sum_to_f32: must run on the framework stream of device ", dev,
           " (its scratch is ordered there)");
  dispatch_float(dt, "sum_to_f32", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    const bool vec = aligned(x, 16);
    const unsigned blocks = vec ? map_blocks(n / V) : map_blocks(n);  // fixed by n and alignment
    auto* partials = static_cast<float*>(mt::cuda::alloc(blocks * sizeof(float), dev));
    if (vec) sum_partials_kernel<T, V><<<blocks, kMapThreads, 0, s>>>(static_cast<const T*>(x), n, partials);
    else sum_partials_kernel<T, 1><<<blocks, kMapThreads, 0, s>>>(static_cast<const T*>(x), n, partials);
    MT_CUDA_CHECK_LAUNCH();
    sum_final_kernel<<<1, 1024, 0, s>>>(partials, int(blocks), out, accumulate);
    MT_CUDA_CHECK_LAUNCH();
    mt::cuda::free(partials, dev);  // stream-ordered: released after the kernels above have run
  });
}

void count_nonfinite(const void* x, int64_t n, DType dt, int* flag, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_float(dt, "count_nonfinite", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    auto* p = static_cast<const T*>(x);
    if (aligned(x, 16)) nonfinite_kernel<T, V><<<map_blocks(n / V), kMapThreads, 0, s>>>(p, n, flag);
    else nonfinite_kernel<T, 1><<<map_blocks(n), kMapThreads, 0, s>>>(p, n, flag);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for the elementwise ops on CUDA ----------------------
// (The Functions and the math are in elementwise.cpp / elementwise.h.)

namespace mt {
namespace {

// relu and the broadcast of a one-element gradient need their own small maps.
template <class T>
__global__ void relu_kernel(const T* x, const T* dy, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = float(x[i]);
    out[i] = v > 0.f ? (dy ? dy[i] : x[i]) : T(0.f);
  }
}

template <class T>
__global__ void broadcast_kernel(const T* scalar, float c, T* out, int64_t n) {
  const T v = T(c * float(*scalar));  // read on the device: no host synchronization
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = v;
}

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 4096)); }

void add_cuda(const Tensor& a, const Tensor& b, double alpha, const Tensor& out) {
  cudaStream_t s = cuda::stream_of(a);
  if (alpha == 1.0) {
    cuda::add(a.data_ptr(), b.data_ptr(), out.data_ptr(), a.numel(), a.dtype(), s);
  } else {
    MT_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), a.data_ptr(), a.nbytes(), cudaMemcpyDeviceToDevice, s));
    cuda::axpy(float(alpha), b.data_ptr(), out.data_ptr(), a.numel(), a.dtype(), s);
  }
}
void mul_cuda(const Tensor& a, const Tensor& b, const Tensor& out) {
  cuda::mul(a.data_ptr(), b.data_ptr(), out.data_ptr(), a.numel(), a.dtype(), cuda::stream_of(a));
}
void scale_cuda(const Tensor& x, double c, const Tensor& out) {
  cuda::scale(x.data_ptr(), float(c), out.data_ptr(), x.numel(), x.dtype(), cuda::stream_of(x));
}
void relu_forward_cuda(const Tensor& x, const Tensor& y) {
  if (x.numel() == 0) return;
  cudaStream_t s = cuda::stream_of(x);
  cuda::dispatch_float<false>(x.dtype(), "relu", [&](auto tag) {
    using T = decltype(tag);
    relu_kernel<T><<<grid_for(x.numel()), 256, 0, s>>>(cuda::ptr<T>(x), nullptr, cuda::ptr<T>(y), x.numel());
    MT_CUDA_CHECK_LAUNCH();
  });
}
// dx '=' in x's dtype, a new tensor (the engine adds it into .grad); likewise broadcast_cuda.
void relu_backward_cuda(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  if (x.numel() == 0) return;
  cudaStream_t s = cuda::stream_of(x);
  cuda::dispatch_float<false>(x.dtype(), "relu", [&](auto tag) {
    using T = decltype(tag);
    relu_kernel<T><<<grid_for(x.numel()), 256, 0, s>>>(cuda::ptr<T>(x), cuda::ptr<T>(dy), cuda::ptr<T>(dx), x.numel());
    MT_CUDA_CHECK_LAUNCH();
  });
}
void sum_cuda(const Tensor& x, const Tensor& out) {
  cudaStream_t s = cuda::stream_of(x);
  if (out.dtype() == DType::f32) {
    cuda::sum_to_f32(x.data_ptr(), x.numel(), x.dtype(), cuda::ptr<float>(out), false, s);
    return;
  }
  Tensor acc = empty({}, DType::f32, x.device());  // fp32 accumulator, then one rounding
  cuda::sum_to_f32(x.data_ptr(), x.numel(), x.dtype(), cuda::ptr<float>(acc), false, s);
  cuda::cast(acc.data_ptr(), DType::f32, out.data_ptr(), out.dtype(), 1, s);
}
void broadcast_cuda(const Tensor& scalar, double c, const Tensor& out) {
  if (out.numel() == 0) return;
  cudaStream_t s = cuda::stream_of(out);
  cuda::dispatch_float<false>(out.dtype(), "sum", [&](auto tag) {
    using T = decltype(tag);
    broadcast_kernel<T><<<grid_for(out.numel()), 256, 0, s>>>(cuda::ptr<T>(scalar), float(c), cuda::ptr<T>(out), out.numel());
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

MT_REGISTER_KERNEL(add, Forward, CUDA, add_cuda);
MT_REGISTER_KERNEL(mul, Forward, CUDA, mul_cuda);
MT_REGISTER_KERNEL(scale, Forward, CUDA, scale_cuda);
MT_REGISTER_KERNEL(relu, Forward, CUDA, relu_forward_cuda);
MT_REGISTER_KERNEL(relu, Backward, CUDA, relu_backward_cuda);
MT_REGISTER_KERNEL(sum, Forward, CUDA, sum_cuda);
MT_REGISTER_KERNEL(sum, Backward, CUDA, broadcast_cuda);

}  // namespace mt
