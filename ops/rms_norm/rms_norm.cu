// RMSNorm on the GPU, x viewed as [rows, d], weight w an fp32 vector [d].
//
// Math (derived term by term in rms_norm.h; the names below label the kernel lines):
//   forward    rstd_r = 1 / sqrt(mean_j x_rj^2 + eps)
//              y_rj   = x_rj rstd_r w_j
//   backward   xhat = x rstd,  g = dy w,  c_r = mean_j g_rj xhat_rj
//              dx_rj  = rstd_r (g_rj - xhat_rj c_r)
//              dw_j  += sum_r dy_rj xhat_rj
//
// Saved vs recomputed: the forward saves rstd, one fp32 per row (4 bytes against the row's 2d
// bytes in bf16), so the backward needs no extra pass over x before it can start. xhat and g
// are recomputed from x and dy, which the backward reads anyway.
//
// Grids. A row belongs to a team of threads that holds it in registers, kElems = 16 elements per
// thread (two 16-byte packs in bf16/f16, four in f32, 16 scalars on the scalar path), so each
// row is read from memory once even though it is used twice (reduce, then scale).
//   d <= 512   the team is one warp: its reductions are shuffles, no barrier.
//   d >  512   the team is ceil(d / 16) threads rounded up to whole warps, at most 1024, hence
//              d <= kRmsNormMaxD = 16384.
// A block holds as many teams as fit in 256 threads (at least one): 8 rows at a time for
// d <= 512, 4 for d = 1024, one for d >= 4096. Blocks stride over the row groups (block b takes
// groups b, b + grid, ...) and the grid is one wave: as many blocks as the occupancy calculator
// fits on the SMs at once (persistent blocks). The backward uses the same teams and the same
// rows-to-blocks mapping as the forward. Loads and stores are 16-byte packs when d is a multiple
// of the pack width and x, y (dy, dx) and weight are 16-byte aligned (then every row is);
// otherwise the same kernels run with one element per access.
//
// Bytes in flight. A memory-bound kernel reaches the copy rate only if every SM keeps enough
// loads outstanding to cover DRAM latency, and a team has none outstanding while it waits at its
// reduction's barrier. The backward loads two rows' worth (x and dy) per barrier and reaches 96%
// of copy without its dweight sums; the vectorized forward therefore gives each team two rows
// per iteration (kRows = 2): both rows' loads are issued, then one reduction serves both.
// Holding the weights or the next row in registers was measured slower (fewer blocks per SM).
//
// Accumulation:
//   forward    y = (dt, rounded from fp32), rstd = (fp32)
//   backward   dx = (dt; skipped when null), in the same pass that accumulates dweight. A thread
//              always owns the same columns, so it sums dy xhat of its rows in fp32, in its
//              team's row of shared memory (dynamic, teams * d floats: in registers they would
//              cost a block per SM); at the end the block adds its teams' rows in team order.
//              deterministic: partials[block, :] = that (fp32), then a column reduce sums
//              partials[0..blocks) in a fixed order and does dweight[:] += (fp32). Otherwise
//              atomicAdd(dweight[j], the block's value), whose rounding depends on the blocks'
//              arrival order.
//   Every sum is fp32 in a fixed order (per thread, shuffle tree, teams, blocks), and the grid
//   depends only on the GPU model: the same inputs give the same bits on every run.
#include "ops/rms_norm/rms_norm_cuda.h"

#include <algorithm>
#include <atomic>
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
#include "core/registry.h"
#include "ops/rms_norm/rms_norm.h"

namespace mt::cuda {
namespace {

constexpr int kElems = 16;          // row elements a thread keeps in registers, per input
constexpr int kBlockThreads = 256;  // teams are packed into blocks of (up to) this many threads
constexpr int kMaxBlock = 1024;
constexpr int kSmallBlock = 256;    // backward blocks up to this size get a register-rich build
constexpr int kReduceCols = 32;     // column reduce: 32 columns (one warp wide) per block,
constexpr int kReduceSlices = 32;   // and 32 slices of the partial rows summed side by side
constexpr size_t kDefaultSharedBytes = 48 * 1024;  // more needs an explicit opt-in per kernel

static_assert(kRmsNormMaxD == int64_t(kElems) * kMaxBlock);

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

// v = src[0 .. V) and dst[0 .. V) = v in shared memory, 16 bytes at a time when V allows.
template <int V>
__device__ __forceinline__ void load_from(const float* src, float (&v)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int k = 0; k < V; k += 4) {
      const float4 f = *reinterpret_cast<const float4*>(src + k);
      v[k] = f.x, v[k + 1] = f.y, v[k + 2] = f.z, v[k + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = src[k];
  }
}
template <int V>
__device__ __forceinline__ void store_to(float* dst, const float (&v)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int k = 0; k < V; k += 4)
      *reinterpret_cast<float4*>(dst + k) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) dst[k] = v[k];
  }
}

