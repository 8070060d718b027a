// Attention benchmark: the causal attention kernels (ops/attention) forward and backward in
// TFLOP/s at the shapes a GPT uses, bf16; bench/attention_sdpa.py times PyTorch's
// F.scaled_dot_product_attention on the same shapes for the same-run comparison.
//
// FLOPs follow PyTorch's and FlashAttention's convention for causal attention: the forward is two
// T×T×d GEMMs (S = q kᵀ and O = P v), 4·B·H·T²·d, halved by the mask; the backward is five (S
// again, dP, dV, dK, dQ), 2.5 times the forward. The deterministic backward does two more (its
// dQ pass recomputes S and dP) but is credited with the same count: the figure compares time.
// Each figure is the median of kReps timed calls after kWarmup untimed ones, on random inputs.
// Rows marked "dropout 0.2" time the kernels with dropout on P (nanoGPT's attn_dropout, the
// Shakespeare recipe's p), credited with the same FLOPs: the mask's Philox draws are extra work.
// Rows marked "packed" read q, k, v in place from one [B, T, 3·C] buffer and write O into
// [B, T, C] (attention_packed, as the GPT runs it); the others use contiguous [B, H, T, d] heads.
// Each row ends with a hash of O, L and the deterministic backward's dQ, dK, dV (FNV-1a of their
// bytes), so that two builds of the kernels can be seen to give the same bits on the same inputs.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_bf16.h>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/dtype.h"
#include "ops/attention/attention_cuda.h"
#include "ops/dropout/dropout.h"  // dropout_threshold

namespace {

constexpr int kWarmup = 3;
constexpr int kReps = 20;
constexpr double kDropout = 0.2;  // the "dropout" rows' p

struct Shape {
  int64_t B, H, T, d;
  int64_t elems() const { return B * H * T * d; }
  double fwd_flops() const { return 4.0 * B * H * T * T * d / 2; }
};

// A well-mixed value in [-1, 1) for every (index, seed).
__global__ void fill_kernel(__nv_bfloat16* out, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = uint64_t(i) + 0x9e3779b97f4a7c15ull * (uint64_t(seed) + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    out[i] = __float2bfloat16(float(uint32_t(z >> 40)) / float(1 << 24) * 2.0f - 1.0f);
  }
}

// FNV-1a over the bytes of device buffers, continuing from h.
uint64_t fnv1a(uint64_t h, const void* device_ptr, size_t bytes) {
  std::vector<unsigned char> host(bytes);
  MT_CUDA_CHECK(cudaMemcpy(host.data(), device_ptr, bytes, cudaMemcpyDeviceToHost));
  for (unsigned char c : host) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

template <class F>
double median_ms(cudaStream_t s, F&& body) {
  for (int i = 0; i < kWarmup; ++i) body();
  std::vector<cudaEvent_t> events(2 * kReps);
  for (cudaEvent_t& e : events) MT_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < kReps; ++i) {
    MT_CUDA_CHECK(cudaEventRecord(events[2 * i], s));
    body();
    MT_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], s));
  }
  MT_CUDA_CHECK(cudaEventSynchronize(events.back()));
  std::vector<float> ms(kReps);
  for (int i = 0; i < kReps; ++i)
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]));
  for (cudaEvent_t& e : events) MT_CUDA_CHECK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[kReps / 2];
}

