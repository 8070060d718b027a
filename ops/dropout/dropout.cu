// Dropout on the GPU: one grid-stride map that regenerates the mask from (seed, offset, i), and
// the one-thread kernel that moves the device-side offset base from step to step. The math, why
// the mask is not saved, the base and the grids are in dropout.h; the generator is philox.h's,
// the CPU reference's, so both devices draw the same words.
//
// Bytes: the input read and the output written once (x -> y forward, dy -> dx backward); the
// floor is those at copy bandwidth. One Philox call (10 rounds of two 32-bit multiplies) gives
// the words of four elements: about 10 integer instructions an element, a third of what the
// memory time leaves the SM, so the map hides it only with loads in flight while it computes:
// each thread loads kUnroll packs before it draws their words (below).
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

// Packs of V elements loaded at once by each thread (16 elements a thread a round).
template <int V>
constexpr int kUnroll = V >= 16 ? 1 : 16 / V;

// Pack `i` of V elements: V a multiple of 4 (whole Philox groups; packs start at multiples of V),
// or V = 1 (one element, which draws its group and keeps one word).
template <class T, int V>
__device__ __forceinline__ Pack<T, V> apply_pack(const Pack<T, V>& x, int64_t i,
                                                 uint32_t threshold, Acc<T> scale, uint64_t seed,
                                                 uint64_t offset) {
  static_assert(V == 1 || V % 4 == 0);
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
  return y;
}

// Thread t handles packs t, t + threads, ...: kUnroll of them loaded together per round, then
// the rest one at a time, then the n % V tail (V > 1: a multiple of 4 starts it, so element j's
// word is j % 4 of group j / 4).
template <class T, int V>
__global__ void __launch_bounds__(kMapThreads)
    dropout_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n, uint32_t threshold,
                   Acc<T> scale, uint64_t seed, uint64_t call_offset,
                   const uint64_t* __restrict__ base) {
  constexpr int U = kUnroll<V>;
  using P = Pack<T, V>;
  const uint64_t offset = call_offset + (base != nullptr ? *base : 0);  // read when it runs
  const P* ip = reinterpret_cast<const P*>(in);
  P* op = reinterpret_cast<P*>(out);
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  const int64_t packs = n / V;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (U - 1) * threads < packs; i += U * threads) {
    P x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) x[u] = ip[i + u * threads];
#pragma unroll
    for (int u = 0; u < U; ++u)
      op[i + u * threads] = apply_pack<T, V>(x[u], i + u * threads, threshold, scale, seed, offset);
  }
  for (; i < packs; i += threads)
    op[i] = apply_pack<T, V>(ip[i], i, threshold, scale, seed, offset);
  if constexpr (V > 1) {
    for (int64_t j = packs * V + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
         j += threads) {
      const philox::U32x4 r = philox::draw(seed, offset, uint64_t(j) / 4);
      out[j] = r.v[j % 4] >= threshold ? convert<T>(widen(in[j]) * scale) : convert<T>(Acc<T>(0));
    }
  }
}

__global__ void advance_base_kernel(uint64_t* base, uint64_t value, uint64_t stride, bool set) {
  *base = set ? value : *base + stride;
}

// A few waves of blocks (as many as fit on the GPU at once, times kWaves), fewer when there is
// less work: every block then has the same number of rounds, and no SM idles at the end.
constexpr int kWaves = 4;

template <class T, int V>
unsigned dropout_blocks(int64_t packs) {
  static int per_sm = [] {
    int b = 0;
    MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, dropout_kernel<T, V>,
                                                                kMapThreads, 0));
    return std::max(b, 1);
  }();
  const int64_t cap = int64_t(per_sm) * sm_count(current_device()) * kWaves;
  const int64_t want = (packs + int64_t(kMapThreads) * kUnroll<V> - 1) /
                       (int64_t(kMapThreads) * kUnroll<V>);
  return unsigned(std::clamp<int64_t>(want, 1, cap));
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
    constexpr int V = 16 / sizeof(T) >= 4 ? 16 / sizeof(T) : 1;  // f64's pack of 2: one at a time
    const T* pi = static_cast<const T*>(in);
    T* po = static_cast<T*>(out);
    const Acc<T> sc = Acc<T>(scale);
    if (V > 1 && aligned(in, 16) && aligned(out, 16))
      dropout_kernel<T, V><<<dropout_blocks<T, V>(n / V), kMapThreads, 0, s>>>(
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
