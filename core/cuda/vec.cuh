#pragma once
// Device helpers every CUDA kernel file shares: the 16-byte pack that bandwidth-bound kernels move
// per thread, and the conversions between fp32 and the 16-bit float types. Rounding down is to
// nearest even (__float2bfloat16_rn / __float2half_rn), the same bits as core/dtype.h's
// float_to_bf16 / float_to_f16 on the CPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace mt::cuda {

// V elements moved as one aligned access: 16 bytes when V = 16 / sizeof(T).
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// The type arithmetic happens in: f64 for f64, fp32 for everything else.
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Any pair among f32, f64, bf16, f16, i32, i64, with one rounding: a 16-bit source widens exactly
// to fp32 first; f64 narrows to bf16/f16 directly (through fp32 it would round twice).
template <class D, class S>
__device__ __forceinline__ D convert(S x) {
  if constexpr (std::is_same_v<D, S>) {
    return x;
  } else if constexpr (std::is_same_v<S, __nv_bfloat16> || std::is_same_v<S, __half>) {
    return convert<D>(to_float(x));
  } else if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    if constexpr (std::is_same_v<S, double>) return __double2bfloat16(x);
    else return from_float<D>(float(x));
  } else if constexpr (std::is_same_v<D, __half>) {
    if constexpr (std::is_same_v<S, double>) return __double2half(x);
    else return from_float<D>(float(x));
  } else {
    return D(x);  // among float, double, int32, int64: C++ conversion (round to nearest)
  }
}

template <class T>
__device__ __forceinline__ Acc<T> widen(T x) { return convert<Acc<T>>(x); }

inline bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace mt::cuda
