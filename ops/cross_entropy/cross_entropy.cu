// Cross-entropy (fused log-softmax + NLL) CUDA kernels. The math and the save/recompute choice
// are in cross_entropy_cuda.h.
//
// Forward, two launches:
//   1. lse_kernel, one block per row (256 threads, or one warp when C < 1024). Each thread runs
//      an online max / sum over its columns in fp32 (m = running max, s = sum of exp(x - m),
//      each exp one ex2, rescaled when m grows, once per 16-byte pack; two packs loaded at a
//      time), so the row is read once; the block merges the (m, s) pairs and thread 0 stores
//      lse[r] = m + log(s) ('='). Ignored rows store 0 and read nothing.
//   2. loss_kernel, one block of 1024 threads: thread i adds lse[r] - logits[r, t_r] over rows
//      r = i, i + 1024, ...; the block sums the threads in a fixed tree; loss[0] = total /
//      normalizer ('='). One gathered logit per row, no scratch, the same bits on every run.
// Bytes: rows * C * sizeof(dt) read once (+ 4 B of lse and 8 B of target per row); FLOPs are one
// exp per logit. Floor: the logits read at copy bandwidth.
//
// Backward, one launch: backward_kernel, one block per row, recomputes softmax = exp(x - lse[r])
// and stores dlogits ('=', rounded once to dt) = dloss / normalizer * (softmax - [c == t_r]).
// Bytes: the logits read once, dlogits written once. Floor: 2 * rows * C * sizeof(dt) at copy
// bandwidth.
//
// Both row kernels move 16-byte packs when every row starts 16-byte aligned (aligned base and
// C * sizeof(dt) a multiple of 16, so a row is whole packs), else single elements (V = 1).
//
// A padded row (valid < C columns are classes): the padding is read with its pack, as −inf in
// the forward (it adds nothing to the sum) and written as 0 in the backward, so the packs stay
// whole: 50257 of 50304 columns cost the same passes as 50304.
#include "ops/cross_entropy/cross_entropy_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <new>

#include "core/cuda/check.h"
#include "core/cuda/fast_exp.cuh"
#include "core/cuda/glue.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/vec.cuh"
#include "core/registry.h"
#include "ops/cross_entropy/cross_entropy.h"

