// Embedding on the GPU: a gather forward and a sorted, segmented, fixed-order scatter-add
// backward. The math and the grids are in embedding.h.
//
// Bytes. forward: the n·C output written once and the same number read from W (rows that repeat
// hit L2), plus the ids; floor 2·n·C·sizeof(dt) at copy bandwidth. backward: dy read once, and
// each touched row of dW read and written once in fp32; the sort moves 16 bytes a position per
// radix pass (keys of ceil(log2(V + 1)) bits, 8 bits a pass: 2 passes for V = 50304).
#include "ops/embedding/embedding_cuda.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <new>

#include <cub/device/device_radix_sort.cuh>

#include "core/cuda/check.h"
#include "core/cuda/glue.h"
#include "core/cuda/map.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/vec.cuh"
#include "core/registry.h"
#include "ops/embedding/embedding.h"

namespace mt::cuda {
namespace {

constexpr int kCheckThreads = 1024;

// One block: the lowest position whose id is outside [0, V), into *bad unless one is waiting.
__global__ void __launch_bounds__(kCheckThreads)
    check_ids_kernel(const int64_t* __restrict__ ids, int64_t n, int64_t V, BadIdRecord* bad) {
  __shared__ unsigned long long first_bad;  // the lowest: the same report on every run
  if (threadIdx.x == 0) first_bad = ~0ull;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n; p += kCheckThreads) {
    const int64_t id = ids[p];
    if (id < 0 || id >= V) atomicMin(&first_bad, (unsigned long long)p);
  }
  __syncthreads();
  if (threadIdx.x == 0 && first_bad != ~0ull && bad->position < 0) {
    const int64_t p = int64_t(first_bad);
    bad->id = ids[p];
    bad->rows = V;
    bad->position = p;
    __threadfence_system();  // the record is host memory: make it visible past the GPU
  }
}

// Thread t copies packs t, t + stride, ... of y, pack q of position q / (C / V).
template <class T, int V>
__global__ void gather_kernel(const int64_t* __restrict__ ids, const T* __restrict__ W,
                              T* __restrict__ y, int64_t n, int64_t rows, int64_t C) {
  using P = Pack<T, V>;
  const int64_t per_row = C / V;
  const int64_t total = n * per_row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t p = i / per_row, q = i % per_row;
    const int64_t id = ids[p];
    P out;
    if (id >= 0 && id < rows) {
      out = reinterpret_cast<const P*>(W + id * C)[q];
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = convert<T>(NAN);  // a row that is no row
    }
    reinterpret_cast<P*>(y)[i] = out;
  }
}

// keys[p] = ids[p] (V for a bad id: it sorts last and is skipped), values[p] = p.
__global__ void make_pairs_kernel(const int64_t* __restrict__ ids, uint32_t* __restrict__ keys,
                                  uint32_t* __restrict__ positions, int64_t n, int64_t V) {
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < n;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = ids[p];
    keys[p] = uint32_t(id >= 0 && id < V ? id : V);
    positions[p] = uint32_t(p);
  }
}

// ---- the backward's sums ----------------------------------------------------------------------
//
// The sorted pairs are cut into chunks of kChunk = 32 (one key a lane). A warp sums one chunk for
// one slab of columns (32 lanes × V: 256 columns in bf16), entry by entry in sorted order, and
// flushes a run's sum when the key changes:
//   a run inside the chunk         dW[key] += sum, by this warp alone (no other chunk has the key)
//   the chunk's first run, begun   head[chunk] = sum (scratch)
//   in an earlier chunk
//   the chunk's last run, going    tail[chunk] = sum (scratch); this chunk is the run's owner
//   on in the next chunk
// Then one block of kCombineWarps warps per kCombineWarps chunks finds the owners among them and,
// for each, adds tail[owner] and head[owner + 1 ..] of the chunks the run covers, in a fixed order
// (warp w takes chunks owner + 1 + w, + kCombineWarps, ...; the warps' totals in warp order), into
// dW[key]. Every element of dW is written by one thread, in an order that depends only on the ids:
// the same bits on every run, with no float atomics. A token that fills the whole batch is summed
// by n / 32 warps at once, and its partials by all warps of one block.
constexpr int kChunk = 32;
constexpr int kSumWarps = 4;       // chunks (warps) per block of the chunk sum
constexpr int kUnroll = 8;         // dy rows loaded at once by a warp
constexpr int kCombineWarps = 8;   // chunks per block of the combine, and warps per run
constexpr uint32_t kNoKey = 0xffffffffu;  // beyond the pairs: never equal to a key (≤ V < 2^32 − 1)

