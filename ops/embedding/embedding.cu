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

constexpr int kSegWarps = 4;  // warps (sorted pairs) per block of the segmented sum
constexpr int kUnroll = 8;    // positions of a run loaded at once

// Warp (blockIdx.x * kSegWarps + threadIdx.y) looks at sorted pair j; blockIdx.y picks 32 packs
// of columns. Only the warp whose pair starts a run of equal ids works: it sums dy over the run,
// in sorted order (increasing position: the sort is stable), and adds the total to dW's row.
// Each (row, column) of dW is written by exactly one thread: no atomics, a fixed order.
template <class T, int V>
__global__ void __launch_bounds__(32 * kSegWarps)
    segment_sum_kernel(const uint32_t* __restrict__ keys, const uint32_t* __restrict__ positions,
                       const T* __restrict__ dy, float* __restrict__ dW, int64_t n, int64_t V_rows,
                       int64_t C) {
  const int64_t j = int64_t(blockIdx.x) * kSegWarps + threadIdx.y;
  if (j >= n) return;
  const uint32_t key = keys[j];
  if (key >= V_rows || (j > 0 && keys[j - 1] == key)) return;  // skipped, or not a run's start
  const int64_t col = (int64_t(blockIdx.y) * 32 + threadIdx.x) * V;
  if (col >= C) return;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.0f;
  // kUnroll pairs a step: their keys, positions and dy packs are each loaded together, so a long
  // run (a frequent token) waits for memory once per kUnroll positions, not once per position.
  // The keys are sorted, so the run ends at the first key that differs.
  for (int64_t r = j;; r += kUnroll) {
    bool in_run[kUnroll];
    Pack<T, V> g[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) in_run[u] = r + u < n && keys[r + u] == key;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (in_run[u])
        g[u] = *reinterpret_cast<const Pack<T, V>*>(dy + int64_t(positions[r + u]) * C + col);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (in_run[u])
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += to_float(g[u].v[k]);  // in sorted order
    if (!in_run[kUnroll - 1]) break;
  }
  float* out = dW + int64_t(key) * C + col;
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] += acc[k];  // '+=': dW may hold earlier gradients
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
  dispatch_float</*kWithF64=*/false>(dt, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = 16 / sizeof(T);
    const T* g = static_cast<const T*>(dy);
    const unsigned blocks = unsigned((n + kSegWarps - 1) / kSegWarps);
    const dim3 block(32, kSegWarps);
    if (C % kV == 0 && aligned(dy, 16)) {
      const dim3 grid(blocks, unsigned((C / kV + 31) / 32));
      segment_sum_kernel<T, kV><<<grid, block, 0, s>>>(keys, pos, g, dW, n, V, C);
    } else {
      const dim3 grid(blocks, unsigned((C + 31) / 32));
      segment_sum_kernel<T, 1><<<grid, block, 0, s>>>(keys, pos, g, dW, n, V, C);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
  free_on(s, scratch);  // stream-ordered: released after the sum has run
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