// v[i] summed over the calling thread's team, for N values at once (one barrier pair for all),
// returned to every thread of the team, in a fixed order. A warp team needs only the shuffle
// butterfly; a larger team then goes through shared memory, where every thread adds its team's
// warp totals in warp order. Every thread of the block calls it together (the barriers are
// block-wide); the second barrier lets the next call reuse the scratch.
template <int N>
__device__ void team_sum(float (&v)[N], int team_size) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = warp_sum(v[i]);
  if (team_size == 32) return;
  __shared__ float warp_totals[N][kMaxBlock / 32];
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) warp_totals[i][threadIdx.x / 32] = v[i];
  }
  __syncthreads();
  const int team_warps = team_size / 32, first_warp = threadIdx.x / team_size * team_warps;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float total = 0.0f;
    for (int w = 0; w < team_warps; ++w) total += warp_totals[i][first_warp + w];
    v[i] = total;
  }
  __syncthreads();
}

// Thread `lane` of a team owns packs lane, lane + team_size, ... of each of its rows (coalesced:
// a warp reads 512 contiguous bytes per pack). A block takes kRows groups of `teams` rows per
// iteration (its team's rows first + team, first + teams + team, ...), loads all of its packs of
// all kRows rows, then reduces them together.
template <class T, int V, int kRows>
__global__ void __launch_bounds__(kMaxBlock)
    forward_kernel(const T* __restrict__ x, const float* __restrict__ weight, T* __restrict__ y,
                   float* __restrict__ rstd, int64_t rows, int d, float eps, int team_size) {
  using P = Pack<T, V>;
  constexpr int kPacks = kElems / V;
  const int teams = blockDim.x / team_size;
  const int team = threadIdx.x / team_size, lane = threadIdx.x % team_size;
  const int packs = d / V;
  const int64_t group = int64_t(teams) * kRows;  // rows a block takes per iteration
  const P* xp = reinterpret_cast<const P*>(x);
  P* yp = reinterpret_cast<P*>(y);

  for (int64_t first = int64_t(blockIdx.x) * group; first < rows;
       first += int64_t(gridDim.x) * group) {
    P xv[kRows][kPacks];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t row = first + i * teams + team;
#pragma unroll
      for (int p = 0; p < kPacks; ++p)
        if (row < rows && lane + p * team_size < packs)
          xv[i][p] = xp[row * packs + lane + p * team_size];
    }

    float sum_sq[kRows];  // this thread's share of sum_j x_j^2, per row
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      sum_sq[i] = 0.0f;
      if (first + i * teams + team >= rows) continue;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        if (lane + p * team_size >= packs) break;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float v = to_float(xv[i][p].v[k]);
          sum_sq[i] += v * v;
        }
      }
    }
    team_sum<kRows>(sum_sq, team_size);

#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t row = first + i * teams + team;
      if (row >= rows) break;  // false only for teams past the last row
      const float r = 1.0f / sqrtf(sum_sq[i] / float(d) + eps);  // rstd
      if (lane == 0) rstd[row] = r;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        const int q = lane + p * team_size;
        if (q >= packs) break;
        float w[V];
        load_weight<V>(weight, q * V, w);
        P out;
#pragma unroll
        for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(to_float(xv[i][p].v[k]) * r * w[k]);
        yp[row * packs + q] = out;  // y = x rstd w
      }
    }
  }
}

