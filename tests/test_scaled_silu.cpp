// scaled_silu on the CPU: gradient check (x and the scalar w), += semantics, inplace rules,
// non-contiguous inputs and upstream gradients, 16-bit rounding.
#include <gtest/gtest.h>

#include "core/autograd.h"
#include "ops/elementwise/elementwise.h"
#include "ops/scaled_silu/scaled_silu.h"
#include "tests/gradcheck.h"
#include "tests/f64_reference.h"

using namespace mt;
using mt::test::expect_gradcheck;
using mt::test::random_leaf;
using mt::test::expect_near_reference;
using mt::test::unit_roundoff;

TEST(ScaledSiLU, GradientCheckForXAndScalarW) {
  manual_seed(1);
  for (Shape shape : {Shape{1}, Shape{7}, Shape{3, 37}}) {
    Tensor x = random_leaf(shape, -4, 4), w = random_leaf({1}, 0.3, 2.0);
    expect_gradcheck([](auto& in) { return scaled_silu(in[0], in[1]); }, {x, w},
                     "scaled_silu " + shape_str(shape));
  }
}

TEST(ScaledSiLU, ForwardMatchesTheFormula) {
  Tensor x = from_vector(std::vector<double>{-2, 0, 0.5, 3}, {4}, DType::f64);
  Tensor w = full({1}, 1.5, DType::f64);
  auto y = scaled_silu(x, w).to_vector();
  auto xv = x.to_vector();
  for (size_t i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(y[i], 1.5 * xv[i] / (1 + std::exp(-xv[i])));
}

// The accumulation contract for both parameters: x (returned gradient, accumulated by the
// engine) and w (added straight into .grad through the grad sink).
TEST(ScaledSiLUAccumulation, BackwardTwiceIsTwiceOneBackward) {
  manual_seed(2);
  Tensor x = random_leaf({33}), w = random_leaf({1}, 0.5, 1.5);
  sum(scaled_silu(x, w)).backward();
  auto gx1 = x.grad().to_vector();
  double gw1 = w.grad().item();
  sum(scaled_silu(x, w)).backward();
  auto gx2 = x.grad().to_vector();
  for (size_t i = 0; i < gx1.size(); ++i) EXPECT_DOUBLE_EQ(gx2[i], 2 * gx1[i]);
  EXPECT_DOUBLE_EQ(w.grad().item(), 2 * gw1);
}

TEST(ScaledSiLUAccumulation, MicrobatchAThenBLeavesTheSumAndZeroGradResets) {
  manual_seed(3);
  Tensor w = random_leaf({1}, 0.5, 1.5);
  Tensor a = random_leaf({20}, -2, 2, false), b = random_leaf({13}, -2, 2, false);
  auto grad_of = [&](const Tensor& x) {
    w.zero_grad();
    sum(scaled_silu(x, w)).backward();
    return w.grad().item();
  };
  double ga = grad_of(a), gb = grad_of(b);
  w.zero_grad();
  sum(scaled_silu(a, w)).backward();
  {
    NoGradGuard eval;  // an evaluation between microbatches must not disturb .grad
    scaled_silu(b, w);
  }
  sum(scaled_silu(b, w)).backward();
  EXPECT_NEAR(w.grad().item(), ga + gb, 1e-12);
  w.zero_grad();
  sum(scaled_silu(b, w)).backward();
  EXPECT_DOUBLE_EQ(w.grad().item(), gb);
}

TEST(ScaledSiLU, InplaceWorksWithoutGradAndIsAnErrorWithIt) {
  Tensor x = from_vector(std::vector<double>{1, -1}, {2}, DType::f64);
  Tensor w = full({1}, 2.0, DType::f64);
  uint64_t v0 = x.version();
  Tensor y = scaled_silu(x, w, /*inplace=*/true);
  EXPECT_EQ(y.data_ptr(), x.data_ptr());
  EXPECT_EQ(x.version(), v0 + 1);
  EXPECT_DOUBLE_EQ(x.to_vector()[0], 2.0 / (1 + std::exp(-1.0)));
  Tensor xg = random_leaf({2});
  try {
    scaled_silu(xg, w, true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inplace=true while a gradient is needed"), std::string::npos);
  }
}

// The lesson's third trap: strided inputs and upstream gradients must give the gradients their
// contiguous copies give.
TEST(ScaledSiLUTrap3, NonContiguousInputAndUpstreamGradientMatchContiguous) {
  manual_seed(4);
  Tensor base = random_leaf({6, 5});
  Tensor w = random_leaf({1}, 0.5, 1.5);
  Tensor seed = rand({5, 6}, DType::f64);
  scaled_silu(base.t(), w).backward(seed);  // x is a transposed view
  auto g_strided = base.grad().to_vector();
  double gw_strided = w.grad().item();
  base.zero_grad();
  w.zero_grad();
  Tensor y = scaled_silu(base, w);
  y.backward(seed.t().contiguous());
  EXPECT_EQ(base.grad().to_vector(), g_strided);
  EXPECT_NEAR(w.grad().item(), gw_strided, 1e-12);
  // A strided upstream gradient.
  base.zero_grad();
  scaled_silu(base, w).backward(seed.t());
  EXPECT_EQ(base.grad().to_vector(), g_strided);
}

TEST(ScaledSiLU, SixteenBitComputesInFp32AndRoundsOnce) {
  manual_seed(5);
  Tensor x32 = rand({100}, DType::f32);
  Tensor w = full({1}, 1.25, DType::f32);
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor x16 = x32.to(t);
    auto y16 = scaled_silu(x16, w).to_vector();
    auto y32 = scaled_silu(x16.to(DType::f32), w).to(t).to_vector();  // fp32 math, one rounding
    EXPECT_EQ(y16, y32) << dtype_name(t);
    // The math: f64 on the same rounded x, to within one rounding of the output.
    expect_near_reference(scaled_silu(x16, w), scaled_silu(x16.to(DType::f64), w.to(DType::f64)),
                          2 * unit_roundoff(t), dtype_name(t));
  }
}

TEST(ScaledSiLU, BadArgumentsAreClearErrors) {
  Tensor x = random_leaf({3});
  EXPECT_THROW(scaled_silu(x, random_leaf({2})), Error);
  EXPECT_THROW(scaled_silu(x, full({1}, 1.0, DType::f32)), Error);  // f64 x needs an f64 w
}
