// The kernel lab's checking code (lab/check.h), on the CPU: its references agree with the
// framework's own ops in f64, and its comparison accepts a correctly rounded result and rejects
// the mistakes a kernel makes (a dropped term, '=' instead of '+=', NaN, a wrong size). The GPU
// side, every lab version against these references, is tests/test_lab_cuda.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "core/dtype.h"
#include "lab/check.h"
#include "ops/elementwise/elementwise.h"
#include "ops/linear/linear.h"
#include "ops/rms_norm/rms_norm.h"
#include "ops/scaled_silu/scaled_silu.h"

using namespace mt;
using namespace mt::lab;

namespace {

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

Tensor f64_leaf(const std::vector<float>& v, const Shape& shape) {
  Tensor t = from_vector(as_double(v), shape, DType::f64);
  t.set_requires_grad();
  return t;
}

std::vector<float> round_to_bf16(const std::vector<double>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(float_to_bf16(float(v[i])));
  return out;
}

void expect_all_near(const std::vector<double>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << what << " [" << i << "]";
}

}  // namespace

TEST(LabCheck, SiluReferenceIsTheOpsGradient) {
  const int64_t n = 777;
  const auto x = random_bf16_values(n, 1, -4, 4), dy = random_bf16_values(n, 2, -1, 1);
  const float w = 0.8125f;
  Tensor xt = f64_leaf(x, {n}), wt = f64_leaf({w}, {1});
  scaled_silu(xt, wt).backward(from_vector(as_double(dy), {n}, DType::f64));
  const SiluGrads r = silu_backward_reference(x, w, dy);
  expect_all_near(r.dx, xt.grad().to_vector(), 1e-12, "dx");
  EXPECT_NEAR(r.dw, wt.grad().item(), 1e-10 * r.dw_scale);
  EXPECT_GT(r.dw_scale, std::abs(r.dw));  // mixed signs: the sum of |terms| is larger
}

TEST(LabCheck, RmsReferenceIsTheOpsGradient) {
  const int64_t rows = 5, d = 67;
  const auto x = random_bf16_values(rows * d, 3, -2, 2), dy = random_bf16_values(rows * d, 4, -1, 1);
  const auto weight = random_bf16_values(d, 5, 0.5f, 1.5f);
  Tensor xt = f64_leaf(x, {rows, d}), wt = f64_leaf(weight, {d});
  rms_norm(xt, wt, 1e-5).backward(from_vector(as_double(dy), {rows, d}, DType::f64));
  const RmsGrads r =
      rms_backward_reference(x, weight, rms_rstd_reference(x, rows, d, 1e-5f), dy, rows, d);
  // The reference reads rstd rounded to fp32, as the GPU does: agreement to fp32's precision.
  expect_all_near(r.dx, xt.grad().to_vector(), 1e-6, "dx");
  expect_all_near(r.dweight, wt.grad().to_vector(), 1e-6, "dweight");
}

// gemm_reference with linear_gemm's layouts is the linear layer's forward and both gradients.
TEST(LabCheck, GemmReferenceIsTheLinearLayer) {
  const int64_t rows = 6, in = 5, out = 4;
  const auto x = random_bf16_values(rows * in, 6, -1, 1), W = random_bf16_values(out * in, 7, -1, 1);
  const auto dy = random_bf16_values(rows * out, 8, -1, 1), dw0 = random_bf16_values(out * in, 9, -1, 1);
  Tensor xt = f64_leaf(x, {rows, in}), Wt = f64_leaf(W, {out, in});
  Tensor y = linear(xt, Wt);
  y.backward(from_vector(as_double(dy), {rows, out}, DType::f64));

  expect_all_near(gemm_reference(linear_gemm(GemmKind::Forward, rows, in, out), x, W, {}, 0).c,
                  y.to_vector(), 1e-12, "forward");
  expect_all_near(gemm_reference(linear_gemm(GemmKind::DX, rows, in, out), dy, W, {}, 0).c,
                  xt.grad().to_vector(), 1e-12, "dX");
  // beta = 1: the .grad's old value plus dYᵀ·X.
  auto dW = gemm_reference(linear_gemm(GemmKind::DW, rows, in, out), dy, x, dw0, 1).c;
  for (size_t i = 0; i < dW.size(); ++i) dW[i] -= dw0[i];
  expect_all_near(dW, Wt.grad().to_vector(), 1e-12, "dW");
}

TEST(LabCheck, CompareAcceptsTheCorrectlyRoundedResult) {
  const GemmShape g{33, 17, 300, false, true};
  const auto a = random_bf16_values(g.M * g.K, 10, -1, 1), b = random_bf16_values(g.K * g.N, 11, -1, 1);
  const GemmResult r = gemm_reference(g, a, b, {}, 0);
  const Check c = compare(round_to_bf16(r.c), r.c, r.scale, kBf16Out, "gemm");
  EXPECT_TRUE(c.ok) << c.message;
  EXPECT_LE(c.worst_ratio, 1.0);
  EXPECT_NE(c.message.find("all 561 elements within bounds"), std::string::npos) << c.message;
}

