#pragma once
// The RMSNorm kernels on the GPU, x viewed as [rows, d], weight w an fp32 vector [d], with an
// epilogue E applied to each normalized element: rms_norm (rms_norm.cu) runs them with Plain,
// rms_norm_scaled_silu (rms_norm_scaled_silu.cu) with its ScaledSiLU tail. Each of those two files
// includes this one and gets its own copy (internal linkage), instantiated where it is launched.
// The math of each op is at the top of its .cu file.
//
// Grids. A row belongs to a team of threads that holds it in registers, so each row is read from
// memory once even though it is used twice (reduce, then scale). Thread `lane` of a team owns the
// packs lane, lane + team, lane + 2 team, ... of the row; every kernel is built for a fixed number
// of packs per lane (kPPL) and of rows per team (kRows), so the registers it asks for are the
// ones it uses.
//   d <= 1024  the team is a warp (reductions are shuffles, no barrier), 8 teams to a block of
//              256 threads. kPPL is the row's packs over 32, rounded up to a power of two; the
//              forward gives a team 32 / (kPPL V) rows at once, so every thread holds 32
//              elements (at d = 256 in bf16: 4 rows of one pack per lane), and the backward, which
//              holds x and dy, two rows while a row is at most 8 elements a lane.
//   d >  1024  the team is the whole block: ceil(d / elements per thread) threads rounded up to
//              whole warps, 32 elements per thread in the forward and 16 in the backward (32
//              with an epilogue, below), hence d <= kRmsNormMaxD = 16 * 1024.
// The forward launches one block per group of rows, as many blocks as groups: the hardware starts
// blocks in order, so the rows in flight at any moment are neighbours in memory. (A persistent
// grid that strides over the rows lets its blocks drift apart, and DRAM serves the scattered rows
// about 10% slower: 88% of copy against 97% at d = 4096, bf16 on an H200.) The backward must be
// persistent, since a block sums dy xhat over all the rows it sees: one wave of blocks (as many
// as the occupancy calculator fits) strides over the rows. Those sums live in shared memory, laid
// out so that consecutive lanes touch consecutive words, which leaves the registers to the rows
// in flight; the launch bounds cap a thread at 64 registers when it holds up to 16 elements of
// each input and at 128 when it holds 32, which decides how many blocks share an SM. The
// backward's second pass needs g = dL/dx̂ again: a thread with 128 registers keeps it from the
// first pass, one with 64 recomputes it from dy (keeping it there spills). An epilogue's g costs
// a σ(h) to recompute, so the fused op's block teams take 32 elements a thread and keep it: 76%
// of copy at d = 4096 and 8192 against 58% with 16 recomputed (bf16, H200). Loads and stores are
// 16-byte packs when d is a multiple of the pack width and x, y (dy, dx) and weight are 16-byte
// aligned (then every row is); otherwise the same kernels run with one element per access.
// docs/kernels.md lists the layouts measured against these.
//
// Accumulation:
//   forward    y = (dt, rounded from fp32), rstd = (fp32)
//   backward   dx = (dt; skipped when null), in the same pass that accumulates dweight. A thread
//              always owns the same columns, so it adds dy xhat of its rows into the same words of
//              its team's shared-memory row, in row order; at the end the block adds its teams'
//              rows in team order. deterministic: partials[block, :] = that (fp32), then a column
//              reduce sums partials[0..blocks) in a fixed order and does dweight[:] += (fp32).
//              Otherwise atomicAdd(dweight[j], the block's value), whose rounding depends on the
//              blocks' arrival order.
//   Every sum is fp32 in a fixed order (per thread, shuffle tree, teams, blocks), and the grid
//   depends only on the GPU model: the same inputs give the same bits on every run.
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda/check.h"
#include "core/cuda/glue.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/vec.cuh"
#include "ops/rms_norm/rms_norm_cuda.h"

