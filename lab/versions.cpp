// The lab's table of contents: every version in order, with the line the bench prints beside it.
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

}  // namespace mt::lab
