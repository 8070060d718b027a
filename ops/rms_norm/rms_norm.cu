// RMSNorm on the GPU, x viewed as [rows, d], weight w an fp32 vector [d].
//
// Math:
//   forward    rstd_r = 1 / sqrt(mean_j x_rj^2 + eps)
//              y_rj   = x_rj rstd_r w_j
//   backward   xhat = x rstd,  g = dy w,  c_r = mean_j g_rj xhat_rj
//              dx_rj  = rstd_r (g_rj - xhat_rj c_r)
//              dw_j  += sum_r dy_rj xhat_rj
//   rstd depends on the whole row (d rstd / d x_j = -rstd^3 x_j / d), which is where the
//   row-wide correction c comes from.
//
// Saved vs recomputed: the forward saves rstd, one fp32 per row (4 bytes against the row's 2d
// bytes in bf16), so the backward needs no extra pass over x before it can start. xhat and g
// are recomputed from x and dy, which the backward reads anyway.
//
// Grids. A row belongs to a team of threads that holds it in registers, kElems = 16 elements per
// thread (two 16-byte packs in bf16/f16, four in f32, 16 scalars on the scalar path), so each
// row is read from memory once even though it is used twice (reduce, then scale).
//   d <= 512   the team is one warp: its reductions are shuffles, no barrier. Blocks of 256
//              threads work on 8 rows at a time.
//   d >  512   the team is the whole block: ceil(d / 16) threads, rounded up to whole warps,
//              at most 1024, hence d <= kRmsNormMaxD = 16384.
// Blocks stride over the rows (block b takes row groups b, b + grid, ...) and the grid is one
// wave: as many blocks as the occupancy calculator fits on the SMs at once. The backward uses the
// same teams and the same rows-to-blocks mapping as the forward. Loads and stores are 16-byte
// packs when d is a multiple of the pack width and x, y (dy, dx) and weight are 16-byte aligned
// (then every row is); otherwise the same kernels run with one element per access.
//
// Accumulation:
//   forward    y = (dt, rounded from fp32), rstd = (fp32)
//   backward   dx = (dt; skipped when null), in the same pass that accumulates dweight. A thread
//              always owns the same columns, so it sums dy xhat of its rows in fp32 registers;
//              at the end each team writes its sums to its own row of shared memory and the
//              block adds its teams' rows in team order. deterministic: partials[block, :] =
//              that (fp32), then a column reduce sums partials[0..blocks) in a fixed order and
//              does dweight[:] += (fp32). Otherwise atomicAdd(dweight[j], the block's value),
//              whose rounding depends on the blocks' arrival order.
//   Every sum is fp32 in a fixed order (per thread, shuffle tree, teams, blocks), and the grid
//   depends only on the GPU model: the same inputs give the same bits on every run.
#include "ops/rms_norm/rms_norm_cuda.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

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
constexpr int kWarpTeamBlock = 256;  // block size when the team is a warp: 8 rows at a time
constexpr int kMaxBlock = 1024;
constexpr int kSmallBlock = 256;     // backward blocks up to this size get a register-rich build
constexpr int kReduceCols = 32;      // column reduce: 32 columns (one warp wide) per block,
constexpr int kReduceSlices = 32;    // and 32 slices of the partial rows summed side by side
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

// dst[0 .. V) = v in shared memory, 16 bytes at a time when V allows.
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

// Sum of v over the calling thread's team, returned to every thread of the team, in a fixed
// order. A warp team needs only the shuffle butterfly; a block team then goes through shared
// memory, where every thread adds the warp totals in warp order. The second barrier lets the
// next row reuse the scratch.
__device__ float team_sum(float v, int team_size) {
  v = warp_sum(v);
  if (team_size == 32) return v;
  __shared__ float warp_totals[kMaxBlock / 32];
  if (threadIdx.x % 32 == 0) warp_totals[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < team_size / 32; ++i) total += warp_totals[i];
  __syncthreads();
  return total;
}

// Thread `lane` of a team owns packs lane, lane + team_size, ... of each of its rows (coalesced:
// a warp reads 512 contiguous bytes per pack). All of its kElems / V packs are loaded before any
// is used, so a thread has that many 16-byte loads in flight per input.
template <class T, int V>
__global__ void __launch_bounds__(kMaxBlock)
    forward_kernel(const T* __restrict__ x, const float* __restrict__ weight, T* __restrict__ y,
                   float* __restrict__ rstd, int64_t rows, int d, float eps, int team_size) {
  using P = Pack<T, V>;
  constexpr int kPacks = kElems / V;
  const int teams = blockDim.x / team_size;
  const int team = threadIdx.x / team_size, lane = threadIdx.x % team_size;
  const int packs = d / V;

  for (int64_t first = int64_t(blockIdx.x) * teams; first < rows;
       first += int64_t(gridDim.x) * teams) {
    const int64_t row = first + team;
    const bool live = row < rows;  // false only for warp teams past the last row
    const P* xr = reinterpret_cast<const P*>(x + row * d);
    P xv[kPacks];
#pragma unroll
    for (int p = 0; p < kPacks; ++p)
      if (live && lane + p * team_size < packs) xv[p] = xr[lane + p * team_size];

    float sum_sq = 0.0f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (!live || lane + p * team_size >= packs) break;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float v = to_float(xv[p].v[k]);
        sum_sq += v * v;
      }
    }
    const float r = 1.0f / sqrtf(team_sum(sum_sq, team_size) / float(d) + eps);
    if (!live) continue;
    if (lane == 0) rstd[row] = r;

    P* yr = reinterpret_cast<P*>(y + row * d);
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int q = lane + p * team_size;
      if (q >= packs) break;
      float w[V];
      load_weight<V>(weight, q * V, w);
      P out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(to_float(xv[p].v[k]) * r * w[k]);
      yr[q] = out;
    }
  }
}

