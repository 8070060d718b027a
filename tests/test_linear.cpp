// linear on the CPU: gradient checks for x, W and b, the forward against a naive loop, the +=
// contract for W and b, strided inputs, 16-bit and mixed precision, misuse errors.
#include <gtest/gtest.h>

#include "core/autograd.h"
#include "ops/elementwise/elementwise.h"
#include "ops/linear/linear.h"
#include "tests/expect_error.h"
#include "tests/gradcheck.h"
#include "tests/f64_reference.h"

using namespace mt;
using mt::test::expect_error;
using mt::test::expect_gradcheck;
using mt::test::random_leaf;
using mt::test::expect_near_reference;
using mt::test::unit_roundoff;

namespace {

// y[i, n] = b[n] + Σ_k x[i, k]·W[n, k], written out: the forward's oracle.
std::vector<double> naive_linear(const Tensor& x, const Tensor& W, const Tensor& b) {
  const int64_t N = W.size(0), K = W.size(1), M = x.numel() / K;
  const auto xv = x.to_vector(), wv = W.to_vector();
  const auto bv = b.defined() ? b.to_vector() : std::vector<double>(size_t(N), 0.0);
  std::vector<double> y;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) {
      double s = bv[size_t(n)];
      for (int64_t k = 0; k < K; ++k) s += xv[size_t(i * K + k)] * wv[size_t(n * K + k)];
      y.push_back(s);
    }
  return y;
}

std::vector<std::vector<double>> grads_of(const std::vector<Tensor>& params) {
  std::vector<std::vector<double>> g;
  for (const Tensor& p : params) g.push_back(p.grad().to_vector());
  return g;
}

}  // namespace

TEST(Linear, GradientCheckForXWAndB) {
  manual_seed(1);
  struct Case {
    Shape x;
    int64_t N;
    bool bias;
  };
  for (const Case& c : {Case{{7, 13}, 5, true}, Case{{7, 13}, 5, false}, Case{{1, 1}, 1, true},
                        Case{{2, 3, 13}, 5, true}, Case{{13}, 3, true}}) {
    std::vector<Tensor> in{random_leaf(c.x), random_leaf({c.N, c.x.back()})};
    if (c.bias) in.push_back(random_leaf({c.N}));
    expect_gradcheck([](auto& v) { return linear(v[0], v[1], v.size() > 2 ? v[2] : Tensor()); }, in,
                     "linear x " + shape_str(c.x) + " N " + std::to_string(c.N) +
                         (c.bias ? " with bias" : " without bias"));
  }
}

TEST(Linear, ForwardMatchesTheNaiveFormulaAndKeepsLeadingDims) {
  manual_seed(2);
  Tensor x = random_leaf({2, 3, 13}, -2, 2, false), W = random_leaf({5, 13}, -2, 2, false);
  Tensor b = random_leaf({5}, -2, 2, false);
  for (const Tensor& bias : {b, Tensor()}) {
    Tensor y = linear(x, W, bias);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
    const auto expect = naive_linear(x, W, bias), got = y.to_vector();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expect[i], 1e-12) << i;
  }
}

// An empty microbatch (M = 0) and an empty input (K = 0) are legal GEMMs: nothing to add, and the
// bias alone when there is nothing to multiply.
TEST(Linear, EmptyDimensionsAreLegal) {
  Tensor W = random_leaf({5, 13}), b = random_leaf({5});
  Tensor y = linear(random_leaf({0, 13}), W, b);
  EXPECT_EQ(y.shape(), (Shape{0, 5}));
  y.backward(zeros({0, 5}, DType::f64));
  for (double g : W.grad().to_vector()) EXPECT_EQ(g, 0.0);
  for (double g : b.grad().to_vector()) EXPECT_EQ(g, 0.0);
  Tensor x0 = random_leaf({3, 0}), W0 = random_leaf({5, 0});
  Tensor y0 = linear(x0, W0, b);
  const auto bv = b.to_vector(), y0v = y0.to_vector();
  for (size_t i = 0; i < y0v.size(); ++i) EXPECT_EQ(y0v[i], bv[i % 5]);
  y0.backward(ones({3, 5}, DType::f64));
  EXPECT_EQ(x0.grad().numel(), 0);
}