// dx for each row with the forward's teams (one row per team per iteration), and this block's
// share of dweight: written to partials[blockIdx.x, :], or atomically added to dweight_atomic
// (at most one of the two is non-null; both null when the caller does not want dweight).
// Dynamic shared memory: teams * d floats when dweight is wanted, where each thread sums its own
// columns (kDwShared), or where it writes its fp32 register sums at the end (!kDwShared).
//
// kMaxThreads is the launch bound. A thread holds 16 elements of x and 16 of dy, and with
// !kDwShared 16 fp32 sums of dweight: ~76 registers, 3 blocks of 256 per SM. kDwShared moves the
// sums to shared memory and asks for 4 blocks of kSmallBlock threads per SM (64 registers), a
// third more bytes in flight. 1024-thread blocks (rows over 8192) are capped at 64 either way.
template <class T, int V, int kMaxThreads, bool kDwShared>
__global__ void __launch_bounds__(kMaxThreads, kDwShared && kMaxThreads == kSmallBlock ? 4 : 1)
    backward_kernel(const T* __restrict__ x, const float* __restrict__ weight,
                    const float* __restrict__ rstd, const T* __restrict__ dy, T* __restrict__ dx,
                    float* __restrict__ partials, float* dweight_atomic, int64_t rows, int d,
                    int team_size) {
  using P = Pack<T, V>;
  constexpr int kPacks = kElems / V;
  const int teams = blockDim.x / team_size;
  const int team = threadIdx.x / team_size, lane = threadIdx.x % team_size;
  const int packs = d / V;
  const P* xp = reinterpret_cast<const P*>(x);
  const P* gp = reinterpret_cast<const P*>(dy);
  P* dxp = reinterpret_cast<P*>(dx);
  const bool want_dw = partials != nullptr || dweight_atomic != nullptr;  // the same grid-wide
  extern __shared__ float4 shared[];  // float4: 16-byte aligned, for load_from / store_to
  float* dw_rows = reinterpret_cast<float*>(shared);  // [teams][d]
  float dw_sum[kDwShared ? 1 : kPacks][V] = {};  // this thread's columns of sum_r dy xhat
  if (kDwShared && want_dw) {
    const float zero[V] = {};
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int q = lane + p * team_size;
      if (q < packs) store_to<V>(dw_rows + team * d + q * V, zero);
    }
  }

  for (int64_t first = int64_t(blockIdx.x) * teams; first < rows;
       first += int64_t(gridDim.x) * teams) {
    const int64_t row = first + team;
    const bool live = row < rows;
    P xv[kPacks], gv[kPacks];
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (live && lane + p * team_size < packs) {
        xv[p] = xp[row * packs + lane + p * team_size];
        gv[p] = gp[row * packs + lane + p * team_size];
      }
    }
    const float r = live ? rstd[row] : 0.0f;

    float dot[1] = {0.0f};  // this thread's share of sum_j g_j xhat_j
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int q = lane + p * team_size;
      if (!live || q >= packs) break;
      float w[V], dw[V];
      load_weight<V>(weight, q * V, w);
      if (kDwShared && want_dw) load_from<V>(dw_rows + team * d + q * V, dw);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = to_float(xv[p].v[k]) * r, dyv = to_float(gv[p].v[k]);
        dot[0] += dyv * w[k] * xhat;  // g_j xhat_j, g = dy w
        if constexpr (kDwShared) dw[k] += dyv * xhat;  // dw_j += dy_j xhat_j
        else dw_sum[p][k] += dyv * xhat;
      }
      if (kDwShared && want_dw) store_to<V>(dw_rows + team * d + q * V, dw);
    }
    team_sum<1>(dot, team_size);
    const float c = dot[0] / float(d);  // c = mean_j g_j xhat_j
    if (!live || dx == nullptr) continue;

#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int q = lane + p * team_size;
      if (q >= packs) break;
      float w[V];
      load_weight<V>(weight, q * V, w);
      P out;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = to_float(xv[p].v[k]) * r, g = to_float(gv[p].v[k]) * w[k];
        out.v[k] = from_float<T>(r * (g - xhat * c));  // dx = rstd (g - xhat c)
      }
      dxp[row * packs + q] = out;
    }
  }

  if (!want_dw) return;
  if constexpr (!kDwShared) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int q = lane + p * team_size;
      if (q < packs) store_to<V>(dw_rows + team * d + q * V, dw_sum[p]);
    }
  }
  __syncthreads();
  for (int col = threadIdx.x; col < d; col += blockDim.x) {
    float total = 0.0f;
    for (int t = 0; t < teams; ++t) total += dw_rows[t * d + col];
    if (partials != nullptr)
      partials[int64_t(blockIdx.x) * d + col] = total;
    else
      atomicAdd(dweight_atomic + col, total);
  }
}