namespace mt::cuda {
namespace {

constexpr int kWarpTeamBlock = 256;  // block size when the team is a warp: 8 teams
constexpr int kMaxBlock = 1024;
constexpr int kReduceCols = 32;      // column reduce: 32 columns (one warp wide) per block,
constexpr int kReduceSlices = 32;    // and 32 slices of the partial rows summed side by side
constexpr size_t kDefaultSharedBytes = 48 * 1024;  // more needs an explicit opt-in per kernel

// Row elements a thread holds per input when the team is the whole block (d > 1024). The
// backward holds 16 (x and dy) in 64 registers and recomputes g = dy·weight in its second pass;
// with an epilogue, whose g costs a σ(h) to recompute, it holds 32 in 128 registers and keeps g.
constexpr int kFwdElems = 32;
constexpr int kBwdElems = 16;
constexpr int kBwdElemsEpilogue = 32;
static_assert(kRmsNormMaxD == int64_t(kBwdElems) * kMaxBlock);
static_assert(kRmsNormMaxD <= int64_t(kBwdElemsEpilogue) * 512);

// Rows a warp team takes at once: the forward fills 32 elements a thread; the backward, which
// holds two inputs, takes two rows while a row is at most 8 elements a lane.
constexpr int fwd_rows(int ppl, int v) { return ppl * v >= 32 ? 1 : 32 / (ppl * v); }
constexpr int bwd_rows(int ppl, int v) { return ppl * v <= 8 ? 2 : 1; }

// The weights of columns col .. col + V - 1 (col a multiple of V), 16 bytes at a time when V
// allows. The weight is tiny and read by every row: these loads hit L1.
template <int V>
__device__ __forceinline__ void load_weight(const float* __restrict__ w, int col, float (&out)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int k = 0; k < V; k += 4) {
      const float4 f = *reinterpret_cast<const float4*>(w + col + k);
      out[k] = f.x, out[k + 1] = f.y, out[k + 2] = f.z, out[k + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = w[col + k];
  }
}

// Sum of v over the calling thread's team, returned to every thread of the team, in a fixed
// order. A warp team needs only the shuffle butterfly; a block team then goes through shared
// memory, where every thread adds the warp totals in warp order. Successive calls alternate
// between two scratch rows (`parity`), so one barrier per call is enough: a warp cannot rewrite a
// row before every warp has passed the next call's barrier, after reading it.
__device__ float team_sum(float v, int team_size, int parity) {
  v = warp_sum(v);
  if (team_size == 32) return v;
  __shared__ float warp_totals[2][kMaxBlock / 32];
  if (threadIdx.x % 32 == 0) warp_totals[parity][threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < team_size / 32; ++i) total += warp_totals[parity][i];
  return total;
}

// What follows the normalization, per element, with h = x·rstd·weight in fp32 (the epilogue E of
// the kernels): rms_norm stops there (Plain); rms_norm_scaled_silu goes on to y = w·h·σ(h), w one
// fp32 scalar the kernels read from device memory (ScaledSiLUTail, rms_norm_scaled_silu.cu).
// backward turns dL/dy into dL/dh and adds the scalar's term into `dw`.
struct Plain {
  static constexpr bool kScalar = false;
  __device__ static float forward(float h, float) { return h; }
  __device__ static float backward(float, float dy, float, float&) { return dy; }
};

// Team t of block b normalizes rows (b * teams + t) * kRows .. + kRows. All of a thread's
// kRows * kPPL packs are loaded before any is used, so that many 16-byte loads are in flight.
template <class T, int V, int kPPL, int kRows, class E>
__global__ void __launch_bounds__(kMaxBlock)
    forward_kernel(const T* __restrict__ x, const float* __restrict__ weight,
                   const float* __restrict__ scalar, T* __restrict__ y, float* __restrict__ rstd,
                   int64_t rows, int d, float eps, int team_size) {
  using P = Pack<T, V>;
  const int teams = blockDim.x / team_size;
  const int team = threadIdx.x / team_size, lane = threadIdx.x % team_size;
  const int packs = d / V;
  const int64_t first = (int64_t(blockIdx.x) * teams + team) * kRows;
  if (first >= rows) return;  // a warp team past the last row (it shares no barrier)
  const float ws = E::kScalar ? *scalar : 0.0f;

  P xv[kRows][kPPL];
#pragma unroll
  for (int s = 0; s < kRows; ++s)
#pragma unroll
    for (int p = 0; p < kPPL; ++p)
      if (first + s < rows && lane + p * team_size < packs)
        xv[s][p] = reinterpret_cast<const P*>(x + (first + s) * d)[lane + p * team_size];

  float sum_sq[kRows];
#pragma unroll
  for (int s = 0; s < kRows; ++s) {
    sum_sq[s] = 0.0f;
#pragma unroll
    for (int p = 0; p < kPPL; ++p) {
      if (lane + p * team_size >= packs) break;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float v = to_float(xv[s][p].v[k]);
        sum_sq[s] += v * v;
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kRows; ++s) {
    const int64_t row = first + s;
    const float r = 1.0f / sqrtf(team_sum(sum_sq[s], team_size, 0) / float(d) + eps);
    if (row >= rows) break;
    if (lane == 0) rstd[row] = r;
    P* yr = reinterpret_cast<P*>(y + row * d);
#pragma unroll
    for (int p = 0; p < kPPL; ++p) {
      const int q = lane + p * team_size;
      if (q >= packs) break;
      float w[V];
      load_weight<V>(weight, q * V, w);
      P out;
#pragma unroll
      for (int k = 0; k < V; ++k)
        out.v[k] = from_float<T>(E::forward(to_float(xv[s][p].v[k]) * r * w[k], ws));
      yr[q] = out;
    }
  }
}

// Where a backward team keeps the dweight sum of element k of its lane's pack p, in words from
// the start of its shared-memory row: the elements of a pack in groups of four consecutive words
// (one 16-byte access), lane after lane, so a warp's accesses are 32 consecutive groups.
// With one element per pack, one word per lane, again lane after lane.
template <int V>
__device__ __forceinline__ int sum_slot(int p, int k, int lane, int team_size) {
  constexpr int kGroup = V % 4 == 0 ? 4 : 1;
  return ((p * V + k) / kGroup * team_size + lane) * kGroup + k % kGroup;
}

// sums[slot of (p, k, lane)] += v[k] for the V elements of one pack.
template <int V>
__device__ __forceinline__ void add_sums(float* sums, int p, int lane, int team_size,
                                         const float (&v)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int g = 0; g < V; g += 4) {
      float4* at = reinterpret_cast<float4*>(sums + sum_slot<V>(p, g, lane, team_size));
      float4 a = *at;
      a.x += v[g], a.y += v[g + 1], a.z += v[g + 2], a.w += v[g + 3];
      *at = a;
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) sums[sum_slot<V>(p, k, lane, team_size)] += v[k];
  }
}

// dx for each row, and this block's share of dweight (and of the scalar's gradient, for an
// epilogue with one): written to partials[blockIdx.x, :] (d + 1 columns with the scalar, the
// last one its), or atomically added to dweight_atomic and scalar_atomic (partials or the
// atomics; neither when the caller wants no parameter gradient). Dynamic shared memory:
// teams * team_size * kPPL * V floats, the dweight sums, laid out by sum_slot so that a warp's
// lanes touch consecutive words (no bank conflict) and a 16-byte pack's sums move as 16-byte
// shared-memory accesses.
//
// kMaxThreads and kMinBlocks are the launch bounds: they cap a thread's registers at
// 65536 / (kMaxThreads * kMinBlocks).
template <class T, int V, int kPPL, int kRows, int kMaxThreads, int kMinBlocks, bool kHoldG,
          class E>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks)
    backward_kernel(const T* __restrict__ x, const float* __restrict__ weight,
                    const float* __restrict__ scalar, const float* __restrict__ rstd,
                    const T* __restrict__ dy, T* __restrict__ dx, float* __restrict__ partials,
                    float* dweight_atomic, float* scalar_atomic, int64_t rows, int d,
                    int team_size) {
  using P = Pack<T, V>;
  const int teams = blockDim.x / team_size;
  const int team = threadIdx.x / team_size, lane = threadIdx.x % team_size;
  const int packs = d / V;
  const int span = team_size * kPPL * V;  // shared-memory words per team
  const bool want_dw = partials != nullptr || dweight_atomic != nullptr;  // same for the grid
  extern __shared__ float4 shared[];
  float* dw_sums = reinterpret_cast<float*>(shared);  // [teams][span], see above
  if (want_dw) {
    for (int i = threadIdx.x; i < teams * span; i += blockDim.x) dw_sums[i] = 0.0f;
    __syncthreads();
  }
  float* my_sums = dw_sums + team * span;
  const float ws = E::kScalar ? *scalar : 0.0f;
  float scalar_sum = 0.0f;  // this thread's share of the scalar's gradient, in row order

  int parity = 0;
  for (int64_t base = int64_t(blockIdx.x) * teams * kRows; base < rows;
       base += int64_t(gridDim.x) * teams * kRows) {
    const int64_t first = base + team * kRows;  // this team's rows: first .. first + kRows
    P xv[kRows][kPPL], gv[kRows][kPPL];
    float r[kRows];
#pragma unroll
    for (int s = 0; s < kRows; ++s) {
      const bool live = first + s < rows;
      r[s] = live ? rstd[first + s] : 0.0f;
#pragma unroll
      for (int p = 0; p < kPPL; ++p) {
        if (live && lane + p * team_size < packs) {
          xv[s][p] = reinterpret_cast<const P*>(x + (first + s) * d)[lane + p * team_size];
          gv[s][p] = reinterpret_cast<const P*>(dy + (first + s) * d)[lane + p * team_size];
        }
      }
    }

    // Pass 1: g = dL/dx̂ per element, and this thread's shares of c and of dweight. With kHoldG
    // g stays in fp32 registers for pass 2, which then reads neither dy's packs nor the weight
    // again, nor recomputes an epilogue's σ(h); without it pass 2 recomputes g from dy.
    float g[kHoldG ? kRows : 1][kHoldG ? kPPL : 1][V];
    float c[kRows];  // this thread's share of sum_j g_j xhat_j, then the team's mean
#pragma unroll
    for (int s = 0; s < kRows; ++s) {
      c[s] = 0.0f;
#pragma unroll
      for (int p = 0; p < kPPL; ++p) {
        const int q = lane + p * team_size;
        if (first + s >= rows || q >= packs) break;
        float w[V];
        load_weight<V>(weight, q * V, w);
        float dw[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float xhat = to_float(xv[s][p].v[k]) * r[s];  // x̂_j = x_j·rstd
          const float dyv = E::backward(xhat * w[k], to_float(gv[s][p].v[k]), ws, scalar_sum);
          const float gk = dyv * w[k];  // g_j = dy_j·weight_j = dL/dx̂_j
          if constexpr (kHoldG) g[s][p][k] = gk;
          c[s] += gk * xhat;
          dw[k] = dyv * xhat;  // this row's term of dw_j = Σ_r dy_j·x̂_j
        }
        if (want_dw) add_sums<V>(my_sums, p, lane, team_size, dw);
      }
    }
#pragma unroll
    for (int s = 0; s < kRows; ++s, parity ^= 1)
      c[s] = team_sum(c[s], team_size, parity) / float(d);  // c = mean_j g_j·x̂_j: rstd's share
    if (dx == nullptr) continue;

    // Pass 2: dx_j = rstd·(g_j − x̂_j·c): the direct term minus the one through rstd.
#pragma unroll
    for (int s = 0; s < kRows; ++s) {
      if (first + s >= rows) break;
      P* dxr = reinterpret_cast<P*>(dx + (first + s) * d);
#pragma unroll
      for (int p = 0; p < kPPL; ++p) {
        const int q = lane + p * team_size;
        if (q >= packs) break;
        float w[V];
        if constexpr (!kHoldG) load_weight<V>(weight, q * V, w);
        P out;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float xhat = to_float(xv[s][p].v[k]) * r[s];
          float gk;
          if constexpr (kHoldG) {
            gk = g[s][p][k];
          } else {
            float unused = 0.0f;  // the scalar's term was taken in pass 1
            gk = E::backward(xhat * w[k], to_float(gv[s][p].v[k]), ws, unused) * w[k];
          }
          out.v[k] = from_float<T>(r[s] * (gk - xhat * c[s]));
        }
        dxr[q] = out;
      }
    }
  }

  if (!want_dw) return;
  const int width = d + int(E::kScalar);  // the partials' row
  if constexpr (E::kScalar) {
    const float total = block_sum(scalar_sum);  // its barrier also publishes dw_sums
    if (threadIdx.x == 0) {
      if (partials != nullptr)
        partials[int64_t(blockIdx.x) * width + d] = total;
      else
        atomicAdd(scalar_atomic, total);
    }
  } else {
    __syncthreads();
  }
  for (int col = threadIdx.x; col < d; col += blockDim.x) {
    const int q = col / V;  // column col is in pack q, which is pack q / team of lane q % team
    const int word = sum_slot<V>(q / team_size, col % V, q % team_size, team_size);
    float total = 0.0f;
    for (int t = 0; t < teams; ++t) total += dw_sums[t * span + word];
    if (partials != nullptr)
      partials[int64_t(blockIdx.x) * width + col] = total;
    else
      atomicAdd(dweight_atomic + col, total);
  }
}

