// LayerNorm on the GPU, x viewed as [rows, d], weight and bias fp32 [d]. The math and the
// saved-vs-recomputed choice are in layer_norm.h. With a residual (add_layer_norm) the forward's
// row is s = x + res, rounded to dt and stored as it is loaded, then normalized as x would be;
// the backward adds dres to dx before dx's one rounding. Same grids, one more row read.
//
// Two layouts (both fp32 math, inputs widened, outputs rounded once to dt):
//
//   warp rows   d ≤ 1024, d a multiple of the 16-byte pack (8 bf16/f16, 4 f32), x, y (dy, dx)
//               16-byte aligned: a warp owns a row and holds it in registers (lane `l` the packs
//               l, l + 32, ...; kPPL packs a lane, the row's packs over 32 rounded up to the next
//               build: 3 for GPT-2's 768 in bf16), so each row is read from memory once although
//               the forward uses it three times (mean, variance about the mean, output) and the
//               backward twice. Sums are shuffle butterflies. Blocks of 8 warps, one wave of them
//               (as many as fit on the GPU at once, fewer for few rows); each warp strides over
//               rows, warp w of the grid taking rows w, w + all warps, ...; the forward loads its
//               next row before it works on the current one, so one row is always in flight.
//               The backward fits more blocks an SM instead (three for rows of at most 3 packs
//               a lane, two for wider ones), whose loads do the same. Each block first copies weight (and bias) into shared memory
//               in the order the lanes read them (staged_index): 2·d floats a row read from global
//               memory, 8 times the bytes of a bf16 row, were what held the first version of these
//               kernels to 40% of copy bandwidth. The backward adds each lane's columns' dy·x̂
//               and dy in fp32, in row order, into its warp's rows of shared memory (why there
//               and not in registers: above backward_warp_kernel); at the end the block adds its
//               warps' sums in warp order and writes one partial row [dweight | dbias] (2d floats).
//   block rows  any other d: a block of 256 threads per row, which reads the row from memory once
//               and again from cache for each further pass; the backward's dx the same way, and
//               dweight, dbias from a separate pass over chunks of kChunkRows rows: thread (c, t)
//               of a 32 x 8 block sums column c over rows t, t + 8, ... of its chunk, the 8 sums
//               are added in order, one partial row per chunk.
//
// Both then run the column reduce: column j of the partial rows summed in index order (32 slices
// side by side, then the slices in order) and ADDED to dweight[j] or dbias[j − d] ('+='). No
// atomics: the grid depends only on the GPU model and the shape, so the bits are the same on
// every run. The two layouts sum in different orders, so their bits differ (the op check's
// alignment_invariant = false).
#include "ops/layer_norm/layer_norm_cuda.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/glue.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/vec.cuh"
#include "core/registry.h"
#include "ops/layer_norm/layer_norm.h"