// dweight[j] += sum_b partials[b, j] in a fixed order. Thread (x, y) of a 32 x 32 block sums rows
// b = y, y + 32, ... of column blockIdx.x * 32 + x (a warp reads 128 contiguous bytes, and the
// unrolled loop keeps several loads in flight: this pass is latency-bound, not bandwidth-bound);
// then thread (x, 0) adds the 32 slices in order.
__global__ void __launch_bounds__(kReduceCols * kReduceSlices)
    column_reduce_kernel(const float* __restrict__ partials, int blocks, int d,
                         float* __restrict__ dweight) {
  __shared__ float slices[kReduceSlices][kReduceCols];
  const int col = blockIdx.x * kReduceCols + threadIdx.x;
  float v = 0.0f;
  if (col < d) {
#pragma unroll 4
    for (int b = threadIdx.y; b < blocks; b += kReduceSlices) v += partials[int64_t(b) * d + col];
  }
  slices[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && col < d) {
    float total = 0.0f;
    for (int s = 0; s < kReduceSlices; ++s) total += slices[s][threadIdx.x];
    dweight[col] += total;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Threads per row (team) and per block, for rows of d elements.
struct Layout {
  int team_size;
  int block;
  int teams() const { return block / team_size; }
};

Layout layout_for(int d) {
  const int team = int(std::max<int64_t>(32, ceil_div(ceil_div(d, kElems), 32) * 32));
  return {team, std::max(1, kBlockThreads / team) * team};
}

// The layouts used unless set_rms_norm_variant (bench_kernels) asks for the other; its
// "layout rms_norm" lines say which is faster on the GPU at hand.
constexpr int kDefaultForwardRows = 2;          // rows per team per forward iteration (1 or 2)
constexpr bool kDefaultDweightInShared = true;  // backward dweight sums in shared memory
std::atomic<int> g_forward_rows{0}, g_dweight_in_shared{-1};  // 0 / -1: the defaults

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

template <class T>
void forward_as(const void* x, const float* weight, void* y, float* rstd, int64_t rows, int d,
                float eps, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const Layout L = layout_for(d);
  const T* xt = static_cast<const T*>(x);
  T* yt = static_cast<T*>(y);
  auto launch = [&](auto kernel, int rows_per_team) {
    const int64_t groups = ceil_div(rows, int64_t(L.teams()) * rows_per_team);
    const int grid = one_wave(kernel, L.block, 0, groups);
    kernel<<<grid, L.block, 0, s>>>(xt, weight, yt, rstd, rows, d, eps, L.team_size);
    MT_CUDA_CHECK_LAUNCH();
  };
  if (d % V == 0 && aligned16(x) && aligned16(y) && aligned16(weight)) {
    const int asked = g_forward_rows.load();
    if ((asked != 0 ? asked : kDefaultForwardRows) == 1) launch(forward_kernel<T, V, 1>, 1);
    else launch(forward_kernel<T, V, 2>, 2);
  } else {
    launch(forward_kernel<T, 1, 1>, 1);  // 16 scalars a row already: no room for a second
  }
}

template <class T>
void backward_as(const void* x, const float* weight, const float* rstd, const void* dy, void* dx,
                 float* dweight, int64_t rows, int d, bool deterministic, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const Layout L = layout_for(d);
  const size_t shared_bytes = dweight != nullptr ? size_t(L.teams()) * d * sizeof(float) : 0;
  const T* xt = static_cast<const T*>(x);
  const T* gt = static_cast<const T*>(dy);
  T* dxt = static_cast<T*>(dx);
  auto launch = [&](auto kernel) {
    if (shared_bytes > kDefaultSharedBytes)
      MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(shared_bytes)));
    const int grid = one_wave(kernel, L.block, shared_bytes, ceil_div(rows, L.teams()));
    float* partials = nullptr;
    if (dweight != nullptr && deterministic)
      partials = static_cast<float*>(
          alloc_on(s, size_t(grid) * d * sizeof(float), current_device()));
    float* dweight_atomic = deterministic ? nullptr : dweight;
    kernel<<<grid, L.block, shared_bytes, s>>>(xt, weight, rstd, gt, dxt, partials,
                                               dweight_atomic, rows, d, L.team_size);
    MT_CUDA_CHECK_LAUNCH();
    if (partials != nullptr) {
      const dim3 block(kReduceCols, kReduceSlices);
      column_reduce_kernel<<<int(ceil_div(d, kReduceCols)), block, 0, s>>>(partials, grid, d,
                                                                            dweight);
      MT_CUDA_CHECK_LAUNCH();
      free_on(s, partials);  // stream-ordered: released after the reduce has run
    }
  };
  const bool vectorized = d % V == 0 && aligned16(x) && aligned16(dy) && aligned16(weight) &&
                          (dx == nullptr || aligned16(dx));
  const int choice = g_dweight_in_shared.load();
  const bool small = L.block <= kSmallBlock;
  const bool in_shared = choice < 0 ? kDefaultDweightInShared : choice == 1;
  auto pick = [&](auto v_tag) {
    constexpr int W = decltype(v_tag)::value;
    if (in_shared)
      small ? launch(backward_kernel<T, W, kSmallBlock, true>)
            : launch(backward_kernel<T, W, kMaxBlock, true>);
    else
      small ? launch(backward_kernel<T, W, kSmallBlock, false>)
            : launch(backward_kernel<T, W, kMaxBlock, false>);
  };
  if (vectorized) pick(std::integral_constant<int, V>{});
  else pick(std::integral_constant<int, 1>{});
}

}  // namespace

