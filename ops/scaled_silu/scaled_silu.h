#pragma once
// scaled_silu: y = w · x · σ(x), with w a learnable scalar and σ the logistic sigmoid.
//
// Gradients (s = σ(x)):
//   dx = dy · w · (s + x · s · (1 − s))          elementwise, '=' into a new tensor, input dtype
//   dw = Σ dy · x · s                             a reduction over every element, '+=' in fp32
//                                                 (f64 for f64 inputs) into w's .grad (grad sink)
//
// Saved vs recomputed: backward saves x and w (its inputs, which it cannot regenerate) and
// RECOMPUTES s = σ(x): one exp per element is cheaper than writing and re-reading a tensor of s
// (the lesson's save-vs-recompute crossover: a 4-byte round trip to memory costs as much time as
// about 61 flops per element at the H200's fp32 rate, bench/crossover.h's figures, which
// docs/README.md tabulates and DocNumbers tests; a sigmoid is fewer).
//
// Grids (CUDA, ops/scaled_silu/scaled_silu.cu): forward is one elementwise map, grid-stride over
// 16-byte vectors. Backward is NOT the same grid: dx mirrors the forward map, and dw is a reduce:
// each block writes one fp32 partial, then one block sums the partials in a fixed order
// (deterministic; `set_deterministic(false)` switches to one atomicAdd per block, for comparison).
//
// inplace = true overwrites x with y (saving a buffer at inference). It is a non-differentiable
// argument (its gradient slot is {}), and using it while a gradient is needed is an error: the
// backward needs the original x.
#include "core/tensor.h"

namespace mt {

// x: any shape, f64/f32/bf16/f16. w: one element, f64 for f64 x and f32 otherwise.
Tensor scaled_silu(const Tensor& x, const Tensor& w, bool inplace = false);

// The kernels every backend registers (inputs contiguous, outputs allocated by the caller).
// forward: y = w·x·σ(x), y ('=') like x.
using ScaledSiLUForwardFn = void(const Tensor& x, const Tensor& w, const Tensor& y);
// backward: dx ('=', like x; undefined = not needed) and dw ('+=', w's grad dtype, one element;
// undefined = not needed).
using ScaledSiLUBackwardFn = void(const Tensor& x, const Tensor& w, const Tensor& dy,
                                  const Tensor& dx, const Tensor& dw);

}  // namespace mt