namespace mt::cuda {
namespace {

constexpr int kWarpRowsBlock = 256;  // 8 warps, 8 rows at a time
constexpr int kWarpRowsMaxD = 1024;  // 32 elements a lane at most
constexpr int kBlockRowThreads = 256;
constexpr int kChunkRows = 64;       // rows per partial of the block layout's dweight/dbias pass
constexpr int kReduceCols = 32, kReduceSlices = 32;

// The block's total of v, returned to every thread, in a fixed order; reusable within a kernel
// (the second barrier keeps the next call from overwriting totals still being read).
__device__ float block_allreduce(float v) {
  __shared__ float warp_totals[32];
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) warp_totals[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < int(blockDim.x / 32); ++i) total += warp_totals[i];
  __syncthreads();
  return total;
}

// dx + dres: the LayerNorm's fp32 dx formed first, then one __fadd_rn (never an FMA of dx's
// last product and dres), then the caller's one rounding to dt. In fp32 that is the sum the
// engine's separate add computes, bit for bit.
__device__ __forceinline__ float add_unfused(float dx, float dres) { return __fadd_rn(dx, dres); }

// ---- warp rows ------------------------------------------------------------------------------

// Lane `lane`'s columns of pack slot p are q·V .. q·V + V − 1, q = lane + 32p: 2V floats of weight
// (and of bias) a lane needs for each of its packs, 8 times the bytes of the bf16 pack itself. Read
// from global memory for every row they were the kernel's real traffic (each warp-wide load of
// one float a lane touches 32 sectors). So each block stages them once in shared memory, laid out
// so that the float4 h of slot p of lane l is float4 number (p·(V/4) + h)·32 + l: a warp's read of
// one such float4 is 512 contiguous bytes, no bank conflict.
template <int V>
__device__ __forceinline__ int staged_index(int col) {
  const int p = col / (32 * V), rem = col % (32 * V), lane = rem / V, k = rem % V;
  return ((p * (V / 4) + k / 4) * 32 + lane) * 4 + k % 4;
}

// params[i] → staged[staged_index(i)] for i < d, zeros for the padding up to kPPL·32·V. Ends
// with the block's barrier.
template <int V, int kPPL>
__device__ __forceinline__ void stage(const float* __restrict__ params, float* staged, int d) {
  for (int c = threadIdx.x; c < kPPL * 32 * V; c += blockDim.x)
    staged[staged_index<V>(c)] = c < d ? params[c] : 0.0f;
  __syncthreads();
}

// The V staged floats of slot p of this lane.
template <int V>
__device__ __forceinline__ void load_staged(const float* staged, int p, int lane, float (&out)[V]) {
#pragma unroll
  for (int h = 0; h < V / 4; ++h) {
    const float4 f = reinterpret_cast<const float4*>(staged)[(p * (V / 4) + h) * 32 + lane];
    out[4 * h] = f.x, out[4 * h + 1] = f.y, out[4 * h + 2] = f.z, out[4 * h + 3] = f.w;
  }
}

// load_staged's inverse: the V floats of slot p of this lane into staged.
template <int V>
__device__ __forceinline__ void store_staged(float* staged, int p, int lane, const float (&in)[V]) {
#pragma unroll
  for (int h = 0; h < V / 4; ++h)
    reinterpret_cast<float4*>(staged)[(p * (V / 4) + h) * 32 + lane] =
        make_float4(in[4 * h], in[4 * h + 1], in[4 * h + 2], in[4 * h + 3]);
}

template <class T, int V, int kPPL>
__device__ __forceinline__ void load_row(const T* __restrict__ base, int64_t row, int d, int lane,
                                         Pack<T, V> (&v)[kPPL]) {
  const int packs = d / V;
#pragma unroll
  for (int p = 0; p < kPPL; ++p)
    if (lane + 32 * p < packs) v[p] = reinterpret_cast<const Pack<T, V>*>(base + row * d)[lane + 32 * p];
}

// Warps stride over rows (row = global warp, + all warps of the grid, ...), each loading its next
// row before it works on the current one, so a row's load is always in flight. kRes: the row is
// s = x + res (rounded to T as add rounds it), written to sum_out before it is normalized.
template <class T, int V, int kPPL, bool kRes>
__global__ void __launch_bounds__(kWarpRowsBlock)
    forward_warp_kernel(const T* __restrict__ x, const T* __restrict__ res,
                        const float* __restrict__ weight, const float* __restrict__ bias,
                        T* __restrict__ sum_out, T* __restrict__ y, float* __restrict__ mean,
                        float* __restrict__ rstd, int64_t rows, int d, float eps) {
  using P = Pack<T, V>;
  __shared__ __align__(16) float sw[kPPL * 32 * V], sb[kPPL * 32 * V];
  stage<V, kPPL>(weight, sw, d);
  stage<V, kPPL>(bias, sb, d);
  const int lane = threadIdx.x % 32;
  const int packs = d / V;
  const int64_t stride = int64_t(gridDim.x) * (kWarpRowsBlock / 32);
  int64_t row = int64_t(blockIdx.x) * (kWarpRowsBlock / 32) + threadIdx.x / 32;
  P xv[kPPL], rv[kRes ? kPPL : 1];
  if (row < rows) {
    load_row<T, V, kPPL>(x, row, d, lane, xv);
    if constexpr (kRes) load_row<T, V, kPPL>(res, row, d, lane, rv);
  }
  for (; row < rows; row += stride) {  // a whole warp: it shares no barrier
    P next[kPPL], rnext[kRes ? kPPL : 1];
    if (row + stride < rows) {
      load_row<T, V, kPPL>(x, row + stride, d, lane, next);
      if constexpr (kRes) load_row<T, V, kPPL>(res, row + stride, d, lane, rnext);
    }
    if constexpr (kRes) {
#pragma unroll
      for (int p = 0; p < kPPL; ++p) {
        const int q = lane + 32 * p;
        if (q >= packs) break;
#pragma unroll
        for (int k = 0; k < V; ++k)
          xv[p].v[k] = from_float<T>(to_float(xv[p].v[k]) + to_float(rv[p].v[k]));
        reinterpret_cast<P*>(sum_out + row * d)[q] = xv[p];
      }
    }
    float sum = 0.0f;
#pragma unroll
    for (int p = 0; p < kPPL; ++p)
      if (lane + 32 * p < packs)
#pragma unroll
        for (int k = 0; k < V; ++k) sum += to_float(xv[p].v[k]);
    const float mu = warp_sum(sum) / float(d);
    float sq = 0.0f;  // the variance about the mean: no cancellation of E[x²] − E[x]²
#pragma unroll
    for (int p = 0; p < kPPL; ++p)
      if (lane + 32 * p < packs)
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float c = to_float(xv[p].v[k]) - mu;
          sq += c * c;
        }
    const float rs = 1.0f / sqrtf(warp_sum(sq) / float(d) + eps);
    if (lane == 0) mean[row] = mu, rstd[row] = rs;
#pragma unroll
    for (int p = 0; p < kPPL; ++p) {
      const int q = lane + 32 * p;
      if (q >= packs) break;
      float w[V], b[V];
      load_staged<V>(sw, p, lane, w);
      load_staged<V>(sb, p, lane, b);
      P out;
#pragma unroll
      for (int k = 0; k < V; ++k)
        out.v[k] = from_float<T>((to_float(xv[p].v[k]) - mu) * rs * w[k] + b[k]);
      reinterpret_cast<P*>(y + row * d)[q] = out;
    }
#pragma unroll
    for (int p = 0; p < kPPL; ++p) {
      xv[p] = next[p];
      if constexpr (kRes) rv[p] = rnext[p];
    }
  }
}