void rms_norm_forward(const void* x, const float* weight, void* y, float* rstd, int64_t rows,
                      int64_t d, float eps, DType dt, cudaStream_t s) {
  check_shape("rms_norm_forward", rows, d);
  if (rows == 0) return;
  MT_CHECK(x != nullptr && weight != nullptr && y != nullptr && rstd != nullptr,
           "rms_norm_forward: null pointer");
  switch (dt) {
    case DType::f32: return forward_as<float>(x, weight, y, rstd, rows, int(d), eps, s);
    case DType::bf16: return forward_as<__nv_bfloat16>(x, weight, y, rstd, rows, int(d), eps, s);
    case DType::f16: return forward_as<__half>(x, weight, y, rstd, rows, int(d), eps, s);
    default:
      MT_THROW("rms_norm_forward: dtype ", dtype_name(dt),
               " is not supported on CUDA (f32, bf16, f16)");
  }
}

// dx '=' in dt; dweight[:] '+=' in fp32 (fixed-order column reduce, or atomicAdd): see the top.
void rms_norm_backward(const void* x, const float* weight, const float* rstd, const void* dy,
                       void* dx, float* dweight, int64_t rows, int64_t d, DType dt,
                       bool deterministic, cudaStream_t s) {
  check_shape("rms_norm_backward", rows, d);
  if (rows == 0 || (dx == nullptr && dweight == nullptr)) return;
  MT_CHECK(x != nullptr && weight != nullptr && rstd != nullptr && dy != nullptr,
           "rms_norm_backward: null pointer");
  const int di = int(d);
  switch (dt) {
    case DType::f32:
      return backward_as<float>(x, weight, rstd, dy, dx, dweight, rows, di, deterministic, s);
    case DType::bf16:
      return backward_as<__nv_bfloat16>(x, weight, rstd, dy, dx, dweight, rows, di,
                                        deterministic, s);
    case DType::f16:
      return backward_as<__half>(x, weight, rstd, dy, dx, dweight, rows, di, deterministic, s);
    default:
      MT_THROW("rms_norm_backward: dtype ", dtype_name(dt),
               " is not supported on CUDA (f32, bf16, f16)");
  }
}

void set_rms_norm_variant(const RmsNormVariant& v) {
  MT_CHECK(v.forward_rows >= 0 && v.forward_rows <= 2, "set_rms_norm_variant: forward_rows must "
           "be 0 (the default), 1 or 2, got ", v.forward_rows);
  MT_CHECK(v.dweight_in_shared >= -1 && v.dweight_in_shared <= 1, "set_rms_norm_variant: "
           "dweight_in_shared must be -1 (the default), 0 or 1, got ", v.dweight_in_shared);
  g_forward_rows = v.forward_rows;
  g_dweight_in_shared = v.dweight_in_shared;
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for rms_norm on CUDA ---------------------------------
// (The Function and the math are in rms_norm.cpp / rms_norm.h.)
namespace mt {
namespace {

void rms_norm_forward_cuda(const Tensor& x, const Tensor& weight, double eps, const Tensor& y,
                           const Tensor& rstd) {
  const int64_t d = weight.numel();
  MT_CHECK(d <= cuda::kRmsNormMaxD, "rms_norm: CUDA rows are at most ", cuda::kRmsNormMaxD,
           " wide, got ", d);
  cuda::rms_norm_forward(x.data_ptr(), cuda::ptr<const float>(weight), y.data_ptr(),
                         cuda::ptr<float>(rstd), x.numel() / d, d, float(eps), x.dtype(),
                         cuda::stream_of(x));
}

// dx '=' in x's dtype; dweight is the weight's fp32 .grad (the sink) or fresh zeros: the column
// reduce adds into it ('+=').
void rms_norm_backward_cuda(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                            const Tensor& dy, const Tensor& dx, const Tensor& dweight) {
  const int64_t d = weight.numel();
  cuda::rms_norm_backward(x.data_ptr(), cuda::ptr<const float>(weight), cuda::ptr<const float>(rstd),
                          dy.data_ptr(), cuda::ptr(dx), cuda::ptr<float>(dweight), x.numel() / d, d,
                          x.dtype(), deterministic(), cuda::stream_of(x));
}

}  // namespace

MT_REGISTER_KERNEL(rms_norm, Forward, CUDA, rms_norm_forward_cuda);
MT_REGISTER_KERNEL(rms_norm, Backward, CUDA, rms_norm_backward_cuda);

}  // namespace mt