namespace mt::cuda {
namespace {

// The forward's exponentials are one ex2 on the special-function unit each (fast_exp.cuh):
// exp(x − m) = 2^((x − m)·log2 e), where expf cost about eight instructions a logit. The
// difference is taken before the scaling, so its rounding stays relative to x − m however large
// |m| is (scaling x and m apart and subtracting would leave half an ulp of |m|·log2 e in every
// exponent: at |m| = 1e10 that is more than the whole range of a float's exponent). Results
// below 2^-126 flush to zero: such a term is below the rounding of s, which holds the largest
// term, 1.
__device__ __forceinline__ float exp_of(float d) { return fast_exp2(d * kLog2e); }

// Adds a pack of V logits to the running (m, s), s = sum exp(x_i - m): the running max moves
// once, to the pack's max, and the V exponentials are then independent of each other (logit by
// logit, each update waited for the previous one's m and exp: a serial chain that held the
// forward at about half the copy rate). While m is ±inf (no finite logit yet, or an infinite
// one), x == m counts 1 without the subtraction, so -inf and +inf logits never form inf - inf:
// while m is -inf the 1s counted are later multiplied by exp(-inf - x) = 0, and an all -inf row
// gives lse = -inf. fmaxf skips a NaN, which still makes s NaN through its own exp.
template <int V>
__device__ __forceinline__ void online_add_pack(float& m, float& s, const float (&x)[V]) {
  float pm = x[0];
#pragma unroll
  for (int j = 1; j < V; ++j) pm = fmaxf(pm, x[j]);
  if (pm > m) {
    s *= exp_of(m - pm);
    m = pm;
  }
  if (isinf(m)) {
#pragma unroll
    for (int j = 0; j < V; ++j) s += x[j] == m ? 1.f : exp_of(x[j] - m);
    return;
  }
#pragma unroll
  for (int j = 0; j < V; ++j) s += exp_of(x[j] - m);
}

// Merges (m2, s2) into (m, s), with the same x == m care as online_add_pack.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  s = (m == mm ? s : s * exp_of(m - mm)) + (m2 == mm ? s2 : s2 * exp_of(m2 - mm));
  m = mm;
}

// Merges every thread's (m, s) in a fixed order; the result is valid in thread 0.
__device__ void block_merge(float& m, float& s) {
  for (int o = 16; o > 0; o >>= 1)
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if (blockDim.x == 32) return;
  __shared__ float wm[32], ws[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) wm[warp] = m, ws[warp] = s;
  __syncthreads();
  if (warp == 0) {
    const bool live = lane < int(blockDim.x >> 5);
    m = live ? wm[lane] : -INFINITY;
    s = live ? ws[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1)
      merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  }
}

// Pack i of the row in fp32; the padding past `valid` is -inf (only the row's last packs have
// any: the others skip the per-logit test).
template <class T, int V>
__device__ __forceinline__ void widen(const Pack<T, V>& p, int64_t i, int64_t valid, float (&x)[V]) {
  if ((i + 1) * V <= valid) {
#pragma unroll
    for (int j = 0; j < V; ++j) x[j] = to_float(p.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) x[j] = i * V + j < valid ? to_float(p.v[j]) : -INFINITY;
  }
}

// Two packs a thread are loaded before either is added (in the order one at a time would take),
// so each thread has two loads in flight, not one.
template <class T, int V>
__global__ void lse_kernel(const T* logits, const int64_t* targets, float* lse, int64_t C,
                           int64_t valid, int64_t ignore_index) {
  const int64_t r = blockIdx.x;
  if (targets[r] == ignore_index) {  // uniform across the block: no barrier is skipped unevenly
    if (threadIdx.x == 0) lse[r] = 0.f;
    return;
  }
  const auto* row = reinterpret_cast<const Pack<T, V>*>(logits + r * C);
  float m = -INFINITY, s = 0.f, x[V];
  const int64_t cv = C / V, step = blockDim.x;  // C is a multiple of V (above)
  int64_t i = threadIdx.x;
  for (; i + step < cv; i += 2 * step) {
    const Pack<T, V> a = row[i], b = row[i + step];
    widen<T, V>(a, i, valid, x);
    online_add_pack<V>(m, s, x);
    widen<T, V>(b, i + step, valid, x);
    online_add_pack<V>(m, s, x);
  }
  if (i < cv) {
    widen<T, V>(row[i], i, valid, x);
    online_add_pack<V>(m, s, x);
  }
  block_merge(m, s);
  if (threadIdx.x == 0) lse[r] = m + log2f(s) * kLn2;
}

constexpr int kLossThreads = 1024;

template <class T>
__global__ void loss_kernel(const T* logits, const int64_t* targets, const float* lse, float* loss,
                            BadTargetRecord* bad_target, int64_t rows, int64_t C, int64_t valid,
                            int64_t ignore_index, float normalizer) {
  __shared__ unsigned long long first_bad;  // the lowest bad row: the same report on every run
  if (threadIdx.x == 0) first_bad = ~0ull;
  __syncthreads();
  float acc = 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += kLossThreads) {
    const int64_t t = targets[r];
    if (t == ignore_index) continue;
    if (t < 0 || t >= valid) {
      atomicMin(&first_bad, (unsigned long long)r);
      continue;
    }
    acc += lse[r] - to_float(logits[r * C + t]);
  }
  acc = block_sum(acc);  // its barrier also orders every atomicMin before thread 0 reads first_bad
  if (threadIdx.x == 0) loss[0] = acc / normalizer;
  if (threadIdx.x == 0 && first_bad != ~0ull) {
    loss[0] = __int_as_float(0x7fc00000);  // NaN: a loss missing a row's term is no loss
    if (bad_target != nullptr) {
      const int64_t r = int64_t(first_bad);
      note_bad_target(*bad_target, r, targets[r], valid, ignore_index);
      __threadfence_system();  // the record is host memory: make it visible past the GPU
    }
  }
}

