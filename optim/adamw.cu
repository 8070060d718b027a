// Fused multi-tensor AdamW and the deterministic global gradient norm. The update rule is in
// adamw_cuda.h.
//
// How one launch covers many tensors. Every tensor is cut into chunks of kChunk elements; block b
// of the grid owns one (tensor, chunk). The tensor list travels as the kernel's parameter, a
// struct of up to kMaxTensors descriptors plus each tensor's first block index (CUDA 12.1+
// allows 32 KB of parameters on sm_70+). A block finds its tensor by binary search over those
// indices. Kernel parameters are captured by value in a CUDA graph, so there is no staging buffer
// to keep alive or to refresh, and no host synchronization. More than kMaxTensors tensors take
// one more launch per kMaxTensors (no per-parameter launches). __grid_constant__ lets the kernel
// index the descriptor array in parameter memory without copying the 17 KB struct to local memory.
//
// AdamW: grid = sum of chunks, 256 threads, each thread moves float4s of p, g, m, v (and 4
// bf16/f16 of lowp) when the tensor's pointers are 16-byte (lowp 8-byte) aligned, else floats.
// Everything is stored ('=') in place: p, m, v in fp32, lowp rounded once from the new fp32 p.
// Bytes per element: read p, g, m, v (16) + write p, m, v (12) + write lowp (2 if any) = 28-30;
// a handful of FLOPs and one sqrt. Floor: those bytes at copy bandwidth.
//
// grad_norm_sq: the same chunking; block b writes partials[b] = fp32 sum of its chunk's g^2
// ('='), then one block of 1024 threads adds the partials in index order into *out_sq ('=').
// Bytes: 4 per element, read once. The chunk -> block map depends only on the sizes, so the
// result is bitwise reproducible.
#include "optim/adamw_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/vec.cuh"
#include "core/registry.h"
#include "optim/kernels.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;  // elements per block: 16 float4 per thread
constexpr int kMaxTensors = 256;   // descriptors per launch

struct AdamWBatch {
  AdamWTensor t[kMaxTensors];
  int first_block[kMaxTensors];  // block index where tensor i's chunks start (increasing)
  int num;
};

struct NormBatch {
  const float* g[kMaxTensors];
  int64_t n[kMaxTensors];
  int first_block[kMaxTensors];
  int num;
  int partial_base;  // partials index of this launch's block 0
};

// Parameter space is 32764 bytes; keep room for the other arguments.
static_assert(sizeof(AdamWBatch) <= 30000 && sizeof(NormBatch) <= 30000, "kernel parameters too large");

struct Betas {
  float b1, b2, eps;
};

// The step's learning rate and bias corrections, read from the device once per block.
struct Hyper {
  float lr, b1, b2, eps, bc1, bc2;
};

constexpr int kFloatsPerWrite = 4096;
struct Floats {
  float v[kFloatsPerWrite];
};
static_assert(sizeof(Floats) <= 30000, "kernel parameters too large");

