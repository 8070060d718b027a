// Attention, the production kernels (ops/attention/attention.cu), called as the framework calls
// them. Whatever those kernels become, these rows of the table follow.
//
// Forward, v4, what it adds to v3: the two products of each tile go to the tensor cores
// (mma.sync m16n8k16, bf16 in, fp32 accumulate): S = q·kᵀ for a 16-row slice of the query tile
// per warp, its online softmax in registers, then P rounded to bf16 and o += P·v, with no trip
// through shared memory between them; k and v tiles arrive by cp.async while the previous tile
// computes, and ldmatrix feeds them to the fragments. On Hopper (an sm_90a build) the same walk
// runs with warpgroup MMA (wgmma) reading its operands from swizzled shared memory, and so do
// the deterministic backward's passes: these rows then time those kernels.
//
// Backward, v3, what it adds to v2: tiles and tensor cores. One block per key tile keeps its k
// and v in shared memory and walks the query tiles at or below the diagonal, recomputing
// P = exp(S − L) tile by tile and adding dv += Pᵀ·dO and dk += dSᵀ·q in registers. dq needs a sum
// over key tiles, which live in different blocks: the deterministic version gives it a pass of its
// own over query tiles (the scores recomputed once more, every sum in a fixed order); the atomic
// version has each key-tile block add its share into an fp32 buffer with atomicAdd, whose
// arrival order changes the last bits from run to run (lab_bench prints what the order costs).
#include "core/dtype.h"
#include "lab/attention/attention.h"
#include "ops/attention/attention_cuda.h"

namespace mt::lab {

namespace attn_v4 {
void forward(const void* q, const void* k, const void* v, void* o, float* L, float* /*P*/,
             AttnShape s, cudaStream_t stream) {
  const cuda::HeadsLayout l = cuda::contiguous_heads(s.T, s.d);
  cuda::attention_forward(q, k, v, l, o, l, L, s.heads, s.T, s.d, DType::bf16, stream);
}
}  // namespace attn_v4

namespace attn_v3_backward {
void deterministic(const void* q, const void* k, const void* v, const void* o, const float* L,
                   const float* /*P*/, const void* dO, void* dq, void* dk, void* dv,
                   float* /*work*/, AttnShape s, cudaStream_t stream) {
  const cuda::HeadsLayout l = cuda::contiguous_heads(s.T, s.d);
  cuda::attention_backward(q, k, v, l, o, dO, l, L, dq, dk, dv, s.heads, s.T, s.d, DType::bf16,
                           /*deterministic=*/true, stream);
}
void atomic(const void* q, const void* k, const void* v, const void* o, const float* L,
            const float* /*P*/, const void* dO, void* dq, void* dk, void* dv, float* /*work*/,
            AttnShape s, cudaStream_t stream) {
  const cuda::HeadsLayout l = cuda::contiguous_heads(s.T, s.d);
  cuda::attention_backward(q, k, v, l, o, dO, l, L, dq, dk, dv, s.heads, s.T, s.d, DType::bf16,
                           /*deterministic=*/false, stream);
}
}  // namespace attn_v3_backward

}  // namespace mt::lab