void bench(const Shape& sh, bool dropout, bool packed, int device, cudaStream_t s) {
  using mt::cuda::alloc;
  const int64_t n = sh.elems(), heads = sh.B * sh.H, C = sh.H * sh.d;
  const size_t bytes = size_t(n) * sizeof(__nv_bfloat16);
  // Buffers: q k v o dout dq dk dv (packed: qkv o dout dqkv, q k v and dq dk dv inside those).
  std::vector<void*> owned;
  for (int i = 0; i < (packed ? 4 : 8); ++i)
    owned.push_back(alloc(packed && (i == 0 || i == 3) ? 3 * bytes : bytes, device));
  auto at = [](void* p, int64_t elems) { return static_cast<__nv_bfloat16*>(p) + elems; };
  std::vector<void*> bufs = owned;
  mt::cuda::HeadsLayout in = mt::cuda::contiguous_heads(sh.T, sh.d), out = in;
  if (packed) {
    bufs = {owned[0], at(owned[0], C), at(owned[0], 2 * C), owned[1], owned[2],
            owned[3], at(owned[3], C), at(owned[3], 2 * C)};
    in = {sh.H, sh.T * 3 * C, sh.d, 3 * C};
    out = {sh.H, sh.T * C, sh.d, C};
  }
  float* lse = static_cast<float*>(alloc(size_t(heads * sh.T) * sizeof(float), device));
  for (int i = 0; i < (packed ? 3 : 5); ++i) {
    const int64_t elems = packed && i == 0 ? 3 * n : n;
    fill_kernel<<<1024, 256, 0, s>>>(static_cast<__nv_bfloat16*>(owned[size_t(i)]), elems,
                                     uint32_t(i));
    MT_CUDA_CHECK_LAUNCH();
  }
  mt::cuda::AttentionDropoutArgs drop;
  if (dropout)
    drop = {.on = true, .threshold = mt::dropout_threshold(kDropout),
            .scale = float(1.0 / (1.0 - kDropout)), .seed = 1, .offset = 0};
  auto fwd = [&] {
    mt::cuda::attention_forward(bufs[0], bufs[1], bufs[2], in, bufs[3], out, lse, heads, sh.T,
                                sh.d, mt::DType::bf16, s, drop);
  };
  auto bwd = [&](bool deterministic) {
    return [&, deterministic] {
      mt::cuda::attention_backward(bufs[0], bufs[1], bufs[2], in, bufs[3], bufs[4], out, lse,
                                   bufs[5], bufs[6], bufs[7], heads, sh.T, sh.d, mt::DType::bf16,
                                   deterministic, s, drop);
    };
  };
  const double f_ms = median_ms(s, fwd);
  fwd();  // O and L for the backward
  const double b_ms = median_ms(s, bwd(true));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  uint64_t bits = fnv1a(0xcbf29ce484222325ull, bufs[3], bytes);  // O
  bits = fnv1a(bits, lse, size_t(heads * sh.T) * sizeof(float));
  if (packed) bits = fnv1a(bits, owned[3], 3 * bytes);  // dq, dk, dv interleaved
  else
    for (int i = 5; i < 8; ++i) bits = fnv1a(bits, bufs[size_t(i)], bytes);
  const double a_ms = median_ms(s, bwd(false));
  const double ff = sh.fwd_flops(), bf = 2.5 * ff;
  // Which kernels ran: the atomic-dQ backward is always the mma.sync one.
  const bool wgmma = mt::cuda::attention_uses_wgmma(mt::DType::bf16, sh.d);
  const char* kernels = !wgmma ? "mma.sync" : dropout ? "wgmma fwd" : "wgmma fwd, bwd";
  std::printf("[%lld, %lld, %lld, %lld] bf16 causal%s   (%s) fwd %7.3f ms %6.1f TFLOP/s   "
              "bwd %7.3f ms %6.1f TFLOP/s   bwd atomic-dQ %7.3f ms %6.1f TFLOP/s   bits %016llx\n",
              (long long)sh.B, (long long)sh.H, (long long)sh.T, (long long)sh.d,
              dropout ? ", dropout 0.2" : packed ? ", packed" : "",
              kernels, f_ms,
              ff / (f_ms * 1e-3) / 1e12, b_ms, bf / (b_ms * 1e-3) / 1e12, a_ms,
              bf / (a_ms * 1e-3) / 1e12, (unsigned long long)bits);
  for (void* p : owned) mt::cuda::free(p, device);
  mt::cuda::free(lse, device);
}

}  // namespace

int main() {
  if (!mt::cuda::available()) {
    std::printf("bench_attention: no CUDA device\n");
    return 0;
  }
  const int device = 0;
  mt::cuda::set_device(device);
  cudaStream_t s = mt::cuda::stream(device);
  std::printf("causal attention, FLOPs: fwd 4*B*H*T^2*d/2, bwd 2.5x fwd (PyTorch/FlashAttention "
              "convention)\n");
  for (const Shape& sh : {Shape{16, 12, 1024, 64}, Shape{4, 16, 4096, 128}, Shape{16, 12, 1024, 32},
                          Shape{8, 12, 2048, 64}})
    bench(sh, false, false, device, s);
  // GPT-2 124M's attention as its step runs it, from the [B, T, 3C] projection.
  bench(Shape{16, 12, 1024, 64}, false, true, device, s);
  // The Shakespeare recipe's attention (batch 64, 6 heads, T = 256, d = 64) without and with its
  // dropout, and the first shape with it.
  bench(Shape{64, 6, 256, 64}, false, false, device, s);
  bench(Shape{64, 6, 256, 64}, true, false, device, s);
  bench(Shape{16, 12, 1024, 64}, true, false, device, s);
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  return 0;
}