// out[j] += sum_b partials[b, j] in a fixed order, out = dweight for j < d and the scalar's
// gradient for j = d (the partials are `width` = d or d + 1 columns). Thread (x, y) of a 32 x 32
// block sums rows b = y, y + 32, ... of column blockIdx.x * 32 + x (a warp reads 128 contiguous
// bytes, and the unrolled loop keeps several loads in flight: this pass is latency-bound, not
// bandwidth-bound); then thread (x, 0) adds the 32 slices in order.
__global__ void __launch_bounds__(kReduceCols * kReduceSlices)
    column_reduce_kernel(const float* __restrict__ partials, int blocks, int width, int d,
                         float* __restrict__ dweight, float* __restrict__ dscalar) {
  __shared__ float slices[kReduceSlices][kReduceCols];
  const int col = blockIdx.x * kReduceCols + threadIdx.x;
  float v = 0.0f;
  if (col < width) {
#pragma unroll 4
    for (int b = threadIdx.y; b < blocks; b += kReduceSlices)
      v += partials[int64_t(b) * width + col];
  }
  slices[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && col < width) {
    float total = 0.0f;
    for (int s = 0; s < kReduceSlices; ++s) total += slices[s][threadIdx.x];
    *(col < d ? dweight + col : dscalar) += total;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The team and block for rows of d elements: a warp team when the row fits in 32 threads at
// 32 elements each, else a block team of ceil(d / elems) threads rounded up to whole warps.
struct Layout {
  int team_size;
  int block;
  int teams() const { return block / team_size; }
};

Layout layout_for(int d, int elems) {
  if (d <= 32 * 32) return {32, kWarpTeamBlock};
  const int block = int(ceil_div(ceil_div(d, elems), 32)) * 32;
  return {block, block};
}

// Calls f(std::integral_constant<int, kPPL>) with the packs per lane of a warp team (d <= 1024):
// the row's packs over 32, rounded up to a power of two, so at most 4 in bf16/f16 and 8 in f32.
// The one-element path (V = 1) has a single build for every d.
template <int V, class F>
void with_warp_ppl(int d, F&& f) {
  const int64_t ppl = ceil_div(ceil_div(d, V), 32);
  if constexpr (V == 1) {
    f(std::integral_constant<int, 32>{});
  } else {
    if (ppl <= 1) return f(std::integral_constant<int, 1>{});
    if (ppl <= 2) return f(std::integral_constant<int, 2>{});
    if (ppl <= 4) return f(std::integral_constant<int, 4>{});
    if constexpr (V == 4) {
      if (ppl <= 8) return f(std::integral_constant<int, 8>{});
    }
    MT_THROW("rms_norm: no warp-team build for d = ", d);
  }
}

// Blocks of `kernel` that fit on one SM at once. The answer depends only on the device, the
// kernel, the block size and the shared memory, so the driver is asked once per combination:
// the query costs host time on every launch, and a training step launches these kernels many
// times with the same few shapes.
template <class Kernel>
int blocks_per_sm(Kernel kernel, int block, size_t shared_bytes) {
  using Key = std::tuple<int, const void*, int, size_t>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  const Key key{current_device(), reinterpret_cast<const void*>(kernel), block, shared_bytes};
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int per_sm = 0;
  MT_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, shared_bytes));
  MT_CHECK(per_sm > 0, "rms_norm: a block of ", block, " threads with ", shared_bytes,
           " bytes of shared memory does not fit on an SM");
  cache.emplace(key, per_sm);
  return per_sm;
}

