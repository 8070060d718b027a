// Scaled-SiLU backward, v5: the production kernel (ops/scaled_silu/scaled_silu.cu), called as
// the framework calls it, in its deterministic mode.
//
// What it adds to v4: the sigmoid on the special-function unit (__expf, __fdividef), which keeps
// the instruction count below the memory time; __launch_bounds__(256, 4), which lets the compiler
// use 64 registers a thread to keep the next iterations' loads in flight; a scalar tail and a
// V = 1 fallback, so any n and any alignment run; f32 and f16 besides bf16.
#include "lab/lab.h"
#include "ops/scaled_silu/scaled_silu_cuda.h"

namespace mt::lab::silu_v5 {

void backward(const void* x, const float* w, const void* dy, void* dx, float* dw, int64_t n,
              cudaStream_t s) {
  cuda::scaled_silu_backward(x, w, dy, dx, dw, n, DType::bf16, /*deterministic=*/true, s);
}

}  // namespace mt::lab::silu_v5
