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

#include "core/dtype.h"
#include "core/error.h"

namespace mt::cuda {

// Calls f(T{}) with T the CUDA type of a floating dtype: f32, bf16, f16, and f64 when kWithF64
// (kernels that exist only for the training dtypes pass false, and are never built for double).
template <bool kWithF64 = true, class F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(__nv_bfloat16{}); return;
    case DType::f16: f(__half{}); return;
    case DType::f64:
      if constexpr (kWithF64) {
        f(double{});
        return;
      }
      break;
    default: break;
  }
  MT_THROW(op, ": unsupported dtype ", dtype_name(dt),
           kWithF64 ? " (expected f32, bf16, f16, f64)" : " (expected f32, bf16, f16)");
}

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