template <int V>
__device__ __forceinline__ void load_f32(const float* p, float (&a)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int h = 0; h < V / 4; ++h) {
      const float4 f = reinterpret_cast<const float4*>(p)[h];
      a[4 * h] = f.x, a[4 * h + 1] = f.y, a[4 * h + 2] = f.z, a[4 * h + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = p[k];
  }
}

template <int V>
__device__ __forceinline__ void store_f32(float* p, const float (&a)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int h = 0; h < V / 4; ++h)
      reinterpret_cast<float4*>(p)[h] = make_float4(a[4 * h], a[4 * h + 1], a[4 * h + 2], a[4 * h + 3]);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) p[k] = a[k];
  }
}

// p[k] += a[k]: dW may hold earlier gradients.
template <int V>
__device__ __forceinline__ void add_f32(float* p, const float (&a)[V]) {
  float old[V];
  load_f32<V>(p, old);
#pragma unroll
  for (int k = 0; k < V; ++k) old[k] += a[k];
  store_f32<V>(p, old);
}

// Warp (blockIdx.x · kSumWarps + threadIdx.y) sums chunk `chunk` for the columns of slab
// blockIdx.y, V a lane (see above).
template <class T, int V>
__global__ void __launch_bounds__(32 * kSumWarps)
    chunk_sum_kernel(const uint32_t* __restrict__ keys, const uint32_t* __restrict__ positions,
                     const T* __restrict__ dy, float* __restrict__ dW, float* __restrict__ head,
                     float* __restrict__ tail, int64_t n, int64_t V_rows, int64_t C) {
  const int64_t chunk = int64_t(blockIdx.x) * kSumWarps + threadIdx.y;
  const int64_t first = chunk * kChunk;
  if (first >= n) return;  // a whole warp
  const int lane = threadIdx.x;
  const int count = n - first < kChunk ? int(n - first) : kChunk;
  const uint32_t my_key = lane < count ? keys[first + lane] : kNoKey;
  const uint32_t my_pos = lane < count ? positions[first + lane] : 0;
  const uint32_t before = chunk > 0 ? keys[first - 1] : kNoKey;                  // run entering
  const uint32_t after = first + kChunk < n ? keys[first + kChunk] : kNoKey;    // run leaving
  const int64_t col = (int64_t(blockIdx.y) * 32 + lane) * V;
  const bool active = col < C;

  float acc[V];
  uint32_t key = __shfl_sync(0xffffffffu, my_key, 0);
  int start = 0;  // the entry that began the current run
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.0f;
  // The current run's sum goes to dW, head or tail (the cases above); bad ids (key V) are skipped.
  auto flush = [&](int end) {
    if (key >= V_rows || !active) return;
    if (start == 0 && before == key) store_f32<V>(head + chunk * C + col, acc);
    else if (end == kChunk && after == key) store_f32<V>(tail + chunk * C + col, acc);
    else add_f32<V>(dW + int64_t(key) * C + col, acc);
  };
  for (int e0 = 0; e0 < count; e0 += kUnroll) {
    Pack<T, V> g[kUnroll];
    uint32_t k_e[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      k_e[u] = __shfl_sync(0xffffffffu, my_key, e0 + u);
      const uint32_t p = __shfl_sync(0xffffffffu, my_pos, e0 + u);
      if (e0 + u < count && k_e[u] < V_rows && active)
        g[u] = *reinterpret_cast<const Pack<T, V>*>(dy + int64_t(p) * C + col);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int e = e0 + u;
      if (e >= count) break;
      if (k_e[u] != key) {  // the same for the whole warp: the keys are broadcast
        flush(e);
        key = k_e[u];
        start = e;
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = 0.0f;
      }
      if (key < V_rows && active)
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += to_float(g[u].v[k]);  // in sorted order
    }
  }
  flush(count);
}