// The backward's accumulators live in shared memory: each warp owns two rows of kSlot floats
// there (Σ dy·x̂ and Σ dy for its lanes' columns, in the staged layout, so a lane's float4s are
// conflict-free), after the staged weight. Held in registers instead (2·kPPL·V floats a lane, 48
// for GPT-2's 768 in bf16) they left room for two blocks an SM and, with the next row prefetched,
// spilled: 34% of copy bandwidth at [65536, 768] bf16 on an H200. In shared memory the kernel
// needs 80 registers, three blocks fit an SM, and their 24 warps' loads keep enough bytes in
// flight without a prefetch (95% in the same measurement). Rows of more than 3 packs a lane take
// two blocks an SM (their row alone is 32 registers or more).
template <int kPPL>
constexpr int kBackwardMinBlocks = kPPL <= 3 ? 3 : 2;

template <int V, int kPPL>
constexpr size_t backward_shared_bytes() {
  constexpr int kSlot = kPPL * 32 * V;
  return size_t(1 + 2 * (kWarpRowsBlock / 32)) * kSlot * sizeof(float);
}

// kRes: dx = dres + the LayerNorm's dx, one rounding (the residual stream's two gradients).
template <class T, int V, int kPPL, bool kRes>
__global__ void __launch_bounds__(kWarpRowsBlock, kBackwardMinBlocks<kPPL>)
    backward_warp_kernel(const T* __restrict__ x, const float* __restrict__ weight,
                         const float* __restrict__ mean, const float* __restrict__ rstd,
                         const T* __restrict__ dy, const T* __restrict__ dres, T* __restrict__ dx,
                         float* __restrict__ partials, int64_t rows, int d) {
  using P = Pack<T, V>;
  constexpr int kWarps = kWarpRowsBlock / 32;
  constexpr int kSlot = kPPL * 32 * V;
  extern __shared__ __align__(16) float shared[];
  float* sw = shared;                                  // the staged weight
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* sums = shared + kSlot + warp * 2 * kSlot;     // this warp's [Σ dy·x̂ | Σ dy]
  for (int c = lane; c < 2 * kSlot; c += 32) sums[c] = 0.0f;
  stage<V, kPPL>(weight, sw, d);  // its barrier also covers the zeroing
  const int packs = d / V;
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  for (int64_t row = int64_t(blockIdx.x) * kWarps + warp; row < rows; row += stride) {
    P xv[kPPL], gv[kPPL];
    load_row<T, V, kPPL>(x, row, d, lane, xv);
    load_row<T, V, kPPL>(dy, row, d, lane, gv);
    const float mu = mean[row], rs = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int p = 0; p < kPPL; ++p) {
      if (lane + 32 * p >= packs) break;
      // The sums are kept whether or not partials are wanted: a branch on it here cost
      // registers (a spill at 768 in bf16).
      float w[V], dw[V], db[V];
      load_staged<V>(sw, p, lane, w);
      load_staged<V>(sums, p, lane, dw);
      load_staged<V>(sums + kSlot, p, lane, db);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = (to_float(xv[p].v[k]) - mu) * rs, g0 = to_float(gv[p].v[k]);
        const float g = g0 * w[k];  // dL/dx̂
        sum_g += g;
        sum_gx += g * xhat;
        dw[k] += g0 * xhat;
        db[k] += g0;
      }
      store_staged<V>(sums, p, lane, dw);
      store_staged<V>(sums + kSlot, p, lane, db);
    }
    if (dx != nullptr) {
      const float mg = warp_sum(sum_g) / float(d), mgx = warp_sum(sum_gx) / float(d);
#pragma unroll
      for (int p = 0; p < kPPL; ++p) {
        const int q = lane + 32 * p;
        if (q >= packs) break;
        float w[V];
        load_staged<V>(sw, p, lane, w);
        P out, rg;
        if constexpr (kRes) rg = reinterpret_cast<const P*>(dres + row * d)[q];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float xhat = (to_float(xv[p].v[k]) - mu) * rs;  // recomputed, not held
          const float g = to_float(gv[p].v[k]) * w[k];
          const float v = rs * (g - mg - xhat * mgx);
          out.v[k] = from_float<T>(kRes ? add_unfused(v, to_float(rg.v[k])) : v);
        }
        reinterpret_cast<P*>(dx + row * d)[q] = out;
      }
    }
  }

  if (partials == nullptr) return;  // the same for the whole grid
  // One partial row [dweight | dbias] a block: column c's warp sums added in warp order.
  __syncthreads();
  for (int col = threadIdx.x; col < 2 * d; col += blockDim.x) {
    const int half = col < d ? 0 : 1, at = half * kSlot + staged_index<V>(col - half * d);
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += shared[kSlot + w * 2 * kSlot + at];
    partials[int64_t(blockIdx.x) * 2 * d + col] = total;
  }
}