// The accumulation contract for all three: x (returned, accumulated by the engine), W and b
// (added straight into .grad through the grad sinks).
TEST(LinearAccumulation, BackwardTwiceIsTwiceOneBackward) {
  manual_seed(3);
  Tensor x = random_leaf({7, 13}), W = random_leaf({5, 13}), b = random_leaf({5});
  Tensor seed = rand({7, 5}, DType::f64);
  linear(x, W, b).backward(seed);
  const auto once = grads_of({x, W, b});
  linear(x, W, b).backward(seed);
  const auto twice = grads_of({x, W, b});
  for (size_t p = 0; p < once.size(); ++p)
    for (size_t i = 0; i < once[p].size(); ++i)
      EXPECT_EQ(twice[p][i], 2 * once[p][i]) << "parameter " << p << " element " << i;
}

TEST(LinearAccumulation, MicrobatchAThenBIsTheSumAndZeroGradResets) {
  manual_seed(4);
  Tensor W = random_leaf({5, 13}), b = random_leaf({5});
  Tensor xa = random_leaf({7, 13}, -2, 2, false), xb = random_leaf({4, 13}, -2, 2, false);
  Tensor sa = rand({7, 5}, DType::f64), sb = rand({4, 5}, DType::f64);
  auto zero = [&] { W.zero_grad(); b.zero_grad(); };
  zero();
  linear(xa, W, b).backward(sa);
  const auto ga = grads_of({W, b});
  zero();
  linear(xb, W, b).backward(sb);
  const auto gb = grads_of({W, b});

  zero();
  linear(xa, W, b).backward(sa);
  {
    NoGradGuard eval;  // an evaluation between microbatches must not disturb .grad
    linear(xb, W, b);
  }
  EXPECT_EQ(grads_of({W, b}), ga);
  linear(xb, W, b).backward(sb);
  const auto sum_ab = grads_of({W, b});
  for (size_t p = 0; p < 2; ++p)
    for (size_t i = 0; i < ga[p].size(); ++i) EXPECT_DOUBLE_EQ(sum_ab[p][i], ga[p][i] + gb[p][i]);

  zero();
  linear(xb, W, b).backward(sb);
  EXPECT_EQ(grads_of({W, b}), gb);
}

// The lesson's third trap: strided inputs and upstream gradients must give the gradients their
// contiguous copies give. W as a transposed view is also a non-leaf, so its gradient takes the
// returned (not sunk) path.
TEST(LinearTrap3, NonContiguousInputsAndUpstreamGradientMatchContiguous) {
  manual_seed(5);
  Tensor xt = random_leaf({13, 7}), Wt = random_leaf({13, 5}), b = random_leaf({5});
  Tensor seed = rand({5, 7}, DType::f64);
  linear(xt.t(), Wt.t(), b).backward(seed.t());
  const auto gx = xt.grad().to_vector(), gW = Wt.grad().to_vector(), gb = b.grad().to_vector();

  Tensor x = xt.detach().t().contiguous(), W = Wt.detach().t().contiguous();
  x.set_requires_grad();
  W.set_requires_grad();
  b.zero_grad();
  linear(x, W, b).backward(seed.t().contiguous());
  EXPECT_EQ(x.grad().t().to_vector(), gx);
  EXPECT_EQ(W.grad().t().to_vector(), gW);
  EXPECT_EQ(b.grad().to_vector(), gb);
}

TEST(Linear, SixteenBitForwardIsFp32MathOnTheRoundedInputsRoundedOnce) {
  manual_seed(6);
  Tensor x32 = randn({7, 13}), W32 = randn({5, 13}), b32 = randn({5});
  auto up = [](const Tensor& t) { return t.to(DType::f32); };
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor x16 = x32.to(t), W16 = W32.to(t), b16 = b32.to(t);
    EXPECT_EQ(linear(x16, W16, b16).to_vector(),
              linear(up(x16), up(W16), up(b16)).to(t).to_vector()) << dtype_name(t);
    // The math, not only the rounding: the f64 product of the same rounded values, to within
    // one rounding of the output (2u for the fp32 sum in between).
    auto f64 = [](const Tensor& v) { return v.to(DType::f64); };
    expect_near_reference(linear(x16, W16, b16), linear(f64(x16), f64(W16), f64(b16)),
                          2 * unit_roundoff(t), std::string("linear ") + dtype_name(t));
    expect_near_reference(linear(x16, W32, b32), linear(f64(x16), f64(W16), f64(b32)),
                          2 * unit_roundoff(t), std::string("linear mixed ") + dtype_name(t));
    // Mixed precision: f32 master W and b; the GEMM reads W in x's dtype.
    const auto mixed = linear(up(x16), up(W16), b32).to(t).to_vector();
    EXPECT_EQ(linear(x16, W32, b32).to_vector(), mixed) << dtype_name(t);
    EXPECT_EQ(linear(x16, W32, b32, W16).to_vector(), mixed) << dtype_name(t);
    // W_compute, when given, is what the GEMM reads (the optimizer keeps it equal to W's cast).
    Tensor other = randn({5, 13}).to(t);
    EXPECT_EQ(linear(x16, W32, b32, other).to_vector(),
              linear(up(x16), up(other), b32).to(t).to_vector()) << dtype_name(t);
  }
}

