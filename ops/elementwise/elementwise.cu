// Elementwise CUDA kernels: fill, cast, add, mul, scale, axpy, sum_to_f32, count_nonfinite,
// argmax_rows.
//
// Grids. Every map (fill .. axpy, count_nonfinite) is grid-stride: 256 threads a block, at most
// 2048 blocks, each thread moving one 16-byte pack (8 bf16/f16, 4 f32, 2 f64) per step when every
// pointer is 16-byte aligned, else one element; the last n % pack elements are a scalar tail.
// These ops are pure bandwidth: the floor is (bytes read + bytes written) / copy bandwidth.
//
// Precision. bf16/f16 values are widened to fp32, combined, and rounded once on store; f64 stays
// f64. Accumulation rules: fill/cast/add/mul/scale store ('='); axpy adds into y ('+=', in the
// dtype of y, through fp32); sum_to_f32 stores or adds one fp32 total into *out.
//
// Determinism. sum_to_f32 is two passes: pass 1 has a grid fixed by n and the pointer's
// alignment (not by the GPU), each block writes its fp32 partial; pass 2 is one block that adds
// the partials in index order. No atomics, so the bits are the same on every run.
#include "ops/elementwise/elementwise_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/glue.h"
#include "core/cuda/runtime.h"
#include "core/registry.h"
#include "ops/elementwise/elementwise.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 2048;

// V elements moved as one aligned load / store.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// The type arithmetic happens in: f64 for f64, fp32 for everything else.
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class D, class S>
__device__ __forceinline__ D convert(S x) {
  if constexpr (std::is_same_v<D, S>) {
    return x;
  } else if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    return convert<D>(__bfloat162float(x));  // exact in float, then to D
  } else if constexpr (std::is_same_v<S, __half>) {
    return convert<D>(__half2float(x));
  } else if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    if constexpr (std::is_same_v<S, double>) return __double2bfloat16(x);  // one rounding
    else return __float2bfloat16_rn(float(x));
  } else if constexpr (std::is_same_v<D, __half>) {
    if constexpr (std::is_same_v<S, double>) return __double2half(x);
    else return __float2half_rn(float(x));
  } else {
    return D(x);  // among float, double, int32, int64: C++ conversion (round to nearest)
  }
}

template <class T>
__device__ __forceinline__ Acc<T> widen(T x) { return convert<Acc<T>>(x); }