// The kernel bugs a GEMM or a reduction makes are far outside the bounds.
TEST(LabCheck, CompareRejectsADroppedTermAStoreInsteadOfAddAndNaN) {
  const GemmShape g{20, 24, 300, true, false};
  const auto a = random_bf16_values(g.M * g.K, 12, -1, 1), b = random_bf16_values(g.K * g.N, 13, -1, 1);
  const auto c0 = random_bf16_values(g.M * g.N, 14, -1, 1);
  const GemmResult r = gemm_reference(g, a, b, c0, 1);

  // A loop that stops one step of K early (k = K - 1 is lost), rounded to bf16.
  GemmShape short_k = g;
  short_k.K = g.K - 1;
  std::vector<float> a_short(a.begin(), a.begin() + g.M * short_k.K);  // a_t: [K, M]: the first K-1 rows
  std::vector<float> b_short(b.begin(), b.begin() + short_k.K * g.N);
  const Check dropped = compare(round_to_bf16(gemm_reference(short_k, a_short, b_short, c0, 1).c),
                                r.c, r.scale, kBf16Out, "dropped");
  EXPECT_FALSE(dropped.ok) << dropped.message;
  EXPECT_GT(dropped.bad, g.M * g.N / 2);

  // dW '=' instead of '+=': the .grad's old value lost.
  const Check stored = compare(round_to_bf16(gemm_reference(g, a, b, {}, 0).c), r.c, r.scale,
                               kFp32Out, "stored");
  EXPECT_FALSE(stored.ok) << stored.message;

  std::vector<float> with_nan = round_to_bf16(r.c);
  with_nan[7] = NAN;
  const Check nan = compare(with_nan, r.c, r.scale, kBf16Out, "nan");
  EXPECT_FALSE(nan.ok);
  EXPECT_EQ(nan.bad, 1);
  EXPECT_EQ(nan.worst, 7);
  EXPECT_NE(nan.message.find("1 of 480 elements off; worst [7]"), std::string::npos) << nan.message;
}

TEST(LabCheck, CompareRejectsOneWrongReductionAndAWrongSize) {
  const int64_t n = 1000;
  const auto x = random_bf16_values(n, 15, -4, 4), dy = random_bf16_values(n, 16, -1, 1);
  const SiluGrads r = silu_backward_reference(x, 1.25f, dy);
  // dw summed in fp32 in another order passes; the same sum missing its last element does not.
  float fp32_sum = 0;
  for (int64_t i = 0; i < n; ++i) fp32_sum += float(dy[i] * x[i] / (1 + std::exp(-double(x[i]))));
  const float last = float(dy[n - 1] * x[n - 1] / (1 + std::exp(-double(x[n - 1]))));
  EXPECT_TRUE(compare({fp32_sum}, {r.dw}, {r.dw_scale}, kFp32Out, "dw").ok);
  EXPECT_FALSE(compare({fp32_sum - last}, {r.dw}, {r.dw_scale}, kFp32Out, "dw").ok);

  const Check size = compare(round_to_bf16(r.dx), {1.0, 2.0}, {}, kBf16Out, "dx");
  EXPECT_FALSE(size.ok);
  EXPECT_NE(size.message.find("got 1000 elements, want 2"), std::string::npos) << size.message;
  // An all-zero reference with zero scale demands exact zeros.
  EXPECT_TRUE(compare({0.f}, {0.0}, {0.0}, kBf16Out, "zero").ok);
  EXPECT_FALSE(compare({1e-30f}, {0.0}, {0.0}, kBf16Out, "zero").ok);
}

TEST(LabCheck, ReferencesRefuseInconsistentSizes) {
  EXPECT_THROW(silu_backward_reference({1, 2}, 1, {1}), mt::Error);
  EXPECT_THROW(rms_rstd_reference({1, 2, 3}, 2, 2, 1e-5f), mt::Error);
  EXPECT_THROW(rms_backward_reference({1, 2}, {1}, {1}, {1, 2}, 1, 2), mt::Error);
  EXPECT_THROW(gemm_reference({2, 2, 2, false, false}, {1, 2, 3}, {1, 2, 3, 4}, {}, 0), mt::Error);
  EXPECT_THROW(gemm_reference({2, 2, 2, false, false}, {1, 2, 3, 4}, {1, 2, 3, 4}, {}, 1), mt::Error);
  EXPECT_THROW(attention_forward_reference({1, 2}, {1, 2}, {1}, 1, 1, 2), mt::Error);
  EXPECT_THROW(attention_backward_reference({1, 2}, {1, 2}, {1, 2}, {1}, {0.0}, {1, 2}, 1, 1, 2), mt::Error);
}