// One wave: as many blocks as fit on all SMs at once, fewer when there are fewer row groups.
template <class Kernel>
int one_wave(Kernel kernel, int block, size_t shared_bytes, int64_t row_groups) {
  const int per_sm = blocks_per_sm(kernel, block, shared_bytes);
  return int(std::min(row_groups, int64_t(per_sm) * sm_count(current_device())));
}

void check_shape(const char* op, int64_t rows, int64_t d) {
  MT_CHECK(rows >= 0 && d >= 1, op, ": bad shape [", rows, ", ", d, "]");
  MT_CHECK(d <= kRmsNormMaxD, op, ": rows of d = ", d,
           " elements are longer than the CUDA kernels support (d <= ", kRmsNormMaxD, ")");
}

template <class T, class E>
void forward_as(const void* x, const float* weight, const float* scalar, void* y, float* rstd,
                int64_t rows, int d, float eps, cudaStream_t s) {
  const T* xt = static_cast<const T*>(x);
  T* yt = static_cast<T*>(y);
  auto launch = [&](auto v, auto ppl, const Layout& L) {
    constexpr int V = decltype(v)::value, kPPL = decltype(ppl)::value;
    constexpr int kRows = fwd_rows(kPPL, V);
    const int64_t grid = ceil_div(rows, int64_t(L.teams()) * kRows);
    MT_CHECK(grid <= INT32_MAX, "rms_norm: ", rows, " rows are more than one launch takes");
    forward_kernel<T, V, kPPL, kRows, E><<<unsigned(grid), L.block, 0, s>>>(
        xt, weight, scalar, yt, rstd, rows, d, eps, L.team_size);
    MT_CUDA_CHECK_LAUNCH();
  };
  auto with_width = [&](auto v) {
    constexpr int V = decltype(v)::value;
    const Layout L = layout_for(d, kFwdElems);
    if (L.team_size == 32)
      with_warp_ppl<V>(d, [&](auto ppl) { launch(v, ppl, L); });
    else
      launch(v, std::integral_constant<int, kFwdElems / V>{}, L);
  };
  constexpr int V = 16 / sizeof(T);
  if (d % V == 0 && aligned16(x) && aligned16(y) && aligned16(weight))
    with_width(std::integral_constant<int, V>{});
  else
    with_width(std::integral_constant<int, 1>{});
}

