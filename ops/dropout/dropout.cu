// Dropout on the GPU: one grid-stride map that regenerates the mask from (seed, offset, i), and
// the one-thread kernel that moves the device-side offset base from step to step. The math, why
// the mask is not saved, the base and the grids are in dropout.h; the generator is philox.h's,
// the CPU reference's, so both devices draw the same bits.
//
// Bytes: the input read and the output written once (x -> y forward, dy -> dx backward); the
// floor is those at copy bandwidth. One Philox call (10 rounds of two 32-bit multiplies, high and
// low) gives the 16-bit halves of eight elements: about 12 integer instructions an element, which
// the map hides only with loads in flight while it computes: each thread loads two groups of
// eight before it draws their words (below).
#include "ops/dropout/dropout_cuda.h"

#include <algorithm>

#include "core/cuda/check.h"
#include "core/cuda/glue.h"
#include "core/cuda/map.cuh"
#include "core/cuda/runtime.h"
#include "core/registry.h"
#include "ops/dropout/dropout.h"
#include "ops/dropout/philox.h"

namespace mt::cuda {
namespace {

constexpr int kGroup = 8;   // elements a Philox call serves: its eight 16-bit halves
constexpr int kUnroll = 2;  // groups a thread loads before it computes

template <class T>
__device__ __forceinline__ T keep_or_zero(T x, uint32_t half, uint32_t threshold, Acc<T> scale) {
  return half >= threshold ? convert<T>(widen(x) * scale) : convert<T>(Acc<T>(0));
}

// Thread t takes groups t, t + threads, ...: group g is elements 8g .. 8g + 7, kGroup / V loads
// of V elements (16-byte packs, or V = 1 for an unaligned buffer), kUnroll groups loaded together
// per round, then the rest one at a time, then the n % 8 last elements one by one.
template <class T, int V>
__global__ void __launch_bounds__(kMapThreads)
    dropout_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n, uint32_t threshold,
                   Acc<T> scale, uint64_t seed, uint64_t call_offset,
                   const uint64_t* __restrict__ base) {
  constexpr int G = kGroup / V;  // loads a group
  using P = Pack<T, V>;
  const uint64_t offset = call_offset + (base != nullptr ? *base : 0);  // read when it runs
  const P* ip = reinterpret_cast<const P*>(in);
  P* op = reinterpret_cast<P*>(out);
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  const int64_t groups = n / kGroup;
  auto apply = [&](P (&x)[G], int64_t g) {
    const philox::U32x4 r = philox::draw(seed, offset, uint64_t(g));
#pragma unroll
    for (int q = 0; q < G; ++q)
#pragma unroll
      for (int k = 0; k < V; ++k)
        x[q].v[k] = keep_or_zero(x[q].v[k], philox::half16(r, q * V + k), threshold, scale);
#pragma unroll
    for (int q = 0; q < G; ++q) op[g * G + q] = x[q];
  };
  int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; g + (kUnroll - 1) * threads < groups; g += kUnroll * threads) {
    P x[kUnroll][G];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int q = 0; q < G; ++q) x[u][q] = ip[(g + u * threads) * G + q];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) apply(x[u], g + u * threads);
  }
  for (; g < groups; g += threads) {
    P x[G];
#pragma unroll
    for (int q = 0; q < G; ++q) x[q] = ip[g * G + q];
    apply(x, g);
  }
  for (int64_t e = groups * kGroup + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += threads) {
    const philox::U32x4 r = philox::draw(seed, offset, uint64_t(e) / kGroup);
    out[e] = keep_or_zero(in[e], philox::half16(r, int(e % kGroup)), threshold, scale);
  }
}

__global__ void advance_base_kernel(uint64_t* base, uint64_t value, uint64_t stride, bool set) {
  *base = set ? value : *base + stride;
}

// A few waves of blocks (as many as fit on the GPU at once, times kWaves), fewer when there is
// less work: every block then has the same number of rounds, and no SM idles at the end.
constexpr int kWaves = 4;

template <class T, int V>
unsigned dropout_blocks(int64_t n) {
  static int per_sm = [] {
    int b = 0;
    MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, dropout_kernel<T, V>,
                                                                kMapThreads, 0));
    return std::max(b, 1);
  }();
  const int64_t cap = int64_t(per_sm) * sm_count(current_device()) * kWaves;
  const int64_t per_block = int64_t(kMapThreads) * kUnroll * kGroup;
  return unsigned(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, cap));
}

}  // namespace

void dropout_apply(const void* in, void* out, int64_t n, uint32_t threshold, double scale,
                   uint64_t seed, uint64_t offset, const uint64_t* base, DType dt,
                   cudaStream_t s) {
  MT_CHECK(n >= 0, "dropout: negative element count ", n);
  if (n == 0) return;
  MT_CHECK(in != nullptr && out != nullptr, "dropout: null pointer");
  dispatch_float(dt, "dropout", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);  // a 16-byte pack: 8 bf16/f16, 4 f32, 2 f64
    const T* pi = static_cast<const T*>(in);
    T* po = static_cast<T*>(out);
    const Acc<T> sc = Acc<T>(scale);
    if (aligned(in, 16) && aligned(out, 16))
      dropout_kernel<T, V><<<dropout_blocks<T, V>(n), kMapThreads, 0, s>>>(
          pi, po, n, threshold, sc, seed, offset, base);
    else
      dropout_kernel<T, 1><<<dropout_blocks<T, 1>(n), kMapThreads, 0, s>>>(
          pi, po, n, threshold, sc, seed, offset, base);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void dropout_advance_base(uint64_t* base, uint64_t value, uint64_t stride, cudaStream_t s) {
  MT_CHECK(base != nullptr, "dropout_advance_base: null pointer");
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MT_CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  advance_base_kernel<<<1, 1, 0, s>>>(base, value, stride, status == cudaStreamCaptureStatusNone);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for dropout on CUDA (both phases) ----------------------
namespace mt {
namespace {

const uint64_t* base_ptr(const Tensor& base) {
  return base.defined() ? static_cast<const uint64_t*>(base.data_ptr()) : nullptr;
}

// out '=' in in's dtype, a new tensor.
void dropout_cuda(const Tensor& in, uint32_t threshold, double scale, uint64_t seed,
                  uint64_t offset, const Tensor& base, const Tensor& out) {
  cuda::dropout_apply(in.data_ptr(), out.data_ptr(), in.numel(), threshold, scale, seed, offset,
                      base_ptr(base), in.dtype(), cuda::stream_of(in));
}

void advance_base_cuda(const Tensor& base, uint64_t value, uint64_t stride) {
  cuda::dropout_advance_base(static_cast<uint64_t*>(base.data_ptr()), value, stride,
                             cuda::stream_of(base));
}

}  // namespace

MT_REGISTER_KERNEL(dropout, Forward, CUDA, dropout_cuda);
MT_REGISTER_KERNEL(dropout, Backward, CUDA, dropout_cuda);
MT_REGISTER_KERNEL(dropout_base, Forward, CUDA, advance_base_cuda);

}  // namespace mt