TEST(LinearMixedPrecision, Fp32GradientsFromTheUpcastInputsAccumulate) {
  manual_seed(7);
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor x = randn({7, 13}).to(t), W = randn({5, 13}), b = randn({5});
    for (Tensor* p : {&x, &W, &b}) p->set_requires_grad();
    Tensor seed = randn({7, 5}).to(t);
    linear(x, W, b).backward(seed);
    for (const Tensor& p : {x, W, b}) EXPECT_EQ(p.grad().dtype(), DType::f32) << dtype_name(t);

    // The reference: f32 throughout, on the values the 16-bit GEMMs read.
    Tensor xr = x.detach().to(DType::f32), Wr = W.detach().to(t).to(DType::f32);
    Tensor br = b.detach().clone();
    for (Tensor* p : {&xr, &Wr, &br}) p->set_requires_grad();
    linear(xr, Wr, br).backward(seed.to(DType::f32));
    EXPECT_EQ(W.grad().to_vector(), Wr.grad().to_vector()) << dtype_name(t);
    EXPECT_EQ(b.grad().to_vector(), br.grad().to_vector()) << dtype_name(t);
    EXPECT_EQ(x.grad().to_vector(), xr.grad().to(t).to_vector()) << dtype_name(t);  // rounded once
    // Against f64 on the same rounded values: dW and db are fp32 sums, dx is rounded to t once.
    Tensor x64 = x.detach().to(DType::f64), W64 = W.detach().to(t).to(DType::f64);
    Tensor b64 = b.detach().to(DType::f64);
    for (Tensor* p : {&x64, &W64, &b64}) p->set_requires_grad();
    linear(x64, W64, b64).backward(seed.to(DType::f64));
    expect_near_reference(W.grad(), W64.grad(), 1e-5, std::string("dW ") + dtype_name(t));
    expect_near_reference(b.grad(), b64.grad(), 1e-5, std::string("db ") + dtype_name(t));
    expect_near_reference(x.grad(), x64.grad(), 2 * unit_roundoff(t),
                          std::string("dx ") + dtype_name(t));

    // A second microbatch, this time with the optimizer's compute copy, adds into the f32 .grad.
    const auto gW = W.grad().to_vector(), gb = b.grad().to_vector();
    linear(x, W, b, W.detach().to(t)).backward(seed);
    const auto gW2 = W.grad().to_vector(), gb2 = b.grad().to_vector();
    for (size_t i = 0; i < gW.size(); ++i) EXPECT_EQ(gW2[i], 2 * gW[i]);
    for (size_t i = 0; i < gb.size(); ++i) EXPECT_EQ(gb2[i], 2 * gb[i]);
  }
}

TEST(Linear, BadArgumentsAreClearErrors) {
  Tensor x = random_leaf({7, 13}), W = random_leaf({5, 13});
  expect_error([&] { linear(x, random_leaf({5, 12})); },
               {"linear", "x", "W", "[7, 13]", "[5, 12]"});
  expect_error([&] { linear(x, random_leaf({13})); }, {"linear", "W", "[13]"});
  expect_error([&] { linear(random_leaf({}), W); }, {"linear", "x", "[]"});
  expect_error([&] { linear(x, W, random_leaf({4})); }, {"linear", "b", "[4]", "[5, 13]"});
  expect_error([&] { linear(x, W, ones({5})); }, {"linear", "b", "f32", "f64"});
  expect_error([&] { linear(ones({7, 13}), W); },
               {"linear", "x", "W", "f32", "f64", "[7, 13]", "[5, 13]"});
  expect_error([&] { linear(ones({7, 13}, DType::i64), ones({5, 13}, DType::i64)); },
               {"linear", "x", "i64"});
  Tensor x16 = ones({7, 13}, DType::bf16), W32 = ones({5, 13});
  expect_error([&] { linear(x16, W32.to(DType::f16)); }, {"linear", "bf16", "f16"});
  expect_error([&] { linear(x16, W32, Tensor(), W32); }, {"linear", "W_compute", "f32", "bf16"});
  expect_error([&] { linear(x16, W32, Tensor(), ones({5, 12}, DType::bf16)); },
               {"linear", "W_compute", "[5, 12]", "[5, 13]"});
  expect_error([&] { linear(ones({7, 13}), W32, Tensor(), x16); },
               {"linear", "W_compute", "mixed precision"});
}