// Block b looks at chunks b · kCombineWarps + w (w a warp) for the slab blockIdx.y. A chunk owns
// the run it ends with when that run goes on in the next chunk and did not come from the
// previous one. For each owner, in chunk order, all warps add the heads of the chunks the run
// covers (warp w: chunks owner + 1 + w, + kCombineWarps, ..., kUnroll at a time), then thread
// (lane) adds tail[owner] and the warps' totals in warp order into dW[key].
template <int V>
__global__ void __launch_bounds__(32 * kCombineWarps)
    combine_kernel(const uint32_t* __restrict__ keys, float* __restrict__ dW,
                   const float* __restrict__ head, const float* __restrict__ tail, int64_t n,
                   int64_t V_rows, int64_t C) {
  __shared__ uint32_t owner_key[kCombineWarps];
  __shared__ float totals[kCombineWarps][32 * V];
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  {
    const int64_t c = int64_t(blockIdx.x) * kCombineWarps + warp;
    uint32_t owns = kNoKey;
    if (lane == 0 && c < chunks && (c + 1) * kChunk < n) {
      const uint32_t last = keys[(c + 1) * kChunk - 1];
      if (last < V_rows && keys[(c + 1) * kChunk] == last && (c == 0 || keys[c * kChunk - 1] != last))
        owns = last;
    }
    if (lane == 0) owner_key[warp] = owns;
  }
  __syncthreads();
  const int64_t col = (int64_t(blockIdx.y) * 32 + lane) * V;
  const bool active = col < C;
  for (int o = 0; o < kCombineWarps; ++o) {
    const uint32_t key = owner_key[o];
    if (key == kNoKey) continue;  // the same for the whole block
    const int64_t owner = int64_t(blockIdx.x) * kCombineWarps + o;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.0f;
    // The run covers chunks owner + 1, ... as long as they start with its key (sorted keys).
    bool more = true;
    for (int64_t c0 = owner + 1 + warp; more; c0 += int64_t(kCombineWarps) * kUnroll) {
      float h[kUnroll][V];
      bool in_run[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + int64_t(u) * kCombineWarps;
        in_run[u] = c < chunks && keys[c * kChunk] == key;
        if (in_run[u] && active) load_f32<V>(head + c * C + col, h[u]);  // only the run's heads
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (in_run[u] && active)
#pragma unroll
          for (int k = 0; k < V; ++k) acc[k] += h[u][k];
      more = in_run[kUnroll - 1];
    }
#pragma unroll
    for (int k = 0; k < V; ++k) totals[warp][lane * V + k] = acc[k];
    __syncthreads();
    if (warp == 0 && active) {
      float total[V];
      load_f32<V>(tail + owner * C + col, total);
      for (int w = 0; w < kCombineWarps; ++w)
#pragma unroll
        for (int k = 0; k < V; ++k) total[k] += totals[w][lane * V + k];
      add_f32<V>(dW + int64_t(key) * C + col, total);
    }
    __syncthreads();  // totals is reused by the next owner
  }
}

int bits_for(int64_t v) {
  int b = 1;
  while ((int64_t(1) << b) <= v) ++b;
  return b;
}

}  // namespace

