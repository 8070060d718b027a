// cast and axpy (core/cuda/tensor_ops.h): a packed grid-stride cast kernel, and axpy as a map.
#include "core/cuda/tensor_ops.h"

#include "core/cuda/check.h"
#include "core/cuda/map.cuh"
#include "core/cuda/vec.cuh"

namespace mt::cuda {
namespace {

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

// The pack is 16 bytes of the wider of the two types.
template <class S, class D>
void launch_cast(const void* src, void* dst, int64_t n, cudaStream_t s) {
  constexpr int V = 16 / (sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
  auto* in = static_cast<const S*>(src);
  auto* out = static_cast<D*>(dst);
  if (aligned(src, sizeof(S) * V) && aligned(dst, sizeof(D) * V))
    cast_kernel<S, D, V><<<map_blocks(n / V), kMapThreads, 0, s>>>(in, out, n);
  else
    cast_kernel<S, D, 1><<<map_blocks(n), kMapThreads, 0, s>>>(in, out, n);
  MT_CUDA_CHECK_LAUNCH();
}

// a = x, b = y: returns y + alpha * x.
struct AxpyOp {
  float alpha;
  template <class T> __device__ T operator()(T x, T y) const {
    return convert<T>(widen(y) + Acc<T>(alpha) * widen(x));
  }
};

}  // namespace

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

void axpy(float alpha, const void* x, void* y, int64_t n, DType dt, cudaStream_t s) {
  launch_map("axpy", x, y, y, n, dt, AxpyOp{alpha}, s);
}

}  // namespace mt::cuda
