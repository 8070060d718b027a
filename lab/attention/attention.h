#pragma once
// The attention lab: causal self-attention's forward and backward rebuilt in numbered steps, from
// the kernels that write the T×T matrices to memory (v1) to the production kernels in
// ops/attention (forward v4 and backward v3, so the lab cannot drift from them). docs/lab.md
// tells the road.
//
// Every version takes the same arguments, one head after another in [heads, T, d] bf16 buffers
// (a [B, H, T, d] tensor is heads = B·H of them), d a multiple of 32 up to 128:
//   S = q·kᵀ/√d (j <= i),  P = softmax_j(S),  o = P·v,  L_i = m_i + log ℓ_i   (fp32, one per row)
// The backward writes dq, dk, dv with '=' (bf16) from the saved o and L:
//   D_i = rowsum(dO ∘ o)_i,  P = exp(S − L),  dv = Pᵀ·dO,  dS = P ∘ (dO·vᵀ − D),
//   dq = dS·k/√d,  dk = dSᵀ·q/√d
// Only v1 keeps P: its forward writes P (fp32, heads·T·T) and its backward reads it. `work` is
// fp32 scratch of heads·T·(T + 1) floats: v1's dS and D; the other versions use heads·T of it (D).
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

namespace mt::lab {

struct AttnShape {
  int64_t heads = 0, T = 0, d = 0;
};

using AttnForwardFn = void(const void* q, const void* k, const void* v, void* o, float* L, float* P,
                           AttnShape s, cudaStream_t stream);
using AttnBackwardFn = void(const void* q, const void* k, const void* v, const void* o,
                            const float* L, const float* P, const void* dO, void* dq, void* dk,
                            void* dv, float* work, AttnShape s, cudaStream_t stream);

template <class Fn>
struct AttnVersion {
  const char* name;    // "v2 online softmax"
  const char* change;  // what it adds to the version before, in a line
  Fn* fn;
  bool uses_P = false;  // v1: the forward writes P, the backward reads it (heads·T·T floats)
  bool atomic = false;  // float atomics: the last bits may differ from run to run
};

const std::vector<AttnVersion<AttnForwardFn>>& attention_forward_versions();
const std::vector<AttnVersion<AttnBackwardFn>>& attention_backward_versions();

namespace attn_v1 { AttnForwardFn forward; AttnBackwardFn backward; }
namespace attn_v2 { AttnForwardFn forward; AttnBackwardFn backward; }
namespace attn_v3 { AttnForwardFn forward; }
namespace attn_v4 { AttnForwardFn forward; }
namespace attn_v3_backward { AttnBackwardFn deterministic, atomic; }

}  // namespace mt::lab