void embedding_forward(const int64_t* ids, const void* W, void* y, BadIdRecord* bad, int64_t n,
                       int64_t V, int64_t C, DType dt, cudaStream_t s) {
  MT_CHECK(n >= 0 && V >= 0 && C >= 0, "embedding_forward: bad sizes n ", n, ", V ", V, ", C ", C);
  if (n == 0 || C == 0) return;
  MT_CHECK(ids != nullptr && y != nullptr && (W != nullptr || V == 0),
           "embedding_forward: null pointer");
  if (bad != nullptr) {
    check_ids_kernel<<<1, kCheckThreads, 0, s>>>(ids, n, V, bad);
    MT_CUDA_CHECK_LAUNCH();
  }
  dispatch_float</*kWithF64=*/false>(dt, "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = 16 / sizeof(T);
    const T* wt = static_cast<const T*>(W);
    T* yt = static_cast<T*>(y);
    if (C % kV == 0 && aligned(W, 16) && aligned(y, 16))
      gather_kernel<T, kV><<<map_blocks(n * C / kV), kMapThreads, 0, s>>>(ids, wt, yt, n, V, C);
    else
      gather_kernel<T, 1><<<map_blocks(n * C), kMapThreads, 0, s>>>(ids, wt, yt, n, V, C);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void embedding_backward(const int64_t* ids, const void* dy, float* dW, int64_t n, int64_t V,
                        int64_t C, DType dt, cudaStream_t s) {
  MT_CHECK(n >= 0 && V >= 0 && C >= 0, "embedding_backward: bad sizes n ", n, ", V ", V, ", C ",
           C);
  if (n == 0 || C == 0 || V == 0) return;
  MT_CHECK(ids != nullptr && dy != nullptr && dW != nullptr, "embedding_backward: null pointer");
  MT_CHECK(n < (int64_t(1) << 32) && V < (int64_t(1) << 32) - 1, "embedding_backward: ", n,
           " positions or ", V, " rows do not fit the sort's 32-bit keys and values");
  const int device = current_device();
  // Scratch: the pairs before and after the sort, and cub's own. Its size depends on n alone
  // (asked of cub without launching anything), so no host round trip: capturable.
  const int end_bit = bits_for(V);  // keys in [0, V]
  size_t sort_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, (const uint32_t*)nullptr,
                                                (uint32_t*)nullptr, (const uint32_t*)nullptr,
                                                (uint32_t*)nullptr, n, 0, end_bit, s));
  const size_t pair_bytes = (size_t(n) * sizeof(uint32_t) + 255) / 256 * 256;
  char* scratch = static_cast<char*>(alloc_on(s, 4 * pair_bytes + sort_bytes, device));
  auto* keys_in = reinterpret_cast<uint32_t*>(scratch);
  auto* pos_in = reinterpret_cast<uint32_t*>(scratch + pair_bytes);
  auto* keys = reinterpret_cast<uint32_t*>(scratch + 2 * pair_bytes);
  auto* pos = reinterpret_cast<uint32_t*>(scratch + 3 * pair_bytes);
  void* sort_temp = scratch + 4 * pair_bytes;

  make_pairs_kernel<<<map_blocks(n), kMapThreads, 0, s>>>(ids, keys_in, pos_in, n, V);
  MT_CUDA_CHECK_LAUNCH();
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, keys_in, keys, pos_in, pos,
                                                n, 0, end_bit, s));
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  float* head = static_cast<float*>(alloc_on(s, 2 * size_t(chunks) * C * sizeof(float), device));
  float* tail = head + chunks * C;
  dispatch_float</*kWithF64=*/false>(dt, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = 16 / sizeof(T);
    const T* g = static_cast<const T*>(dy);
    const bool vec = C % kV == 0 && aligned(dy, 16) && aligned(dW, 16);
    const int64_t slabs = vec ? (C / kV + 31) / 32 : (C + 31) / 32;
    MT_CHECK(slabs <= 65535, "embedding_backward: ", C, " columns are more than one launch takes");
    const dim3 sum_grid(unsigned((chunks + kSumWarps - 1) / kSumWarps), unsigned(slabs));
    const dim3 combine_grid(unsigned((chunks + kCombineWarps - 1) / kCombineWarps), unsigned(slabs));
    if (vec) {
      chunk_sum_kernel<T, kV><<<sum_grid, dim3(32, kSumWarps), 0, s>>>(keys, pos, g, dW, head,
                                                                       tail, n, V, C);
      MT_CUDA_CHECK_LAUNCH();
      combine_kernel<kV><<<combine_grid, dim3(32, kCombineWarps), 0, s>>>(keys, dW, head, tail, n,
                                                                          V, C);
    } else {
      chunk_sum_kernel<T, 1><<<sum_grid, dim3(32, kSumWarps), 0, s>>>(keys, pos, g, dW, head,
                                                                      tail, n, V, C);
      MT_CUDA_CHECK_LAUNCH();
      combine_kernel<1><<<combine_grid, dim3(32, kCombineWarps), 0, s>>>(keys, dW, head, tail, n,
                                                                         V, C);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
  free_on(s, head);
  free_on(s, scratch);  // stream-ordered: both released after the sums have run
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for embedding on CUDA --------------------------------
namespace mt {
namespace {

// The bad-id record of each device, as cross_entropy keeps its bad-target record
// (cross_entropy.cu): page-locked host memory mapped into the device's address space, allocated
// at first use (before any capture: the eager first step) and kept for the process. The kernel
// writes it only when an id is bad; the check registered below reads it after every host
// synchronization with the device and raises it as the CPU's mt::Error.
constexpr int kMaxDevices = 64;
std::atomic<cuda::BadIdRecord*> records[kMaxDevices];  // the host's address
cuda::BadIdRecord* device_records[kMaxDevices];         // the same memory, as kernels address it
std::once_flag record_once[kMaxDevices];

cuda::BadIdRecord* bad_id_record(int device) {
  MT_CHECK(device >= 0 && device < kMaxDevices, "embedding: device ", device, " out of range");
  std::call_once(record_once[device], [&] {
    void* p = nullptr;
    MT_CUDA_CHECK(cudaHostAlloc(&p, sizeof(cuda::BadIdRecord),
                                cudaHostAllocMapped | cudaHostAllocPortable));
    void* d = nullptr;
    MT_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
    device_records[device] = static_cast<cuda::BadIdRecord*>(d);
    records[device] = new (p) cuda::BadIdRecord();
  });
  return device_records[device];
}

const bool registered = [] {
  cuda::add_device_error_check([](int device) {
    if (device < 0 || device >= kMaxDevices) return;
    cuda::BadIdRecord* r = records[device].load();
    if (r == nullptr || r->position < 0) return;
    const cuda::BadIdRecord bad = *r;
    r->position = -1;  // reported once: the next check starts clean
    MT_THROW(bad_id_message(bad.position, bad.id, bad.rows));
  });
  return true;
}();

void embedding_forward_cuda(const Tensor& ids, const Tensor& W, const Tensor& y) {
  cudaStream_t s = cuda::stream_of(W);
  cuda::embedding_forward(cuda::ptr<const int64_t>(ids), W.data_ptr(), y.data_ptr(),
                          bad_id_record(W.device().index), ids.numel(), W.size(0), W.size(1),
                          W.dtype(), s);
}

// dW is W's fp32 .grad (the sink) or fresh zeros: the segmented sum adds into it ('+=').
void embedding_backward_cuda(const Tensor& ids, const Tensor& dy, const Tensor& dW) {
  cuda::embedding_backward(cuda::ptr<const int64_t>(ids), dy.data_ptr(), cuda::ptr<float>(dW),
                           ids.numel(), dW.size(0), dW.size(1), dy.dtype(), cuda::stream_of(dy));
}

}  // namespace

MT_REGISTER_KERNEL(embedding, Forward, CUDA, embedding_forward_cuda);
MT_REGISTER_KERNEL(embedding, Backward, CUDA, embedding_backward_cuda);

}  // namespace mt
