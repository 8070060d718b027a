#pragma once
// Element types and the CPU conversions between them.
//
// bf16 and f16 are stored as raw 16-bit patterns on the CPU (mt::bf16, mt::f16) and converted
// to and from float with IEEE round-to-nearest-even, so a value rounded here has exactly the bits
// the GPU's __float2bfloat16_rn / __float2half_rn produce. inf and NaN survive both ways; f16
// subnormals are produced and read exactly.
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"

namespace mt {

enum class DType : uint8_t { f64, f32, bf16, f16, i32, i64 };

struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
  }
  MT_THROW("dtype_size: unknown dtype ", int(t));
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

inline bool is_floating(DType t) { return t != DType::i32 && t != DType::i64; }

// Parses "f32", "bf16", ... (the names dtype_name prints); throws on anything else.
DType dtype_from_name(const std::string& name);

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// float -> bf16: keep the top 16 bits, rounding the dropped 16 to nearest, ties to even.
// NaN is kept a (quiet) NaN: rounding could otherwise carry its payload into inf.
inline bf16 float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x0040u)};
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return bf16{uint16_t(u >> 16)};
}
inline float bf16_to_float(bf16 h) { return bits_float(uint32_t(h.bits) << 16); }

// float -> f16 (1 sign, 5 exponent, 10 mantissa bits), round to nearest even, with overflow to
// inf and gradual underflow into f16 subnormals.
inline f16 float_to_f16(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u)};  // NaN
  if (a >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                        // below 2^-14: subnormal or 0
    // value = a as float; the subnormal unit is 2^-24. Shift the full mantissa into place.
    int exp = int(a >> 23);
    if (exp < 102) return f16{sign};  // below half the smallest subnormal: rounds to 0
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    // The value is mant * 2^(exp-150); in units of the subnormal step 2^-24 that is
    // mant >> (126 - exp), the dropped bits rounded to nearest even.
    int shift = 126 - exp;
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return f16{uint16_t(sign | q)};
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
  uint32_t r = a - 0x38000000u;  // exponent - 112, i.e. rebias
  uint32_t lsb = (r >> 13) & 1u;
  r += 0xfffu + lsb;
  return f16{uint16_t(sign | (r >> 13))};
}

inline float f16_to_float(f16 h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    // Subnormal (or zero): mant * 2^-24, exact in float.
    float v = float(mant) * bits_float(0x33800000u);  // 2^-24
    return (sign ? -v : v);
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

#if defined(__CUDACC__)
#define MT_DTYPE_HD __host__ __device__ inline
#else
#define MT_DTYPE_HD inline
#endif

// A real value into an integer type as the GPU's conversion instruction does it (and XLA defines
// it): toward zero, clamped to the type's range, NaN to 0. C++'s plain cast is undefined outside
// the range, so the CPU and CUDA copies between dtypes both go through this.
template <class I>
MT_DTYPE_HD I saturate_to(double v) {
  static_assert(std::numeric_limits<I>::is_integer, "saturate_to converts into integer types");
  constexpr I lo = std::numeric_limits<I>::min(), hi = std::numeric_limits<I>::max();
  if (v != v) return 0;
  if (v <= double(lo)) return lo;
  if (v >= double(hi)) return hi;  // double(hi) of int64 is 2^63, itself out of range
  return I(v);
}

#undef MT_DTYPE_HD

}  // namespace mt
