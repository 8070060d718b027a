// The lab's table of contents: every version in order, with the line the bench prints beside it.
#include "lab/attention/attention.h"
#include "lab/lab.h"

namespace mt::lab {

const std::vector<Version<SiluBackwardFn>>& silu_versions() {
  static const std::vector<Version<SiluBackwardFn>> v{
      {"v1 atomic per element", "the math; dw: one atomicAdd per element", silu_v1::backward},
      {"v2 block partials", "a block sum first, one atomic per block", silu_v2::backward},
      {"v3 16-byte vectors", "8 bf16 per load and store", silu_v3::backward, true},
      {"v4 two-pass deterministic", "persistent grid, partials, fixed-order sum",
       silu_v4::backward, true},
      {"v5 production", "fast sigmoid, launch bounds, any n (ops/scaled_silu)", silu_v5::backward},
  };
  return v;
}

const std::vector<Version<RmsBackwardFn>>& rms_versions() {
  static const std::vector<Version<RmsBackwardFn>> v{
      {"v1 atomic per element", "a block per row; dweight: one atomicAdd per element",
       rms_v1::backward},
      {"v2 block partials", "persistent grid, dweight in shared memory, atomic per column",
       rms_v2::backward},
      {"v3 16-byte vectors", "8 bf16 per load and store", rms_v3::backward, true},
      {"v4 two-pass deterministic", "partials[block, d] and a column reduce", rms_v4::backward,
       true},
      {"v5 production", "rows in registers, one wave, dweight sums in shared memory (ops/rms_norm)",
       rms_v5::backward},
  };
  return v;
}

const std::vector<AttnVersion<AttnForwardFn>>& attention_forward_versions() {
  static const std::vector<AttnVersion<AttnForwardFn>> v{
      {"v1 materialized", "S and P as T×T buffers in memory, a thread per element",
       attn_v1::forward, true},
      {"v2 online softmax", "a warp per row walks its keys with a running m and ℓ; no T×T",
       attn_v2::forward},
      {"v3 shared-memory tiles", "64 rows a block share each 32-key tile; one rescale per tile",
       attn_v3::forward},
      {"v4 production", "tensor cores (mma.sync; wgmma on sm_90a), P in registers (ops/attention)",
       attn_v4::forward},
  };
  return v;
}

const std::vector<AttnVersion<AttnBackwardFn>>& attention_backward_versions() {
  static const std::vector<AttnVersion<AttnBackwardFn>> v{
      {"v1 saved P", "reads the forward's P, writes dS as a T×T buffer", attn_v1::backward, true},
      {"v2 recompute from L", "P = exp(S − L) per pair, a D pass, a warp per row", attn_v2::backward},
      {"v3 production", "key tiles on tensor cores; dq by its own pass, fixed order (ops/attention)",
       attn_v3_backward::deterministic},
      {"v3 production, atomic dq", "dq added by atomicAdd from each key tile: order varies",
       attn_v3_backward::atomic, false, true},
  };
  return v;
}

}  // namespace mt::lab
