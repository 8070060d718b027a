#pragma once
// The GELU formulas (gelu.h) shared by the CPU reference and the CUDA kernels, so both compute
// the same expression in the same order. A is the accumulation type: float, or double for f64.
//
// The tanh form is computed as x · σ(2u) (gelu.h): one exponential and one division, where
// tanh would cost a polynomial and an exponential. In CUDA kernels whose math is fp32, σ is
// scaled_silu's sigmoid on the special-function unit (__expf and __fdividef, a few ulp: far below
// a bf16 rounding), so the forward stays a map that memory, not arithmetic, limits; on the CPU and
// in f64 it is std::exp and the rounded division.
#include <cmath>
#include <type_traits>

#ifdef __CUDACC__
#include "ops/scaled_silu/silu.cuh"  // mt::cuda::sigmoid
#define MT_GELU_HD __host__ __device__ __forceinline__
#else
#define MT_GELU_HD inline
#endif

namespace mt::gelu_math {

constexpr double kSqrt2OverPi = 0.7978845608028654;   // √(2/π)
constexpr double kCubic = 0.044715;
constexpr double kInvSqrt2 = 0.7071067811865476;      // 1/√2
constexpr double kInvSqrt2Pi = 0.3989422804014327;    // 1/√(2π)

// σ(2u) = ½ (1 + tanh u), u = √(2/π) (x + 0.044715 x³).
template <class A>
MT_GELU_HD A tanh_sigmoid(A x) {
  const A u = A(kSqrt2OverPi) * (x + A(kCubic) * x * x * x);
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<A, float>) return cuda::sigmoid(A(2) * u);
#endif
  return A(1) / (A(1) + std::exp(A(-2) * u));
}

template <class A>
MT_GELU_HD A tanh_forward(A x) {
  return x * tanh_sigmoid(x);
}

// dy/dx of the tanh form: σ + 2 x σ (1 − σ) du/dx, σ = σ(2u).
template <class A>
MT_GELU_HD A tanh_grad(A x) {
  const A s = tanh_sigmoid(x);
  const A du = A(kSqrt2OverPi) * (A(1) + A(3 * kCubic) * x * x);
  return s + A(2) * x * s * (A(1) - s) * du;
}

template <class A>
MT_GELU_HD A erf_forward(A x) {
  return A(0.5) * x * (A(1) + std::erf(x * A(kInvSqrt2)));
}

// dy/dx of the exact form: Φ(x) + x φ(x).
template <class A>
MT_GELU_HD A erf_grad(A x) {
  return A(0.5) * (A(1) + std::erf(x * A(kInvSqrt2))) +
         x * A(kInvSqrt2Pi) * std::exp(A(-0.5) * x * x);
}

}  // namespace mt::gelu_math