// dx for each row with the forward's teams and mapping, and this block's share of dweight:
// written to partials[blockIdx.x, :], or atomically added to dweight_atomic (at most one of the
// two is non-null; both null when the caller does not want dweight). Dynamic shared memory:
// teams * d floats when dweight is wanted.
//
// kMaxThreads is the launch bound. A thread holds 16 elements of x, 16 of dy and 16 fp32 sums of
// dweight, about 80 registers: blocks of at most kSmallBlock threads (rows up to 4096) may have
// them; larger blocks cap a thread at 64 and the compiler spills a few bytes, a cost only rows
// longer than 4096 pay.
template <class T, int V, int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads)
    backward_kernel(const T* __restrict__ x, const float* __restrict__ weight,
                    const float* __restrict__ rstd, const T* __restrict__ dy, T* __restrict__ dx,
                    float* __restrict__ partials, float* dweight_atomic, int64_t rows, int d,
                    int team_size) {
  using P = Pack<T, V>;
  constexpr int kPacks = kElems / V;
  const int teams = blockDim.x / team_size;
  const int team = threadIdx.x / team_size, lane = threadIdx.x % team_size;
  const int packs = d / V;
  float dw_sum[kPacks][V] = {};  // this thread's columns of sum_r dy xhat

  for (int64_t first = int64_t(blockIdx.x) * teams; first < rows;
       first += int64_t(gridDim.x) * teams) {
    const int64_t row = first + team;
    const bool live = row < rows;
    const P* xr = reinterpret_cast<const P*>(x + row * d);
    const P* gr = reinterpret_cast<const P*>(dy + row * d);
    P xv[kPacks], gv[kPacks];
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      if (live && lane + p * team_size < packs) {
        xv[p] = xr[lane + p * team_size];
        gv[p] = gr[lane + p * team_size];
      }
    }
    const float r = live ? rstd[row] : 0.0f;

    float dot = 0.0f;  // this thread's share of sum_j g_j xhat_j
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int q = lane + p * team_size;
      if (!live || q >= packs) break;
      float w[V];
      load_weight<V>(weight, q * V, w);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = to_float(xv[p].v[k]) * r, dyv = to_float(gv[p].v[k]);  // x̂_j = x_j·rstd
        dot += dyv * w[k] * xhat;    // g_j·x̂_j, with g_j = dy_j·weight_j = dL/dx̂_j
        dw_sum[p][k] += dyv * xhat;  // dw_j += dy_j·x̂_j (this row's term of Σ_r)
      }
    }
    const float c = team_sum(dot, team_size) / float(d);  // c = mean_j g_j·x̂_j: rstd's share
    if (!live || dx == nullptr) continue;

    P* dxr = reinterpret_cast<P*>(dx + row * d);
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
        out.v[k] = from_float<T>(r * (g - xhat * c));  // dx_j = rstd·(g_j − x̂_j·c): direct − via rstd
      }
      dxr[q] = out;
    }
  }

  if (partials == nullptr && dweight_atomic == nullptr) return;  // the same for the whole grid
  extern __shared__ float4 shared[];  // float4: 16-byte aligned, for store_to
  float* dw_rows = reinterpret_cast<float*>(shared);  // [teams][d]
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int q = lane + p * team_size;
    if (q < packs) store_to<V>(dw_rows + team * d + q * V, dw_sum[p]);
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
  const int threads = int(ceil_div(d, kElems));
  if (threads <= 32) return {32, kWarpTeamBlock};
  const int block = int(ceil_div(threads, 32)) * 32;
  return {block, block};
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

template <class T>
void forward_as(const void* x, const float* weight, void* y, float* rstd, int64_t rows, int d,
                float eps, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const Layout L = layout_for(d);
  const T* xt = static_cast<const T*>(x);
  T* yt = static_cast<T*>(y);
  auto launch = [&](auto kernel) {
    const int grid = one_wave(kernel, L.block, 0, ceil_div(rows, L.teams()));
    kernel<<<grid, L.block, 0, s>>>(xt, weight, yt, rstd, rows, d, eps, L.team_size);
    MT_CUDA_CHECK_LAUNCH();
  };
  if (d % V == 0 && aligned16(x) && aligned16(y) && aligned16(weight))
    launch(forward_kernel<T, V>);
  else
    launch(forward_kernel<T, 1>);
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
  const bool small = L.block <= kSmallBlock;
  if (vectorized)
    small ? launch(backward_kernel<T, V, kSmallBlock>) : launch(backward_kernel<T, V, kMaxBlock>);
  else
    small ? launch(backward_kernel<T, 1, kSmallBlock>) : launch(backward_kernel<T, 1, kMaxBlock>);
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