// Blocks for a grid-stride loop over `work` items.
inline unsigned blocks_for(int64_t work) {
  int64_t b = (work + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Calls f(T{}) with T the CUDA type of a floating dtype.
template <class F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(__nv_bfloat16{}); return;
    case DType::f16: f(__half{}); return;
    case DType::f64: f(double{}); return;
    default: MT_THROW(op, ": unsupported dtype ", dtype_name(dt), " (expected f32, bf16, f16, f64)");
  }
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), in a fixed order: a butterfly
// inside each warp, then warp 0 over the warp totals. The result is valid in thread 0. Called at
// most once per kernel (the shared buffer is not re-synchronized).
__device__ float block_sum(float v) {
  __shared__ float warp_total[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_total[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x >> 5) ? warp_total[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  }
  return v;
}

// ---- fill: writes a bit pattern U (uint16/32/64) ------------------------------------------------

template <class U, int V>
__global__ void fill_kernel(U* p, U bits, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / V;
  Pack<U, V> pack;
#pragma unroll
  for (int j = 0; j < V; ++j) pack.v[j] = bits;
  for (int64_t i = tid; i < nv; i += stride) reinterpret_cast<Pack<U, V>*>(p)[i] = pack;
  for (int64_t i = nv * V + tid; i < n; i += stride) p[i] = bits;
}

template <class U>
void launch_fill(void* p, U bits, int64_t n, cudaStream_t s) {
  constexpr int V = 16 / sizeof(U);
  if (aligned(p, 16)) fill_kernel<U, V><<<blocks_for(n / V), kThreads, 0, s>>>(static_cast<U*>(p), bits, n);
  else fill_kernel<U, 1><<<blocks_for(n), kThreads, 0, s>>>(static_cast<U*>(p), bits, n);
  MT_CUDA_CHECK_LAUNCH();
}

// ---- cast ---------------------------------------------------------------------------------------

template <class S, class D, int V>
__global__ void cast_kernel(const S* src, D* dst, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / V;
  for (int64_t i = tid; i < nv; i += stride) {
    const Pack<S, V> in = reinterpret_cast<const Pack<S, V>*>(src)[i];
    Pack<D, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = convert<D>(in.v[j]);
    reinterpret_cast<Pack<D, V>*>(dst)[i] = out;
  }
  for (int64_t i = nv * V + tid; i < n; i += stride) dst[i] = convert<D>(src[i]);
}

template <class S, class D>
void launch_cast(const void* src, void* dst, int64_t n, cudaStream_t s) {
  constexpr int V = 16 / (sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
  auto* in = static_cast<const S*>(src);
  auto* out = static_cast<D*>(dst);
  if (aligned(src, sizeof(S) * V) && aligned(dst, sizeof(D) * V))
    cast_kernel<S, D, V><<<blocks_for(n / V), kThreads, 0, s>>>(in, out, n);
  else
    cast_kernel<S, D, 1><<<blocks_for(n), kThreads, 0, s>>>(in, out, n);
  MT_CUDA_CHECK_LAUNCH();
}

// ---- add / mul / scale / axpy: out[i] = op(a[i], b[i]), or op(a[i], a[i]) when kUnary -----------

struct AddOp {
  template <class T> __device__ T operator()(T a, T b) const { return convert<T>(widen(a) + widen(b)); }
};
struct MulOp {
  template <class T> __device__ T operator()(T a, T b) const { return convert<T>(widen(a) * widen(b)); }
};
// a = x, b = y: returns y + alpha * x.
struct AxpyOp {
  float alpha;
  template <class T> __device__ T operator()(T x, T y) const {
    return convert<T>(widen(y) + Acc<T>(alpha) * widen(x));
  }
};
// Unary, a = x: returns alpha * x.
struct ScaleOp {
  float alpha;
  template <class T> __device__ T operator()(T x, T) const { return convert<T>(Acc<T>(alpha) * widen(x)); }
};

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

// b == nullptr selects the unary kernel (op sees a[i] twice and reads it once).
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
    const unsigned blocks = vec ? blocks_for(n / V) : blocks_for(n);
    if (b == nullptr) {
      if (vec) map_kernel<T, V, true><<<blocks, kThreads, 0, s>>>(pa, pb, po, n, op);
      else map_kernel<T, 1, true><<<blocks, kThreads, 0, s>>>(pa, pb, po, n, op);
    } else {
      if (vec) map_kernel<T, V, false><<<blocks, kThreads, 0, s>>>(pa, pb, po, n, op);
      else map_kernel<T, 1, false><<<blocks, kThreads, 0, s>>>(pa, pb, po, n, op);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

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

// ---- argmax_rows --------------------------------------------------------------------------------

// Is (va, ia) a better argmax candidate than (vb, ib)? NaN beats numbers, larger beats smaller,
// and on a tie the smaller index wins, so the answer does not depend on the reduction order.
template <class A>
__device__ __forceinline__ bool better(A va, int64_t ia, A vb, int64_t ib) {
  const bool na = va != va, nb = vb != vb;
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

template <class T>
__global__ void argmax_rows_kernel(const T* x, int64_t C, int64_t* out) {
  using A = Acc<T>;
  const T* row = x + int64_t(blockIdx.x) * C;
  A best = -INFINITY;
  int64_t best_i = INT64_MAX;  // any real element (even -inf) beats this on the index tie-break
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const A v = widen(row[c]);
    if (better(v, c, best, best_i)) best = v, best_i = c;
  }
  auto warp_reduce = [&] {
    for (int o = 16; o > 0; o >>= 1) {
      const A v = __shfl_xor_sync(0xffffffffu, best, o);
      const int64_t i = __shfl_xor_sync(0xffffffffu, best_i, o);
      if (better(v, i, best, best_i)) best = v, best_i = i;
    }
  };
  warp_reduce();
  __shared__ A warp_v[32];
  __shared__ int64_t warp_i[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_v[warp] = best, warp_i[warp] = best_i;
  __syncthreads();
  if (warp == 0) {
    best = lane < int(blockDim.x >> 5) ? warp_v[lane] : A(-INFINITY);
    best_i = lane < int(blockDim.x >> 5) ? warp_i[lane] : INT64_MAX;
    warp_reduce();
    if (lane == 0) out[blockIdx.x] = best_i;
  }
}

}  // namespace

void fill(void* p, double value, int64_t n, DType dt, cudaStream_t s) {
  if (n <= 0) return;
  switch (dt) {
    case DType::f64: { uint64_t u; std::memcpy(&u, &value, 8); launch_fill<uint64_t>(p, u, n, s); return; }
    case DType::i64: launch_fill<uint64_t>(p, uint64_t(int64_t(value)), n, s); return;
    case DType::f32: launch_fill<uint32_t>(p, float_bits(float(value)), n, s); return;
    case DType::i32: launch_fill<uint32_t>(p, uint32_t(int32_t(value)), n, s); return;
    case DType::bf16: launch_fill<uint16_t>(p, float_to_bf16(float(value)).bits, n, s); return;
    case DType::f16: launch_fill<uint16_t>(p, float_to_f16(float(value)).bits, n, s); return;
  }
  MT_THROW("fill: unknown dtype ", int(dt));
}

void cast(const void* src, DType src_dt, void* dst, DType dst_dt, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (src_dt == dst_dt) {
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * dtype_size(src_dt), cudaMemcpyDeviceToDevice, s));
    return;
  }
  auto with_dst = [&](auto src_tag) {
    using S = decltype(src_tag);
    dispatch_float(dst_dt, "cast", [&](auto dst_tag) { launch_cast<S, decltype(dst_tag)>(src, dst, n, s); });
  };
  switch (src_dt) {
    case DType::i32: with_dst(int32_t{}); return;
    case DType::i64: with_dst(int64_t{}); return;
    default: dispatch_float(src_dt, "cast", with_dst);
  }
}

void add(const void* a, const void* b, void* out, int64_t n, DType dt, cudaStream_t s) {
  launch_map("add", a, b, out, n, dt, AddOp{}, s);
}

void mul(const void* a, const void* b, void* out, int64_t n, DType dt, cudaStream_t s) {
  launch_map("mul", a, b, out, n, dt, MulOp{}, s);
}

void scale(const void* x, float alpha, void* out, int64_t n, DType dt, cudaStream_t s) {
  launch_map("scale", x, nullptr, out, n, dt, ScaleOp{alpha}, s);
}

void axpy(float alpha, const void* x, void* y, int64_t n, DType dt, cudaStream_t s) {
  launch_map("axpy", x, y, y, n, dt, AxpyOp{alpha}, s);
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
    const unsigned blocks = vec ? blocks_for(n / V) : blocks_for(n);  // fixed by n and alignment
    auto* partials = static_cast<float*>(mt::cuda::alloc(blocks * sizeof(float), dev));
    if (vec) sum_partials_kernel<T, V><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(x), n, partials);
    else sum_partials_kernel<T, 1><<<blocks, kThreads, 0, s>>>(static_cast<const T*>(x), n, partials);
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
    if (aligned(x, 16)) nonfinite_kernel<T, V><<<blocks_for(n / V), kThreads, 0, s>>>(p, n, flag);
    else nonfinite_kernel<T, 1><<<blocks_for(n), kThreads, 0, s>>>(p, n, flag);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void argmax_rows(const void* x, int64_t rows, int64_t C, DType dt, int64_t* out, cudaStream_t s) {
  if (rows <= 0) return;
  MT_CHECK(C >= 1, "argmax_rows: need at least one column, got C = ", C);
  MT_CHECK(rows <= INT32_MAX, "argmax_rows: ", rows, " rows exceed one block per row");
  const int threads = C >= 2048 ? 256 : 32;  // a lone warp for the usual handful of classes
  dispatch_float(dt, "argmax_rows", [&](auto tag) {
    using T = decltype(tag);
    argmax_rows_kernel<T><<<unsigned(rows), threads, 0, s>>>(static_cast<const T*>(x), C, out);
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

template <class F>
void with_type(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(__nv_bfloat16{}); return;
    case DType::f16: f(__half{}); return;
    default: MT_THROW(op, ": CUDA supports f32, bf16 and f16, got ", dtype_name(dt));
  }
}

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
  with_type(x.dtype(), "relu", [&](auto tag) {
    using T = decltype(tag);
    relu_kernel<T><<<grid_for(x.numel()), 256, 0, s>>>(cuda::ptr<T>(x), nullptr, cuda::ptr<T>(y), x.numel());
    MT_CUDA_CHECK_LAUNCH();
  });
}
// dx '=' in x's dtype, a new tensor (the engine adds it into .grad); likewise broadcast_cuda.
void relu_backward_cuda(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  if (x.numel() == 0) return;
  cudaStream_t s = cuda::stream_of(x);
  with_type(x.dtype(), "relu", [&](auto tag) {
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
  with_type(out.dtype(), "sum", [&](auto tag) {
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
