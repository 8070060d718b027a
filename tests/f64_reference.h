#pragma once
// 16-bit (and f32) results against an independent f64 reference, with a tolerance scaled to the
// dtype's precision. Comparing a bf16 op with the same op on f32 inputs checks only the rounding:
// a wrong formula shared by both paths would pass. The f64 reference is the f64 op on the
// already-rounded inputs (the f64 kernels are gradient-checked against finite differences), so
// what remains is the error of the 16-bit path itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/tensor.h"

namespace mt::test {

// Half the spacing of the dtype's values just above 1: the largest relative error of one rounding.
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::bf16: return 0x1p-8;   // 8 significant bits
    case DType::f16: return 0x1p-11;   // 11
    case DType::f32: return 0x1p-24;
    default: return 0x1p-53;
  }
}

// Every element within rel · max(|ref_i|, rms(ref)) of the reference: relative where the values
// are large, and against the tensor's scale where a sum cancels to near zero.
inline void expect_near_reference(const Tensor& got, const Tensor& ref, double rel,
                                  const std::string& what) {
  const auto g = got.to_vector(), r = ref.to_vector();
  ASSERT_EQ(g.size(), r.size()) << what;
  double ss = 0;
  for (double v : r) ss += v * v;
  const double rms = std::sqrt(ss / double(std::max<size_t>(r.size(), 1)));
  ASSERT_GT(rms, 0) << what << ": the reference is all zeros, the comparison would be vacuous";
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_LE(std::abs(g[i] - r[i]), rel * std::max(std::abs(r[i]), rms))
        << what << ": element " << i << " is " << g[i] << ", the f64 reference " << r[i];
}

}  // namespace mt::test
