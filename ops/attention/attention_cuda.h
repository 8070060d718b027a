#pragma once
// CUDA launchers of the causal attention op on raw device buffers: B·H heads of [T, d] rows each
// for q, k, v, o (wherever a HeadsLayout puts them) and lse [B·H, T] (fp32, contiguous). The ops'
// Functions (attention.cpp) check shapes, dtypes and devices and call these; the math is in
// attention.h, the grids at the top of attention.cu. bf16 and f16 at d = 32, 64 and 128 run on
// the tensor cores; f32, and other d up to kAttentionMaxD, on a plain CUDA-core path
// (correctness first).
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// Where head bh = b·H + h keeps its rows: they start at element b·batch + h·head of the buffer and
// row i sits i·row further on, its d elements contiguous. A contiguous [B, H, T, d] tensor is
// {H, H·T·d, T·d, d}; q of a [B, T, 3·C] projection is {H, T·3·C, d, 3·C} from the buffer's
// start (k from element C, v from 2·C); y [B, T, C] is {H, T·C, d, C}. On the tensor cores the
// buffers and every stride must be 16-byte multiples (the tiles move in 16-byte copies).
struct HeadsLayout {
  int64_t heads = 1, batch = 0, head = 0, row = 0;
};

// B·H contiguous heads of [T, d].
inline HeadsLayout contiguous_heads(int64_t T, int64_t d) { return {1, T * d, 0, d}; }

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
// q, k and v share the layout `in`; o has `out`. heads: B·H in all. On a stream other than the
// framework's (cuda::stream), the Hopper forward allocates, zeroes and frees a work counter of
// its own around the launch (three more nodes in a graph); on the framework's stream it uses one
// that each launch leaves at zero.
void attention_forward(const void* q, const void* k, const void* v, const HeadsLayout& in, void* o,
                       const HeadsLayout& out, float* lse, int64_t heads, int64_t T, int64_t d,
                       DType dt, cudaStream_t s, const AttentionDropoutArgs& dropout = {});

// dq, dk, dv '=' (dt). D = rowsum(dout ∘ o) goes to a stream-ordered fp32 scratch first.
// deterministic: dQ by its own pass over Q tiles (no atomics); otherwise the dK/dV pass adds each
// tile's dQ share into an fp32 scratch with atomicAdd (arrival order varies the last bits) and a
// last pass rounds it into dq. The CUDA-core path is always deterministic.
// q, k, v, dq, dk, dv share the layout `in`; o and dout share `out`.
void attention_backward(const void* q, const void* k, const void* v, const HeadsLayout& in,
                        const void* o, const void* dout, const HeadsLayout& out, const float* lse,
                        void* dq, void* dk, void* dv, int64_t heads, int64_t T, int64_t d, DType dt,
                        bool deterministic, cudaStream_t s, const AttentionDropoutArgs& dropout = {});

// Whether (dt, d) takes the tensor-core kernels.
bool attention_uses_tensor_cores(DType dt, int64_t d);

// Whether the Hopper kernels (warpgroup MMA) run on the current device: a build with an sm_90a
// target (MT_CUDA_SM90A), a compute capability 9.0 GPU, bf16 or f16, d = 64 or 128. Then the
// forward takes them (with or without dropout; O and L to the mma.sync kernel's tolerance, not
// its bits), and so does the deterministic backward without dropout (the same bits as the
// mma.sync passes). Elsewhere the mma.sync kernels run.
bool attention_uses_wgmma(DType dt, int64_t d);

}  // namespace mt::cuda