// ---- block rows ----------------------------------------------------------------------------

// res: the row is s = x + res (rounded to T), written to sum_out and read back from there (each
// thread re-reads only the elements it wrote).
template <class T>
__global__ void __launch_bounds__(kBlockRowThreads)
    forward_block_kernel(const T* __restrict__ x, const T* __restrict__ res,
                         const float* __restrict__ weight, const float* __restrict__ bias,
                         T* __restrict__ sum_out, T* __restrict__ y, float* __restrict__ mean,
                         float* __restrict__ rstd, int d, float eps) {
  const int64_t row = blockIdx.x;
  if (res != nullptr)
    for (int j = threadIdx.x; j < d; j += blockDim.x)
      sum_out[row * d + j] = from_float<T>(to_float(x[row * d + j]) + to_float(res[row * d + j]));
  const T* xr = (res != nullptr ? sum_out : x) + row * d;
  float sum = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) sum += to_float(xr[j]);
  const float mu = block_allreduce(sum) / float(d);
  float sq = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float c = to_float(xr[j]) - mu;
    sq += c * c;
  }
  const float rs = 1.0f / sqrtf(block_allreduce(sq) / float(d) + eps);
  if (threadIdx.x == 0) mean[row] = mu, rstd[row] = rs;
  for (int j = threadIdx.x; j < d; j += blockDim.x)
    y[row * d + j] = from_float<T>((to_float(xr[j]) - mu) * rs * weight[j] + bias[j]);
}

// dres (nullable): added to dx before its one rounding.
template <class T>
__global__ void __launch_bounds__(kBlockRowThreads)
    backward_dx_block_kernel(const T* __restrict__ x, const float* __restrict__ weight,
                             const float* __restrict__ mean, const float* __restrict__ rstd,
                             const T* __restrict__ dy, const T* __restrict__ dres,
                             T* __restrict__ dx, int d) {
  const int64_t row = blockIdx.x;
  const T *xr = x + row * d, *gr = dy + row * d;
  const float mu = mean[row], rs = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float g = to_float(gr[j]) * weight[j];
    sum_g += g;
    sum_gx += g * (to_float(xr[j]) - mu) * rs;
  }
  const float mg = block_allreduce(sum_g) / float(d);
  const float mgx = block_allreduce(sum_gx) / float(d);
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float xhat = (to_float(xr[j]) - mu) * rs, g = to_float(gr[j]) * weight[j];
    const float v = rs * (g - mg - xhat * mgx);
    dx[row * d + j] =
        from_float<T>(dres != nullptr ? add_unfused(v, to_float(dres[row * d + j])) : v);
  }
}

