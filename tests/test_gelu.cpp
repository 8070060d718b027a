// gelu on the CPU: gradient checks for both forms, the forward against the formulas, the +=
// contract, 16-bit rounding, and, on a GPU, CUDA against the CPU per dtype.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "ops/elementwise/elementwise.h"
#include "ops/gelu/gelu.h"
#include "tests/expect_error.h"
#include "tests/f64_reference.h"
#include "tests/gradcheck.h"

using namespace mt;
using mt::test::expect_error;
using mt::test::expect_gradcheck;
using mt::test::expect_near_reference;
using mt::test::random_leaf;
using mt::test::unit_roundoff;

TEST(Gelu, GradientCheckForBothForms) {
  manual_seed(1);
  for (GeluApprox a : {GeluApprox::Tanh, GeluApprox::Erf})
    for (Shape shape : {Shape{1}, Shape{7}, Shape{3, 37}}) {
      Tensor x = random_leaf(shape, -5, 5);
      expect_gradcheck([a](auto& in) { return gelu(in[0], a); }, {x},
                       std::string("gelu ") + (a == GeluApprox::Tanh ? "tanh " : "erf ") +
                           shape_str(shape));
    }
}

TEST(Gelu, ForwardMatchesTheFormulas) {
  const std::vector<double> xs{-4, -1.5, -0.25, 0, 0.3, 1, 2.5, 6};
  Tensor x = from_vector(xs, {8}, DType::f64);
  const auto yt = gelu(x).to_vector(), ye = gelu(x, GeluApprox::Erf).to_vector();
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    const double t = std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v));
    EXPECT_NEAR(yt[i], 0.5 * v * (1 + t), 1e-15) << v;
    EXPECT_NEAR(ye[i], v * 0.5 * std::erfc(-v / std::sqrt(2.0)), 1e-15) << v;
  }
  // The two forms agree to about 1e-3 (GPT-2's approximation is close, not equal).
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(yt[i], ye[i], 2e-3);
  EXPECT_NE(yt[1], ye[1]);
}

TEST(GeluAccumulation, BackwardTwiceIsTwiceOneBackward) {
  manual_seed(2);
  Tensor x = random_leaf({5, 9});
  Tensor seed = rand({5, 9}, DType::f64);
  gelu(x).backward(seed);
  const auto g1 = x.grad().to_vector();
  gelu(x).backward(seed);
  const auto g2 = x.grad().to_vector();
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_EQ(g2[i], 2 * g1[i]);
}

TEST(Gelu, SixteenBitIsFp32MathRoundedOnce) {
  manual_seed(3);
  for (DType t : {DType::bf16, DType::f16})
    for (GeluApprox a : {GeluApprox::Tanh, GeluApprox::Erf}) {
      Tensor x = mt::scale(randn({4, 33}), 2.0).to(t);
      Tensor seed = randn({4, 33}).to(t);
      x.set_requires_grad();
      Tensor y = gelu(x, a);
      y.backward(seed);
      Tensor x64 = x.detach().to(DType::f64);
      x64.set_requires_grad();
      Tensor y64 = gelu(x64, a);
      y64.backward(seed.to(DType::f64));
      const std::string name = dtype_name(t);
      expect_near_reference(y, y64, 2 * unit_roundoff(t), "y " + name);
      expect_near_reference(x.grad(), x64.grad(), 2 * unit_roundoff(t), "dx " + name);
    }
}

TEST(Gelu, BadArgumentsAreClearErrors) {
  expect_error([] { gelu(ones({3}, DType::i64)); }, {"gelu", "floating", "i64"});
  expect_error([] { gelu(ones({3}), GeluApprox(7)); }, {"gelu", "approx", "7"});
}