template <class T, int V>
__global__ void backward_kernel(const T* logits, const int64_t* targets, const float* lse,
                                const float* dloss, T* dlogits, int64_t C, int64_t valid,
                                int64_t ignore_index, float normalizer) {
  const int64_t r = blockIdx.x;
  const int64_t t = targets[r];
  const T* row = logits + r * C;
  T* drow = dlogits + r * C;
  const int64_t cv = C / V;
  if (t == ignore_index) {
    Pack<T, V> zero;
#pragma unroll
    for (int j = 0; j < V; ++j) zero.v[j] = from_float<T>(0.f);
    for (int64_t i = threadIdx.x; i < cv; i += blockDim.x) reinterpret_cast<Pack<T, V>*>(drow)[i] = zero;
    return;
  }
  const float g = *dloss / normalizer;
  const float l = lse[r];
  for (int64_t i = threadIdx.x; i < cv; i += blockDim.x) {
    const Pack<T, V> p = reinterpret_cast<const Pack<T, V>*>(row)[i];
    Pack<T, V> d;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t c = i * V + j;
      d.v[j] = c < valid ? from_float<T>(g * (expf(to_float(p.v[j]) - l) - (c == t ? 1.f : 0.f)))
                         : from_float<T>(0.f);  // padding: no class, no gradient
    }
    reinterpret_cast<Pack<T, V>*>(drow)[i] = d;
  }
}

// Rows may use 16-byte packs when every row starts on a 16-byte boundary.
bool rows_aligned(const void* p, int64_t C, size_t elem) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (C * int64_t(elem)) % 16 == 0;
}

void check_shape(const char* op, int64_t rows, int64_t C, int64_t valid) {
  MT_CHECK(C >= 1, op, ": need at least one class, got C = ", C);
  MT_CHECK(valid >= 1 && valid <= C, op, ": valid classes ", valid, " outside [1, ", C, "]");
  MT_CHECK(rows <= INT32_MAX, op, ": ", rows, " rows exceed one block per row");
}

int row_threads(int64_t C) { return C >= 1024 ? 256 : 32; }

}  // namespace

void cross_entropy_forward(const void* logits, const int64_t* targets, float* loss, float* lse,
                           BadTargetRecord* bad_target, int64_t rows, int64_t C, int64_t valid,
                           int64_t ignore_index, float normalizer, DType dt, cudaStream_t s) {
  check_shape("cross_entropy_forward", rows, C, valid);
  dispatch_float<false>(dt, "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    auto* x = static_cast<const T*>(logits);
    if (rows > 0) {
      if (rows_aligned(logits, C, sizeof(T)))
        lse_kernel<T, V><<<unsigned(rows), row_threads(C), 0, s>>>(x, targets, lse, C, valid,
                                                                   ignore_index);
      else
        lse_kernel<T, 1><<<unsigned(rows), row_threads(C), 0, s>>>(x, targets, lse, C, valid,
                                                                   ignore_index);
      MT_CUDA_CHECK_LAUNCH();
    }
    // Runs for rows == 0 too, so loss is always written (0 / normalizer).
    loss_kernel<T><<<1, kLossThreads, 0, s>>>(x, targets, lse, loss, bad_target, rows, C, valid,
                                               ignore_index, normalizer);
    MT_CUDA_CHECK_LAUNCH();
  });
}