// partials[chunk, j] = Σ dy·x̂ and partials[chunk, d + j] = Σ dy over the chunk's rows, column j.
template <class T>
__global__ void __launch_bounds__(256)
    param_chunk_kernel(const T* __restrict__ x, const float* __restrict__ mean,
                       const float* __restrict__ rstd, const T* __restrict__ dy,
                       float* __restrict__ partials, int64_t rows, int d) {
  __shared__ float sums[2][8][32];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const int64_t first = int64_t(blockIdx.y) * kChunkRows;
  const int64_t last = std::min<int64_t>(rows, first + kChunkRows);
  float dw = 0.0f, db = 0.0f;
  if (col < d)
    for (int64_t r = first + threadIdx.y; r < last; r += 8) {
      const float g = to_float(dy[r * d + col]);
      dw += g * (to_float(x[r * d + col]) - mean[r]) * rstd[r];
      db += g;
    }
  sums[0][threadIdx.y][threadIdx.x] = dw;
  sums[1][threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && col < d) {
    float tw = 0.0f, tb = 0.0f;
    for (int t = 0; t < 8; ++t) tw += sums[0][t][threadIdx.x], tb += sums[1][t][threadIdx.x];
    partials[int64_t(blockIdx.y) * 2 * d + col] = tw;
    partials[int64_t(blockIdx.y) * 2 * d + d + col] = tb;
  }
}

// dweight[j] += Σ_b partials[b, j], dbias[j] += Σ_b partials[b, d + j], b in a fixed order:
// thread (c, s) of a 32 x 32 block sums rows s, s + 32, ... of its column, then thread (c, 0)
// adds the 32 slices in order. A null dweight or dbias is skipped.
__global__ void __launch_bounds__(kReduceCols * kReduceSlices)
    column_reduce_kernel(const float* __restrict__ partials, int parts, int d,
                         float* __restrict__ dweight, float* __restrict__ dbias) {
  __shared__ float slices[kReduceSlices][kReduceCols];
  const int col = blockIdx.x * kReduceCols + threadIdx.x;
  float v = 0.0f;
  if (col < 2 * d) {
#pragma unroll 4
    for (int b = threadIdx.y; b < parts; b += kReduceSlices) v += partials[int64_t(b) * 2 * d + col];
  }
  slices[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y != 0 || col >= 2 * d) return;
  float total = 0.0f;
  for (int s = 0; s < kReduceSlices; ++s) total += slices[s][threadIdx.x];
  float* out = col < d ? (dweight ? dweight + col : nullptr) : (dbias ? dbias + col - d : nullptr);
  if (out != nullptr) *out += total;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Calls f(std::integral_constant<int, kPPL>): the row's packs over 32, rounded up to the next
// build (1, 2, 3, 4 packs a lane; f32 also 6 and 8): at most 32 elements a lane. Exact for
// GPT-2's widths (768 = 3 bf16 or 6 f32 packs a lane, 1024), so no register holds padding.
template <int V, class F>
void with_ppl(int d, F&& f) {
  const int64_t ppl = ceil_div(ceil_div(d, V), 32);
  if (ppl <= 1) return f(std::integral_constant<int, 1>{});
  if (ppl <= 2) return f(std::integral_constant<int, 2>{});
  if (ppl <= 3) return f(std::integral_constant<int, 3>{});
  if (ppl <= 4) return f(std::integral_constant<int, 4>{});
  if constexpr (V == 4) {
    if (ppl <= 6) return f(std::integral_constant<int, 6>{});
    if (ppl <= 8) return f(std::integral_constant<int, 8>{});
  }
  MT_THROW("layer_norm: no warp-row build for d = ", d);
}

// Blocks of `kernel` (with `shared` bytes of dynamic shared memory) that fit on the GPU at once
// (one wave), at most `cap`.
template <class K>
int64_t resident_blocks(K kernel, int device, int64_t cap, size_t shared = 0) {
  int per_sm = 0;
  MT_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarpRowsBlock, shared));
  MT_CHECK(per_sm > 0, "layer_norm: a block of the warp-row kernel does not fit on an SM");
  return std::min<int64_t>(int64_t(per_sm) * sm_count(device), cap);
}