// dweight and dscalar are both wanted or both null (the launchers below check it).
template <class T, class E>
void backward_as(const void* x, const float* weight, const float* scalar, const float* rstd,
                 const void* dy, void* dx, float* dweight, float* dscalar, int64_t rows, int d,
                 bool deterministic, cudaStream_t s) {
  const T* xt = static_cast<const T*>(x);
  const T* gt = static_cast<const T*>(dy);
  T* dxt = static_cast<T*>(dx);
  constexpr int kElems = E::kScalar ? kBwdElemsEpilogue : kBwdElems;  // a block team's
  const Layout L = layout_for(d, kElems);
  const int width = d + int(E::kScalar);
  auto launch = [&](auto kernel, int elems_per_lane, int rows_per_team) {
    const size_t shared_bytes =
        dweight != nullptr ? size_t(L.block) * elems_per_lane * sizeof(float) : 0;
    if (shared_bytes > kDefaultSharedBytes)
      MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(shared_bytes)));
    const int grid = one_wave(kernel, L.block, shared_bytes,
                              ceil_div(rows, int64_t(L.teams()) * rows_per_team));
    float* partials = nullptr;
    if (dweight != nullptr && deterministic)
      partials = static_cast<float*>(
          alloc_on(s, size_t(grid) * width * sizeof(float), current_device()));
    float* dweight_atomic = deterministic ? nullptr : dweight;
    float* scalar_atomic = deterministic ? nullptr : dscalar;
    kernel<<<grid, L.block, shared_bytes, s>>>(xt, weight, scalar, rstd, gt, dxt, partials,
                                               dweight_atomic, scalar_atomic, rows, d,
                                               L.team_size);
    MT_CUDA_CHECK_LAUNCH();
    if (partials != nullptr) {
      const dim3 block(kReduceCols, kReduceSlices);
      column_reduce_kernel<<<int(ceil_div(width, kReduceCols)), block, 0, s>>>(
          partials, grid, width, d, dweight, dscalar);
      MT_CUDA_CHECK_LAUNCH();
      free_on(s, partials);  // stream-ordered: released after the reduce has run
    }
  };
  // A thread holding up to 16 elements may use 64 registers and one holding 32 may use 128, which
  // sets the launch bound's blocks per SM; it holds g from pass 1 to pass 2 when it has 128
  // (under 64, g would spill).
  // A warp team holds its row's elements (16 or fewer, or 32); a block team kElems, under the
  // smallest launch bound that fits the block.
  auto with_width = [&](auto v) {
    constexpr int V = decltype(v)::value;
    if (L.team_size == 32) {
      with_warp_ppl<V>(d, [&](auto ppl) {
        constexpr int kPPL = decltype(ppl)::value, kRows = bwd_rows(kPPL, V);
        constexpr bool kHold = kPPL * V * kRows > 16;
        launch(backward_kernel<T, V, kPPL, kRows, kWarpTeamBlock, kHold ? 2 : 4, kHold, E>,
               kPPL * V, kRows);
      });
      return;
    }
    constexpr int kPPL = kElems / V;
    constexpr bool kHold = kElems > 16;
    auto bounded = [&](auto threads) {
      constexpr int kThreads = decltype(threads)::value;
      constexpr int kMinBlocks = 65536 / (kThreads * 4 * kElems);  // 4·kElems: 64 or 128
      static_assert(kMinBlocks >= 1);
      launch(backward_kernel<T, V, kPPL, 1, kThreads, kMinBlocks, kHold, E>, kElems, 1);
    };
    if (L.block <= 128) return bounded(std::integral_constant<int, 128>{});
    if (L.block <= 256) return bounded(std::integral_constant<int, 256>{});
    if (L.block <= 512) return bounded(std::integral_constant<int, 512>{});
    if constexpr (kElems == kBwdElems) return bounded(std::integral_constant<int, 1024>{});
    MT_THROW("rms_norm: no backward build for d = ", d);  // unreachable: d <= kRmsNormMaxD
  };
  constexpr int V = 16 / sizeof(T);
  const bool vectorized = d % V == 0 && aligned16(x) && aligned16(dy) && aligned16(weight) &&
                          (dx == nullptr || aligned16(dx));
  if (vectorized)
    with_width(std::integral_constant<int, V>{});
  else
    with_width(std::integral_constant<int, 1>{});
}

}  // namespace
}  // namespace mt::cuda
