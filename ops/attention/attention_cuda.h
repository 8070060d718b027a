#pragma once
// CUDA launchers of the causal attention op on raw, contiguous, 16-byte aligned device buffers,
// q, k, v, o [B·H, T, d] and lse [B·H, T] (fp32). The op's Function (attention.cpp) checks shapes,
// dtypes and devices and calls these; the math is in attention.h, the grids at the top of
// attention.cu. bf16 and f16 at d = 32, 64 and 128 run on the tensor cores; f32, and other d up to
// kAttentionMaxD, on a plain CUDA-core path (correctness first).
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// Dropout on P (attention.h): element e of P [B·H, T, T] is kept where 16-bit half e % 8 of
// philox::draw(seed, offset + *base, e / 8) >= threshold, and kept values count `scale` times
// (1 / (1 − p) in fp32). on = false: none, the kernels without dropout. base: a device word read
// when the kernels run (nullable: 0).
struct AttentionDropoutArgs {
  bool on = false;
  uint32_t threshold = 0;
  float scale = 1.0f;
  uint64_t seed = 0, offset = 0;
  const uint64_t* base = nullptr;
};

// o '=' (dt), lse '=' (fp32, natural log: L = m + log ℓ of the scaled scores, before dropout).
void attention_forward(const void* q, const void* k, const void* v, void* o, float* lse,
                       int64_t heads, int64_t T, int64_t d, DType dt, cudaStream_t s,
                       const AttentionDropoutArgs& dropout = {});

// dq, dk, dv '=' (dt). D = rowsum(dout ∘ o) goes to a stream-ordered fp32 scratch first.
// deterministic: dQ by its own pass over Q tiles (no atomics); otherwise the dK/dV pass adds each
// tile's dQ share into an fp32 scratch with atomicAdd (arrival order varies the last bits) and a
// last pass rounds it into dq. The CUDA-core path is always deterministic.
void attention_backward(const void* q, const void* k, const void* v, const void* o,
                        const float* lse, const void* dout, void* dq, void* dk, void* dv,
                        int64_t heads, int64_t T, int64_t d, DType dt, bool deterministic,
                        cudaStream_t s, const AttentionDropoutArgs& dropout = {});

// Whether (dt, d) takes the tensor-core kernels.
bool attention_uses_tensor_cores(DType dt, int64_t d);

}  // namespace mt::cuda