template <class T>
bool warp_rows(int d, std::initializer_list<const void*> ptrs) {
  constexpr int V = 16 / sizeof(T);
  if (d % V != 0 || d > kWarpRowsMaxD) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !aligned(p, 16)) return false;
  return true;
}

// Calls f(kRes): the kernels with the residual, or without it.
template <class F>
void with_residual(bool on, F&& f) {
  if (on) return f(std::true_type{});
  return f(std::false_type{});
}

template <class T>
void forward_as(const void* x, const void* res, const float* w, const float* b, void* sum_out,
                void* y, float* mean, float* rstd, int64_t rows, int d, float eps, cudaStream_t s) {
  const T* xt = static_cast<const T*>(x);
  const T* rt = static_cast<const T*>(res);
  T* st = static_cast<T*>(sum_out);
  T* yt = static_cast<T*>(y);
  if (warp_rows<T>(d, {x, res, sum_out, y})) {
    constexpr int V = 16 / sizeof(T);
    with_ppl<V>(d, [&](auto ppl) {
      with_residual(res != nullptr, [&](auto residual) {
        constexpr int kPPL = decltype(ppl)::value;
        auto kernel = forward_warp_kernel<T, V, kPPL, decltype(residual)::value>;
        const int64_t grid =
            resident_blocks(kernel, current_device(), ceil_div(rows, kWarpRowsBlock / 32));
        kernel<<<unsigned(grid), kWarpRowsBlock, 0, s>>>(xt, rt, w, b, st, yt, mean, rstd, rows, d,
                                                         eps);
      });
    });
  } else {
    MT_CHECK(rows <= INT32_MAX, "layer_norm: ", rows, " rows are more than one launch takes");
    forward_block_kernel<T><<<unsigned(rows), kBlockRowThreads, 0, s>>>(xt, rt, w, b, st, yt, mean,
                                                                        rstd, d, eps);
  }
  MT_CUDA_CHECK_LAUNCH();
}

template <class T>
void backward_as(const void* x, const float* w, const float* mean, const float* rstd,
                 const void* dy, const void* dres, void* dx, float* dweight, float* dbias,
                 int64_t rows, int d, cudaStream_t s) {
  const T* xt = static_cast<const T*>(x);
  const T* gt = static_cast<const T*>(dy);
  const T* rt = static_cast<const T*>(dres);
  T* dxt = static_cast<T*>(dx);
  const bool want_params = dweight != nullptr || dbias != nullptr;
  const int device = current_device();
  float* partials = nullptr;
  int parts = 0;
  if (warp_rows<T>(d, {x, dy, dres, dx})) {
    constexpr int V = 16 / sizeof(T);
    with_ppl<V>(d, [&](auto ppl) {
      with_residual(dres != nullptr, [&](auto residual) {
        constexpr int kPPL = decltype(ppl)::value;
        auto kernel = backward_warp_kernel<T, V, kPPL, decltype(residual)::value>;
        constexpr size_t kShared = backward_shared_bytes<V, kPPL>();
        if (kShared > 48 * 1024)  // past the default limit: raised for this kernel
          MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             int(kShared)));
        parts = int(resident_blocks(kernel, device, ceil_div(rows, kWarpRowsBlock / 32), kShared));
        if (want_params)
          partials = static_cast<float*>(alloc_on(s, size_t(parts) * 2 * d * sizeof(float), device));
        kernel<<<parts, kWarpRowsBlock, kShared, s>>>(xt, w, mean, rstd, gt, rt, dxt, partials,
                                                      rows, d);
        MT_CUDA_CHECK_LAUNCH();
      });
    });
  } else {
    MT_CHECK(rows <= INT32_MAX, "layer_norm: ", rows, " rows are more than one launch takes");
    if (dx != nullptr) {
      backward_dx_block_kernel<T><<<unsigned(rows), kBlockRowThreads, 0, s>>>(xt, w, mean, rstd,
                                                                              gt, rt, dxt, d);
      MT_CUDA_CHECK_LAUNCH();
    }
    if (want_params) {
      parts = int(ceil_div(rows, kChunkRows));
      partials = static_cast<float*>(alloc_on(s, size_t(parts) * 2 * d * sizeof(float), device));
      const dim3 grid(unsigned(ceil_div(d, 32)), unsigned(parts));
      param_chunk_kernel<T><<<grid, dim3(32, 8), 0, s>>>(xt, mean, rstd, gt, partials, rows, d);
      MT_CUDA_CHECK_LAUNCH();
    }
  }
  if (partials != nullptr) {
    column_reduce_kernel<<<unsigned(ceil_div(2 * d, kReduceCols)),
                           dim3(kReduceCols, kReduceSlices), 0, s>>>(partials, parts, d, dweight,
                                                                     dbias);
    MT_CUDA_CHECK_LAUNCH();
    free_on(s, partials);  // stream-ordered: released after the reduce has run
  }
}

