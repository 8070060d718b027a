#pragma once
// 2^x on the special-function unit, for kernels whose exponentials are their inner loop
// (attention's online softmax, cross-entropy's log-sum-exp): one ex2.approx with denormal results
// flushed to zero, where exp2f's library code adds range handling and expf a range reduction.
// Relative error about 2^-22; 2^−∞ = 0. exp(x) is fast_exp2(x · kLog2e), and ln y = log2 y · kLn2.

namespace mt::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace mt::cuda
