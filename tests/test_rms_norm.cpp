// rms_norm on the CPU: gradient checks for x and weight, the forward against the formula, the +=
// contract for weight, strided inputs, 16-bit rounding, misuse errors.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "ops/rms_norm/rms_norm.h"
#include "tests/expect_error.h"
#include "tests/gradcheck.h"
#include "tests/f64_reference.h"

using namespace mt;
using mt::test::expect_error;
using mt::test::expect_gradcheck;
using mt::test::random_leaf;
using mt::test::expect_near_reference;
using mt::test::unit_roundoff;

TEST(RMSNorm, GradientCheckForXAndWeight) {
  manual_seed(1);
  for (Shape shape : {Shape{3, 1}, Shape{3, 33}, Shape{2, 3, 5}}) {
    Tensor x = random_leaf(shape), w = random_leaf({shape.back()}, 0.5, 1.5);
    expect_gradcheck([](auto& in) { return rms_norm(in[0], in[1]); }, {x, w},
                     "rms_norm " + shape_str(shape));
  }
}

TEST(RMSNorm, ForwardMatchesTheFormula) {
  manual_seed(2);
  const double eps = 1e-3;
  Tensor x = random_leaf({4, 7}, -2, 2, false), w = random_leaf({7}, 0.5, 1.5, false);
  const auto xv = x.to_vector(), wv = w.to_vector(), y = rms_norm(x, w, eps).to_vector();
  for (size_t r = 0; r < 4; ++r) {
    double ms = 0;
    for (size_t j = 0; j < 7; ++j) ms += xv[r * 7 + j] * xv[r * 7 + j] / 7;
    for (size_t j = 0; j < 7; ++j)
      EXPECT_NEAR(y[r * 7 + j], xv[r * 7 + j] / std::sqrt(ms + eps) * wv[j], 1e-14);
  }
}

TEST(RMSNormAccumulation, BackwardTwiceIsTwiceOneBackward) {
  manual_seed(3);
  Tensor x = random_leaf({3, 33}), w = random_leaf({33}, 0.5, 1.5);
  Tensor seed = rand({3, 33}, DType::f64);
  rms_norm(x, w).backward(seed);
  const auto gx = x.grad().to_vector(), gw = w.grad().to_vector();
  rms_norm(x, w).backward(seed);
  const auto gx2 = x.grad().to_vector(), gw2 = w.grad().to_vector();
  for (size_t i = 0; i < gx.size(); ++i) EXPECT_EQ(gx2[i], 2 * gx[i]);
  for (size_t i = 0; i < gw.size(); ++i) EXPECT_EQ(gw2[i], 2 * gw[i]);
}

TEST(RMSNormAccumulation, MicrobatchAThenBIsTheSumAndZeroGradResets) {
  manual_seed(4);
  Tensor w = random_leaf({33}, 0.5, 1.5);
  Tensor xa = random_leaf({5, 33}, -2, 2, false), xb = random_leaf({2, 33}, -2, 2, false);
  Tensor sa = rand({5, 33}, DType::f64), sb = rand({2, 33}, DType::f64);
  w.zero_grad();
  rms_norm(xa, w).backward(sa);
  const auto ga = w.grad().to_vector();
  w.zero_grad();
  rms_norm(xb, w).backward(sb);
  const auto gb = w.grad().to_vector();

  w.zero_grad();
  rms_norm(xa, w).backward(sa);
  {
    NoGradGuard eval;  // an evaluation between microbatches must not disturb .grad
    rms_norm(xb, w);
  }
  EXPECT_EQ(w.grad().to_vector(), ga);
  rms_norm(xb, w).backward(sb);
  const auto sum_ab = w.grad().to_vector();
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_DOUBLE_EQ(sum_ab[i], ga[i] + gb[i]);

  w.zero_grad();
  rms_norm(xb, w).backward(sb);
  EXPECT_EQ(w.grad().to_vector(), gb);
}

TEST(RMSNormTrap3, NonContiguousInputAndUpstreamGradientMatchContiguous) {
  manual_seed(5);
  Tensor xt = random_leaf({33, 3}), w = random_leaf({33}, 0.5, 1.5);
  Tensor seed = rand({33, 3}, DType::f64);
  rms_norm(xt.t(), w).backward(seed.t());  // x [3, 33] and dy are transposed views
  const auto gx = xt.grad().to_vector(), gw = w.grad().to_vector();

  Tensor x = xt.detach().t().contiguous();
  x.set_requires_grad();
  w.zero_grad();
  rms_norm(x, w).backward(seed.t().contiguous());
  EXPECT_EQ(x.grad().t().to_vector(), gx);
  EXPECT_EQ(w.grad().to_vector(), gw);
}

TEST(RMSNorm, SixteenBitIsFp32MathOnTheRoundedInputsRoundedOnce) {
  manual_seed(6);
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor x = randn({4, 33}).to(t), w = rand({33});
    Tensor seed = randn({4, 33}).to(t);
    x.set_requires_grad();
    w.set_requires_grad();
    Tensor y = rms_norm(x, w);
    y.backward(seed);

    Tensor xr = x.detach().to(DType::f32), wr = w.detach().clone();
    xr.set_requires_grad();
    wr.set_requires_grad();
    Tensor yr = rms_norm(xr, wr);
    yr.backward(seed.to(DType::f32));
    EXPECT_EQ(y.to_vector(), yr.to(t).to_vector()) << dtype_name(t);
    EXPECT_EQ(x.grad().to_vector(), xr.grad().to(t).to_vector()) << dtype_name(t);
    EXPECT_EQ(w.grad().dtype(), DType::f32);
    EXPECT_EQ(w.grad().to_vector(), wr.grad().to_vector()) << dtype_name(t);

    // The math: f64 on the same rounded x and seed. y and dx are rounded to t once; dw is an
    // fp32 sum over the rows.
    Tensor x64 = x.detach().to(DType::f64), w64 = w.detach().to(DType::f64);
    x64.set_requires_grad();
    w64.set_requires_grad();
    Tensor y64 = rms_norm(x64, w64);
    y64.backward(seed.to(DType::f64));
    const std::string name = dtype_name(t);
    expect_near_reference(y, y64, 2 * unit_roundoff(t), "y " + name);
    expect_near_reference(x.grad(), x64.grad(), 2 * unit_roundoff(t), "dx " + name);
    expect_near_reference(w.grad(), w64.grad(), 1e-5, "dw " + name);
  }
}

TEST(RMSNorm, BadArgumentsAreClearErrors) {
  Tensor x = random_leaf({3, 33});
  expect_error([&] { rms_norm(x, random_leaf({34})); }, {"rms_norm", "weight", "[34]", "[3, 33]"});
  expect_error([&] { rms_norm(x, random_leaf({3, 33})); }, {"rms_norm", "weight", "[3, 33]"});
  expect_error([&] { rms_norm(x, ones({33})); }, {"rms_norm", "weight", "f64", "f32"});
  expect_error([&] { rms_norm(ones({3, 33}, DType::bf16), ones({33}, DType::bf16)); },
               {"rms_norm", "weight", "f32", "bf16"});
  expect_error([&] { rms_norm(x, random_leaf({33}), -1.0); }, {"rms_norm", "eps", "-1"});
  expect_error([&] { rms_norm(random_leaf({}), random_leaf({1})); }, {"rms_norm", "x", "[]"});
  expect_error([&] { rms_norm(random_leaf({3, 0}), random_leaf({0})); },
               {"rms_norm", "x", "[3, 0]"});
}