void check_shape(const char* op, int64_t rows, int64_t d) {
  MT_CHECK(rows >= 0 && d >= 1 && d <= INT32_MAX / 2, op, ": bad shape [", rows, ", ", d, "]");
}

}  // namespace

void layer_norm_forward(const void* x, const void* res, const float* weight, const float* bias,
                        void* sum_out, void* y, float* mean, float* rstd, int64_t rows, int64_t d,
                        float eps, DType dt, cudaStream_t s) {
  check_shape("layer_norm_forward", rows, d);
  if (rows == 0) return;
  MT_CHECK(x && weight && bias && y && mean && rstd && (res == nullptr || sum_out != nullptr),
           "layer_norm_forward: null pointer");
  dispatch_float</*kWithF64=*/false>(dt, "layer_norm_forward", [&](auto t) {
    forward_as<decltype(t)>(x, res, weight, bias, sum_out, y, mean, rstd, rows, int(d), eps, s);
  });
}

// dx '=' in dt; dweight, dbias '+=' in fp32 (fixed-order column reduce): see the top.
void layer_norm_backward(const void* x, const float* weight, const float* mean, const float* rstd,
                         const void* dy, const void* dres, void* dx, float* dweight, float* dbias,
                         int64_t rows, int64_t d, DType dt, cudaStream_t s) {
  check_shape("layer_norm_backward", rows, d);
  if (rows == 0 || (dx == nullptr && dweight == nullptr && dbias == nullptr)) return;
  MT_CHECK(x && weight && mean && rstd && dy && (dres == nullptr || dx != nullptr),
           "layer_norm_backward: null pointer");
  dispatch_float</*kWithF64=*/false>(dt, "layer_norm_backward", [&](auto t) {
    backward_as<decltype(t)>(x, weight, mean, rstd, dy, dres, dx, dweight, dbias, rows, int(d), s);
  });
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for layer_norm on CUDA -------------------------------
namespace mt {
namespace {

void layer_norm_forward_cuda(const Tensor& x, const Tensor& residual, const Tensor& weight,
                             const Tensor& bias, double eps, const Tensor& sum, const Tensor& y,
                             const Tensor& mean, const Tensor& rstd) {
  const int64_t d = weight.numel();
  cuda::layer_norm_forward(x.data_ptr(), cuda::ptr(residual), cuda::ptr<const float>(weight),
                           cuda::ptr<const float>(bias), cuda::ptr(sum), y.data_ptr(),
                           cuda::ptr<float>(mean), cuda::ptr<float>(rstd), x.numel() / d, d,
                           float(eps), x.dtype(), cuda::stream_of(x));
}

// dx '=' in x's dtype; dweight, dbias are the fp32 .grads (sinks) or fresh zeros: the column
// reduce adds into them ('+=').
void layer_norm_backward_cuda(const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dy, const Tensor& dresidual,
                              const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  const int64_t d = weight.numel();
  cuda::layer_norm_backward(x.data_ptr(), cuda::ptr<const float>(weight),
                            cuda::ptr<const float>(mean), cuda::ptr<const float>(rstd),
                            dy.data_ptr(), cuda::ptr(dresidual), cuda::ptr(dx),
                            cuda::ptr<float>(dweight), cuda::ptr<float>(dbias), x.numel() / d, d,
                            x.dtype(), cuda::stream_of(x));
}

}  // namespace

MT_REGISTER_KERNEL(layer_norm, Forward, CUDA, layer_norm_forward_cuda);
MT_REGISTER_KERNEL(layer_norm, Backward, CUDA, layer_norm_backward_cuda);

}  // namespace mt
