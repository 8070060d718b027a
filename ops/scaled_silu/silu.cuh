#pragma once
// The SiLU device math that scaled_silu and the fused rms_norm_scaled_silu share, so both round
// the same way.

namespace mt::cuda {

// sigmoid on the special-function unit (__expf, __fdividef): a few ulp in fp32, see
// scaled_silu.cu.
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

// d/dx (x s) = s + x s (1 - s), written as s (1 + x (1 - s)): one multiply fewer.
__device__ __forceinline__ float silu_grad(float x, float s) { return s * (1.0f + x * (1.0f - s)); }

}  // namespace mt::cuda
