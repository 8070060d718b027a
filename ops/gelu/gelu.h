#pragma once
// gelu: the Gaussian error linear unit, y = x · Φ(x), Φ the standard normal CDF, elementwise.
//
//   erf   (exact)      y = ½ x (1 + erf(x / √2))
//                      dy/dx = Φ(x) + x φ(x),           φ(x) = e^(−x²/2) / √(2π)
//   tanh  (GPT-2's)    u = √(2/π) (x + 0.044715 x³),  t = tanh u
//                      y = ½ x (1 + t)
//                      dy/dx = ½ (1 + t) + ½ x (1 − t²) √(2/π) (1 + 3 · 0.044715 x²)
//                      computed as y = x σ(2u), σ(z) = 1 / (1 + e^−z), the same function
//                      (½ (1 + tanh u) = σ(2u)): dy/dx = σ + 2 x σ (1 − σ) du/dx
//   dx = dy · dy/dx                                       '=' into a new tensor, x's dtype
//
// Saved vs recomputed: x is saved (the input: nothing else can give it back) and σ (or Φ, φ) is
// RECOMPUTED in the backward: one exp or erf per element is free in a kernel that waits on
// memory, while saving it would add a write to the forward and a read to the backward (2 bytes
// per element each in bf16), a third more traffic for both.
//
// Grids (CUDA, gelu.cu): both passes are the grid-stride map of core/cuda/map.cuh, 256 threads a
// block, a few waves of blocks (what fits on the GPU at once, times 4), each thread loading two
// 16-byte packs (8 bf16/f16, 4 f32) of each input before it computes either, so loads stay in
// flight under the arithmetic: the forward reads x and writes y, the backward reads x and dy and writes
// dx. No reduction, so nothing is added into: y and dx are written with '=', and the bits never
// depend on the grid. Math in fp32 (f64 for f64), each result rounded once to the dtype.
#include <cstdint>

#include "core/tensor.h"

namespace mt {

enum class GeluApprox : uint8_t { Tanh, Erf };

// x: any shape, f64/f32/bf16/f16. approx: Tanh (the default, GPT-2's) or Erf (exact).
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::Tanh);

// The kernels every backend registers (x, dy contiguous; outputs allocated by the caller).
using GeluForwardFn = void(const Tensor& x, GeluApprox approx, const Tensor& y);
using GeluBackwardFn = void(const Tensor& x, const Tensor& dy, GeluApprox approx,
                            const Tensor& dx);

}  // namespace mt
