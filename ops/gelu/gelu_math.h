#pragma once
// The GELU formulas (gelu.h) shared by the CPU reference and the CUDA kernels, so both compute
// the same expression in the same order. A is the accumulation type: float, or double for f64.
#include <cmath>

#ifdef __CUDACC__
#define MT_GELU_HD __host__ __device__ __forceinline__
#else
#define MT_GELU_HD inline
#endif

namespace mt::gelu_math {

constexpr double kSqrt2OverPi = 0.7978845608028654;   // √(2/π)
constexpr double kCubic = 0.044715;
constexpr double kInvSqrt2 = 0.7071067811865476;      // 1/√2
constexpr double kInvSqrt2Pi = 0.3989422804014327;    // 1/√(2π)

template <class A>
MT_GELU_HD A tanh_forward(A x) {
  const A t = std::tanh(A(kSqrt2OverPi) * (x + A(kCubic) * x * x * x));
  return A(0.5) * x * (A(1) + t);
}

// dy/dx of the tanh form.
template <class A>
MT_GELU_HD A tanh_grad(A x) {
  const A t = std::tanh(A(kSqrt2OverPi) * (x + A(kCubic) * x * x * x));
  const A du = A(kSqrt2OverPi) * (A(1) + A(3 * kCubic) * x * x);
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * du;
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
