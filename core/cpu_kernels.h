#pragma once
// Helpers for the CPU reference kernels: typed element access and a dtype switch.
//
// CPU kernels are plain loops over contiguous buffers. They compute in `acc_t<T>`: double for f64
// (gradient checks) and float for f32, bf16 and f16, the same fp32 math the CUDA kernels do, so
// 16-bit results round the same way on both devices.
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"

namespace mt::cpu {

template <class T> using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

inline float to_acc(float v) { return v; }
inline double to_acc(double v) { return v; }
inline float to_acc(bf16 v) { return bf16_to_float(v); }
inline float to_acc(f16 v) { return f16_to_float(v); }

template <class T> T from_acc(acc_t<T> v);
template <> inline double from_acc<double>(double v) { return v; }
template <> inline float from_acc<float>(float v) { return v; }
template <> inline bf16 from_acc<bf16>(float v) { return float_to_bf16(v); }
template <> inline f16 from_acc<f16>(float v) { return float_to_f16(v); }

// Runs body with `scalar_t` bound to the C++ type of a floating dtype.
#define MT_DISPATCH_FLOATING(dtype, op, ...)                                           \
  [&] {                                                                                \
    switch (dtype) {                                                                   \
      case ::mt::DType::f64: { using scalar_t = double; return __VA_ARGS__(); }        \
      case ::mt::DType::f32: { using scalar_t = float; return __VA_ARGS__(); }         \
      case ::mt::DType::bf16: { using scalar_t = ::mt::bf16; return __VA_ARGS__(); }   \
      case ::mt::DType::f16: { using scalar_t = ::mt::f16; return __VA_ARGS__(); }     \
      default: MT_THROW(op, ": expected a floating-point dtype, got ", ::mt::dtype_name(dtype)); \
    }                                                                                  \
  }()

}  // namespace mt::cpu