// The attention references against each other: the backward reference is the forward's gradient
// (central differences of Σ o·dO in f64, the forward reference run on f64 perturbations).
TEST(LabCheck, AttentionBackwardReferenceIsTheForwardsGradient) {
  const int64_t heads = 2, T = 5, d = 4, n = heads * T * d;
  const auto q = random_bf16_values(n, 41, -1, 1), k = random_bf16_values(n, 42, -1, 1),
             v = random_bf16_values(n, 43, -1, 1), dO = random_bf16_values(n, 44, -1, 1);
  const AttnForward f = attention_forward_reference(q, k, v, heads, T, d);
  const std::vector<float> o(f.o.begin(), f.o.end());  // fp32: close enough to exact for D
  const AttnGrads g = attention_backward_reference(q, k, v, o, f.L, dO, heads, T, d);
  auto loss = [&](const std::vector<float>& qq, const std::vector<float>& kk, const std::vector<float>& vv) {
    const AttnForward r = attention_forward_reference(qq, kk, vv, heads, T, d);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += r.o[i] * dO[i];
    return s;
  };
  // A step that fp32 inputs can hold exactly enough: the check is at the 1e-3 level, far below
  // what a wrong term would change.
  const float h = 1.0f / 256;
  for (int which = 0; which < 3; ++which) {
    const std::vector<double>& want = which == 0 ? g.dq : which == 1 ? g.dk : g.dv;
    for (int64_t i = 0; i < n; i += 3) {
      std::vector<float> in[3] = {q, k, v};
      in[which][i] += h;
      const double up = loss(in[0], in[1], in[2]);
      in[which][i] -= 2 * h;
      const double down = loss(in[0], in[1], in[2]);
      EXPECT_NEAR((up - down) / (2 * h), want[i], 2e-3) << "qkv"[which] << "[" << i << "]";
    }
  }
}

// A kernel that forgets part of the log-sum-exp fails the lab's check: the forward's o with
// P = exp(S − m) (m without ℓ: rows no longer sum to 1), and the backward's gradients with
// P = exp(S) (the − L forgotten).
TEST(LabCheck, AttentionCompareRejectsAForgottenLogSumExp) {
  const int64_t heads = 2, T = 33, d = 32, n = heads * T * d;
  const auto q = random_bf16_values(n, 51, -1, 1), k = random_bf16_values(n, 52, -1, 1),
             v = random_bf16_values(n, 53, -1, 1), dO = random_bf16_values(n, 54, -1, 1);
  const AttnForward f = attention_forward_reference(q, k, v, heads, T, d);
  EXPECT_TRUE(compare(round_to_bf16(f.o), f.o, f.o_scale, kAttnTol, "o").ok);

  // m without ℓ: o_i = Σ_j exp(S_ij − m_i)·v_j = ℓ_i · (the right o_i).
  std::vector<double> L_minus_log_l(f.L.size());
  std::vector<double> no_ell(f.o.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < T; ++i) {
      double m = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += double(q[(h * T + i) * d + c]) * k[(h * T + j) * d + c];
        m = std::max(m, s / std::sqrt(double(d)));
      }
      const double ell = std::exp(f.L[h * T + i] - m);
      L_minus_log_l[h * T + i] = m;
      for (int64_t c = 0; c < d; ++c) no_ell[(h * T + i) * d + c] = ell * f.o[(h * T + i) * d + c];
    }
  const Check forward = compare(round_to_bf16(no_ell), f.o, f.o_scale, kAttnTol, "o without ℓ");
  EXPECT_FALSE(forward.ok) << forward.message;
  EXPECT_GT(forward.bad, n / 2) << forward.message;

  // The backward recomputing P from m alone, and from nothing (L = 0: P = exp(S)).
  const std::vector<float> o(f.o.begin(), f.o.end());
  const AttnGrads right = attention_backward_reference(q, k, v, o, f.L, dO, heads, T, d);
  EXPECT_TRUE(compare(round_to_bf16(right.dq), right.dq, right.dq_scale, kAttnTol, "dq").ok);
  for (const auto& [what, L] : {std::pair{"P = exp(S − m)", L_minus_log_l},
                                std::pair{"P = exp(S)", std::vector<double>(f.L.size(), 0.0)}}) {
    const AttnGrads wrong = attention_backward_reference(q, k, v, o, L, dO, heads, T, d);
    const Check dq = compare(round_to_bf16(wrong.dq), right.dq, right.dq_scale, kAttnTol, what);
    const Check dv = compare(round_to_bf16(wrong.dv), right.dv, right.dv_scale, kAttnTol, what);
    EXPECT_FALSE(dq.ok) << dq.message;
    EXPECT_FALSE(dv.ok) << dv.message;
  }
}