// The tensor whose chunks contain block b: the last i with first_block[i] <= b (every tensor in
// a batch has at least one chunk, so first_block is strictly increasing).
__device__ __forceinline__ int find_tensor(const int* first_block, int num, int b) {
  int lo = 0, hi = num - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ void adamw_update(float& p, float g, float& m, float& v, float decay,
                                             const Hyper& h) {
  m = h.b1 * m + (1.f - h.b1) * g;
  v = h.b2 * v + (1.f - h.b2) * g * g;
  p *= decay;
  p -= h.lr * (m / h.bc1) / (sqrtf(v / h.bc2) + h.eps);
}

template <class Low>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(const __grid_constant__ AdamWBatch batch, const Betas betas,
                 const float* grad_scale) {
  const int ti = find_tensor(batch.first_block, batch.num, blockIdx.x);
  const AdamWTensor& t = batch.t[ti];
  const Hyper h{t.hyper[0], betas.b1, betas.b2, betas.eps, t.hyper[1], t.hyper[2]};
  const int64_t begin = int64_t(blockIdx.x - batch.first_block[ti]) * kChunk;
  const int64_t end = begin + kChunk < t.n ? begin + kChunk : t.n;
  const float gs = grad_scale != nullptr ? *grad_scale : 1.f;
  const float decay = 1.f - h.lr * t.weight_decay;
  Low* lowp = static_cast<Low*>(t.lowp);

  const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = a16(t.param) && a16(t.grad) && a16(t.m) && a16(t.v) &&
                   reinterpret_cast<uintptr_t>(lowp) % 8 == 0;  // uniform over the block
  int64_t i = begin + int64_t(threadIdx.x) * (vec ? 4 : 1);
  if (vec) {
    const int64_t end4 = begin + (end - begin) / 4 * 4;  // begin is a multiple of 4
    for (; i < end4; i += 4 * kThreads) {
      float4 p = *reinterpret_cast<const float4*>(t.param + i);
      float4 g = *reinterpret_cast<const float4*>(t.grad + i);
      float4 m = *reinterpret_cast<const float4*>(t.m + i);
      float4 v = *reinterpret_cast<const float4*>(t.v + i);
      adamw_update(p.x, g.x * gs, m.x, v.x, decay, h);
      adamw_update(p.y, g.y * gs, m.y, v.y, decay, h);
      adamw_update(p.z, g.z * gs, m.z, v.z, decay, h);
      adamw_update(p.w, g.w * gs, m.w, v.w, decay, h);
      *reinterpret_cast<float4*>(t.param + i) = p;
      *reinterpret_cast<float4*>(t.m + i) = m;
      *reinterpret_cast<float4*>(t.v + i) = v;
      if (lowp != nullptr) {
        Pack<Low, 4> l;
        l.v[0] = from_float<Low>(p.x), l.v[1] = from_float<Low>(p.y);
        l.v[2] = from_float<Low>(p.z), l.v[3] = from_float<Low>(p.w);
        *reinterpret_cast<Pack<Low, 4>*>(lowp + i) = l;
      }
    }
    i = end4 + threadIdx.x;  // the last end - end4 (< 4) elements
  }
  for (; i < end; i += kThreads) {
    float p = t.param[i], m = t.m[i], v = t.v[i];
    adamw_update(p, t.grad[i] * gs, m, v, decay, h);
    t.param[i] = p, t.m[i] = m, t.v[i] = v;
    if (lowp != nullptr) lowp[i] = from_float<Low>(p);
  }
}

__global__ void __launch_bounds__(kThreads)
    sumsq_kernel(const __grid_constant__ NormBatch batch, float* partials) {
  const int ti = find_tensor(batch.first_block, batch.num, blockIdx.x);
  const float* g = batch.g[ti];
  const int64_t n = batch.n[ti];
  const int64_t begin = int64_t(blockIdx.x - batch.first_block[ti]) * kChunk;
  const int64_t end = begin + kChunk < n ? begin + kChunk : n;
  float acc = 0.f;
  int64_t i = begin + threadIdx.x;
  if (reinterpret_cast<uintptr_t>(g) % 16 == 0) {
    // Four independent float4 loads in flight per thread before any is added.
    constexpr int kUnroll = 4;
    const float4* g4 = reinterpret_cast<const float4*>(g);
    const int64_t b4 = begin / 4, e4 = b4 + (end - begin) / 4;
    for (int64_t j = b4 + threadIdx.x; j < e4; j += kUnroll * kThreads) {
      float4 x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = j + u * kThreads;
        x[u] = k < e4 ? g4[k] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        acc += x[u].x * x[u].x + x[u].y * x[u].y + x[u].z * x[u].z + x[u].w * x[u].w;
    }
    i = e4 * 4 + threadIdx.x;
  }
  for (; i < end; i += kThreads) acc += g[i] * g[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[batch.partial_base + blockIdx.x] = acc;
}

__global__ void sum_partials_kernel(const float* partials, int num, float* out) {
  float acc = 0.f;
  for (int i = threadIdx.x; i < num; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}

__global__ void clip_factor_kernel(const float* norm_sq, float max_norm, float* factor) {
  *factor = fminf(1.f, max_norm / (sqrtf(*norm_sq) + 1e-6f));
}

// Adds the chunks of an n-element tensor to a running block count, refusing a grid past int range.
int add_blocks(int blocks, int64_t n, const char* op) {
  const int64_t total = int64_t(blocks) + (n + kChunk - 1) / kChunk;
  MT_CHECK(total <= INT32_MAX, op, ": too many elements for one launch (", total, " chunks)");
  return int(total);
}

template <class Low>
void launch_adamw(const AdamWBatch& batch, int blocks, const Betas& betas, const float* grad_scale,
                  cudaStream_t s) {
  adamw_kernel<Low><<<unsigned(blocks), kThreads, 0, s>>>(batch, betas, grad_scale);
  MT_CUDA_CHECK_LAUNCH();
}

__global__ void write_floats_kernel(float* dst, const __grid_constant__ Floats src, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src.v[i];
}

}  // namespace

void adamw_step(const AdamWTensor* tensors_host, int num_tensors, float b1, float b2, float eps,
                const float* grad_scale, DType lowp_dt, cudaStream_t s) {
  bool any_lowp = false;
  for (int i = 0; i < num_tensors; ++i) any_lowp |= tensors_host[i].lowp != nullptr;
  MT_CHECK(!any_lowp || lowp_dt == DType::bf16 || lowp_dt == DType::f16,
           "adamw_step: the low-precision copy must be bf16 or f16, got ", dtype_name(lowp_dt));
  const Betas betas{b1, b2, eps};
  AdamWBatch batch;  // copied into the launch: reusable as soon as the <<<>>> returns
  batch.num = 0;
  int blocks = 0;
  auto flush = [&] {
    if (batch.num == 0) return;
    if (lowp_dt == DType::f16) launch_adamw<__half>(batch, blocks, betas, grad_scale, s);
    else launch_adamw<__nv_bfloat16>(batch, blocks, betas, grad_scale, s);
    batch.num = 0;
    blocks = 0;
  };
  for (int i = 0; i < num_tensors; ++i) {
    const AdamWTensor& t = tensors_host[i];
    if (t.n == 0) continue;
    MT_CHECK(t.n > 0 && t.param && t.grad && t.m && t.v && t.hyper, "adamw_step: tensor ", i,
             " has a null pointer or a negative size (n = ", t.n, ")");
    batch.t[batch.num] = t;
    batch.first_block[batch.num] = blocks;
    blocks = add_blocks(blocks, t.n, "adamw_step");
    if (++batch.num == kMaxTensors) flush();
  }
  flush();
}

void write_floats(float* dst, const float* src_host, int n, cudaStream_t s) {
  for (int begin = 0; begin < n; begin += kFloatsPerWrite) {
    const int count = n - begin < kFloatsPerWrite ? n - begin : kFloatsPerWrite;
    Floats chunk;
    for (int i = 0; i < count; ++i) chunk.v[i] = src_host[begin + i];
    write_floats_kernel<<<1, 256, 0, s>>>(dst + begin, chunk, count);
    MT_CUDA_CHECK_LAUNCH();
  }
}

void grad_norm_sq(const float* const* grads_host, const int64_t* sizes, int num, float* out_sq,
                  cudaStream_t s) {
  int total = 0;
  for (int i = 0; i < num; ++i) {
    MT_CHECK(sizes[i] >= 0 && (sizes[i] == 0 || grads_host[i] != nullptr), "grad_norm_sq: tensor ", i,
             " has a null pointer or a negative size (n = ", sizes[i], ")");
    total = add_blocks(total, sizes[i], "grad_norm_sq");
  }
  if (total == 0) {
    MT_CUDA_CHECK(cudaMemsetAsync(out_sq, 0, sizeof(float), s));
    return;
  }
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CHECK(s == mt::cuda::stream(dev), "grad_norm_sq: must run on the framework stream of device ",
           dev, " (its scratch is ordered there)");
  auto* partials = static_cast<float*>(mt::cuda::alloc(size_t(total) * sizeof(float), dev));
  NormBatch batch;
  batch.num = 0;
  batch.partial_base = 0;
  int blocks = 0;
  auto flush = [&] {
    if (batch.num == 0) return;
    sumsq_kernel<<<unsigned(blocks), kThreads, 0, s>>>(batch, partials);
    MT_CUDA_CHECK_LAUNCH();
    batch.partial_base += blocks;
    batch.num = 0;
    blocks = 0;
  };
  for (int i = 0; i < num; ++i) {
    if (sizes[i] == 0) continue;
    batch.g[batch.num] = grads_host[i];
    batch.n[batch.num] = sizes[i];
    batch.first_block[batch.num] = blocks;
    blocks = add_blocks(blocks, sizes[i], "grad_norm_sq");
    if (++batch.num == kMaxTensors) flush();
  }
  flush();
  sum_partials_kernel<<<1, 1024, 0, s>>>(partials, total, out_sq);
  MT_CUDA_CHECK_LAUNCH();
  mt::cuda::free(partials, dev);  // stream-ordered: released after the kernels above have run
}

void clip_factor(const float* norm_sq, float max_norm, float* factor, cudaStream_t s) {
  clip_factor_kernel<<<1, 1, 0, s>>>(norm_sq, max_norm, factor);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for adamw_step and adamw_hyper on CUDA (optim/kernels.h) --
namespace mt::optim {
namespace {

// Per device, the tensors by their compute copy's dtype (f32: no copy); those without a copy join
// a launch with copies (the kernel skips a null copy's store).
void adamw_step_cuda(const std::vector<AdamWParam>& params, double b1, double b2, double eps,
                     const Tensor& grad_scale) {
  std::map<int, std::map<DType, std::vector<cuda::AdamWTensor>>> launches;
  for (const AdamWParam& u : params) {
    const Tensor& p = u.param;
    const Tensor lowp = p.compute_copy();
    launches[p.device().index][lowp.defined() ? lowp.dtype() : DType::f32].push_back(
        {p.data<float>(), u.grad.data<float>(), u.exp_avg.data<float>(), u.exp_avg_sq.data<float>(),
         lowp.defined() ? lowp.data_ptr() : nullptr, u.hyper.data<float>() + 3 * u.index, p.numel(),
         float(u.weight_decay)});
  }
  const float* scale = grad_scale.defined() ? grad_scale.data<float>() : nullptr;
  for (auto& [device, by_dtype] : launches) {
    if (by_dtype.size() > 1) {
      if (auto plain = by_dtype.extract(DType::f32)) {
        std::vector<cuda::AdamWTensor>& into = by_dtype.begin()->second;
        into.insert(into.end(), plain.mapped().begin(), plain.mapped().end());
      }
    }
    for (const auto& [lowp_dt, tensors] : by_dtype)
      cuda::adamw_step(tensors.data(), int(tensors.size()), float(b1), float(b2), float(eps), scale,
                       lowp_dt, cuda::stream(device));
  }
}

void adamw_hyper_cuda(const Tensor& hyper, const std::vector<float>& values) {
  cuda::write_floats(hyper.data<float>(), values.data(), int(values.size()),
                     cuda::stream(hyper.device().index));
}

}  // namespace

MT_REGISTER_KERNEL(adamw_step, Forward, CUDA, adamw_step_cuda);
MT_REGISTER_KERNEL(adamw_hyper, Forward, CUDA, adamw_hyper_cuda);

}  // namespace mt::optim