// dlogits '=' in dt (fp32 math, rounded once); nothing is added into: no reduction, no sink.
void cross_entropy_backward(const void* logits, const int64_t* targets, const float* lse,
                            const float* dloss, void* dlogits, int64_t rows, int64_t C,
                            int64_t valid, int64_t ignore_index, float normalizer, DType dt,
                            cudaStream_t s) {
  check_shape("cross_entropy_backward", rows, C, valid);
  if (rows == 0) return;
  dispatch_float<false>(dt, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    auto* x = static_cast<const T*>(logits);
    auto* dx = static_cast<T*>(dlogits);
    if (rows_aligned(logits, C, sizeof(T)) && rows_aligned(dlogits, C, sizeof(T)))
      backward_kernel<T, V><<<unsigned(rows), row_threads(C), 0, s>>>(x, targets, lse, dloss, dx, C,
                                                                       valid, ignore_index,
                                                                       normalizer);
    else
      backward_kernel<T, 1><<<unsigned(rows), row_threads(C), 0, s>>>(x, targets, lse, dloss, dx, C,
                                                                       valid, ignore_index,
                                                                       normalizer);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for cross_entropy on CUDA ----------------------------
namespace mt {
namespace {

// An out-of-range target cannot throw here without a host synchronization per call, which would
// also make the step impossible to capture in a CUDA graph. The forward kernel writes it into
// this device's BadTargetRecord instead, and the check registered below raises it at the next
// host synchronization (bad_target.h).
//
// The record lives in page-locked host memory mapped into the device's address space, one per
// device, allocated at first use and kept for the process (like the streams). The kernel writes
// it only when a target is bad, and the check after a synchronization is a plain host read: no
// copy and no device work on the common path. A CUDA-graph replay writes the same record, as
// its address is fixed. The first use must come before any capture (the eager first step), as
// for the cuBLAS handles.
constexpr int kMaxDevices = 64;
std::atomic<BadTargetRecord*> records[kMaxDevices];  // the host's address
BadTargetRecord* device_records[kMaxDevices];         // the same memory, as kernels address it
std::once_flag record_once[kMaxDevices];

// The record's device address; `device` must be current.
BadTargetRecord* bad_target_record(int device) {
  MT_CHECK(device >= 0 && device < kMaxDevices, "cross_entropy: device ", device, " out of range");
  std::call_once(record_once[device], [&] {
    void* p = nullptr;
    MT_CUDA_CHECK(cudaHostAlloc(&p, sizeof(BadTargetRecord),
                                cudaHostAllocMapped | cudaHostAllocPortable));
    void* d = nullptr;
    MT_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
    device_records[device] = static_cast<BadTargetRecord*>(d);
    records[device] = new (p) BadTargetRecord();
  });
  return device_records[device];
}

// Only a device whose record exists can have one waiting.
const bool registered = [] {
  cuda::add_device_error_check([](int device) {
    if (device < 0 || device >= kMaxDevices) return;
    if (BadTargetRecord* r = records[device].load()) raise_bad_target(*r);
  });
  return true;
}();

// normalizer <= 0 means "this call's count of non-ignored targets": counting them reads the
// targets on the host (a synchronization), so the trainer always passes its step's count instead.
// With no target left the sum is 0 and any positive normalizer gives CPU's answer (0, no NaN).
double effective_normalizer(const Tensor& targets, int64_t ignore_index, double normalizer) {
  if (normalizer > 0) return normalizer;
  int64_t count = 0;
  for (double t : targets.to_vector()) count += int64_t(t) != ignore_index;
  return count > 0 ? double(count) : 1.0;
}

void cross_entropy_forward_cuda(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                double normalizer, int64_t valid, const Tensor& loss,
                                const Tensor& lse) {
  normalizer = effective_normalizer(targets, ignore_index, normalizer);
  cudaStream_t s = cuda::stream_of(logits);
  cuda::cross_entropy_forward(logits.data_ptr(), cuda::ptr<const int64_t>(targets),
                              cuda::ptr<float>(loss), cuda::ptr<float>(lse),
                              bad_target_record(logits.device().index),
                              logits.size(0), logits.size(1), valid, ignore_index,
                              float(normalizer), logits.dtype(), s);
}

// dlogits '=' in logits' dtype, a new tensor; the engine adds it into .grad if logits is a leaf.
void cross_entropy_backward_cuda(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 const Tensor& dloss, int64_t ignore_index, double normalizer,
                                 int64_t valid, const Tensor& dlogits) {
  normalizer = effective_normalizer(targets, ignore_index, normalizer);
  cuda::cross_entropy_backward(logits.data_ptr(), cuda::ptr<const int64_t>(targets),
                               cuda::ptr<const float>(lse), cuda::ptr<const float>(dloss),
                               dlogits.data_ptr(), logits.size(0), logits.size(1), valid,
                               ignore_index, float(normalizer), logits.dtype(),
                               cuda::stream_of(logits));
}

}  // namespace

MT_REGISTER_KERNEL(cross_entropy, Forward, CUDA, cross_entropy_forward_cuda);
MT_REGISTER_KERNEL(cross_entropy, Backward, CUDA, cross_entropy_backward_cuda);

}  // namespace mt
