// attention: f64 gradient checks of q, k, v and the reference's L (CPU); backward twice = twice;
// the public op check; on a GPU, every dtype at T ∈ {1, 7, 64, 257, 1024} and d ∈ {32, 64, 128}
// against the CPU reference, with large logits too, the same bits run to run, the atomic dQ
// variant; and a backward handed a wrong statistic (no − L at all, or m without log ℓ) failing
// the comparison on both devices.
//
// Tolerances, normwise: max|x − ref| / max|ref| over a tensor (the op check's measure), with the
// reference the CPU kernels in f32 on the same rounded inputs (their sums are in f64):
//   f32   O 1e-5, dq/dk/dv 5e-5       the GPU sums in fp32 in another order
//   bf16  O 8e-3, dq/dk/dv 1.6e-2     P and dS are rounded to bf16 (8 bits) before the products
//   f16   O 1e-3, dq/dk/dv 2.5e-3     the same with 11 bits
// (on an H200 the largest errors seen were about 2.5 times below these: bf16 2.9e-3 / 6.5e-3,
// f16 4.4e-4 / 8.3e-4, f32 3.9e-6 / 1.0e-5, the last two with large logits).
//   L     |L − L_ref| ≤ 3e-5 · max(1, |L_ref|) for every dtype: it is fp32 from fp32 sums
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "check/op_check.h"
#include "check/op_check_gtest.h"
#include "core/autograd.h"
#include "core/registry.h"
#include "core/switches.h"
#include "core/rng.h"
#include "core/storage.h"
#include "ops/attention/attention.h"
#include "tests/expect_error.h"
#include "tests/gradcheck.h"

using namespace mt;
using mt::test::expect_error;
using mt::test::expect_gradcheck;
using mt::test::random_leaf;

namespace {

// max|x − ref| / max|ref|; infinite when x holds a NaN (an element nobody wrote).
double normwise(const Tensor& x, const Tensor& ref) {
  const auto a = x.to_vector(), b = ref.to_vector();
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    err = std::max(err, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? err / scale : err;
}

// Everything the two kernels produce, called through the registry as the Function calls them.
struct Pass {
  Tensor o, lse, dq, dk, dv;
};

Pass run_kernels(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                 const Tensor& lse_override = Tensor()) {
  Pass r;
  const Device dev = q.device();
  r.o = empty(q.shape(), q.dtype(), dev);
  r.lse = empty({q.size(0), q.size(1), q.size(2)}, grad_dtype_for(q.dtype()), dev);
  kernel<AttentionForwardFn>("attention", Phase::Forward, dev)(q, k, v, r.o, r.lse);
  r.dq = empty(q.shape(), q.dtype(), dev);
  r.dk = empty(q.shape(), q.dtype(), dev);
  r.dv = empty(q.shape(), q.dtype(), dev);
  kernel<AttentionBackwardFn>("attention", Phase::Backward, dev)(
      q, k, v, r.o, lse_override.defined() ? lse_override : r.lse, dout, r.dq, r.dk, r.dv);
  return r;
}

Tensor randn_like_scaled(const Shape& shape, double stddev) {
  Tensor t = randn(shape, DType::f64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] *= stddev;
  return t;
}

// m_i = max_{j ≤ i} S[i, j] for every row (f64, CPU): the statistic without log ℓ.
Tensor row_max(const Tensor& q, const Tensor& k) {
  const Tensor qd = q.to(kCPU).to(DType::f64), kd = k.to(kCPU).to(DType::f64);
  const int64_t heads = q.size(0) * q.size(1), T = q.size(2), d = q.size(3);
  Tensor m = empty({q.size(0), q.size(1), T}, DType::f64);
  const double *qp = qd.data<double>(), *kp = kd.data<double>();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < T; ++i) {
      double best = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += qp[(h * T + i) * d + c] * kp[(h * T + j) * d + c];
        best = std::max(best, dot / std::sqrt(double(d)));
      }
      m.data<double>()[h * T + i] = best;
    }
  return m;
}

double max_grad_error(const Pass& got, const Pass& ref) {
  return std::max({normwise(got.dq, ref.dq), normwise(got.dk, ref.dk), normwise(got.dv, ref.dv)});
}

}  // namespace

TEST(Attention, GradientCheckForQKV) {
  manual_seed(1);
  for (Shape shape : {Shape{1, 1, 1, 3}, Shape{1, 2, 5, 3}, Shape{2, 1, 7, 4}}) {
    Tensor q = random_leaf(shape), k = random_leaf(shape), v = random_leaf(shape);
    expect_gradcheck([](auto& in) { return attention(in[0], in[1], in[2]); }, {q, k, v},
                     "attention " + shape_str(shape));
  }
}

// The reference's O and L against softmax written out here, row by row.
TEST(Attention, ReferenceForwardAndLogSumExpMatchTheFormula) {
  manual_seed(2);
  const Shape shape{1, 2, 9, 5};
  Tensor q = random_leaf(shape, -2, 2, false), k = random_leaf(shape, -2, 2, false),
         v = random_leaf(shape, -2, 2, false), dout = random_leaf(shape, -1, 1, false);
  const Pass r = run_kernels(q, k, v, dout);
  const auto qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector(), o = r.o.to_vector(),
             L = r.lse.to_vector();
  const int64_t T = 9, d = 5;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> e(size_t(i + 1));
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += qv[size_t((h * T + i) * d + c)] * kv[size_t((h * T + j) * d + c)];
        e[size_t(j)] = std::exp(dot / std::sqrt(double(d)));
        sum += e[size_t(j)];
      }
      EXPECT_NEAR(L[size_t(h * T + i)], std::log(sum), 1e-13);
      for (int64_t c = 0; c < d; ++c) {
        double want = 0;
        for (int64_t j = 0; j <= i; ++j) want += e[size_t(j)] / sum * vv[size_t((h * T + j) * d + c)];
        EXPECT_NEAR(o[size_t((h * T + i) * d + c)], want, 1e-13);
      }
    }
}

TEST(AttentionAccumulation, BackwardTwiceIsTwiceOneBackward) {
  manual_seed(3);
  const Shape shape{2, 2, 11, 8};
  Tensor q = random_leaf(shape), k = random_leaf(shape), v = random_leaf(shape);
  Tensor seed = rand(shape, DType::f64);
  attention(q, k, v).backward(seed);
  const auto gq = q.grad().to_vector(), gk = k.grad().to_vector(), gv = v.grad().to_vector();
  attention(q, k, v).backward(seed);
  const auto gq2 = q.grad().to_vector(), gk2 = k.grad().to_vector(), gv2 = v.grad().to_vector();
  for (size_t i = 0; i < gq.size(); ++i) {
    EXPECT_EQ(gq2[i], 2 * gq[i]);
    EXPECT_EQ(gk2[i], 2 * gk[i]);
    EXPECT_EQ(gv2[i], 2 * gv[i]);
  }
}

// One input used as q, k and v at once: its .grad is the sum of the three gradients.
TEST(AttentionAccumulation, OneTensorAsQKAndVGetsTheSumOfTheThree) {
  manual_seed(4);
  const Shape shape{1, 2, 6, 4};
  Tensor x = random_leaf(shape);
  Tensor q = x.detach().set_requires_grad(), k = x.detach().set_requires_grad(),
         v = x.detach().set_requires_grad();
  Tensor seed = rand(shape, DType::f64);
  attention(x, x, x).backward(seed);
  attention(q, k, v).backward(seed);
  const auto gx = x.grad().to_vector(), gq = q.grad().to_vector(), gk = k.grad().to_vector(),
             gv = v.grad().to_vector();
  for (size_t i = 0; i < gx.size(); ++i) EXPECT_NEAR(gx[i], gq[i] + gk[i] + gv[i], 1e-12);
}

TEST(Attention, MisuseIsAnError) {
  expect_error([] { attention(randn({2, 3, 4}), randn({2, 3, 4}), randn({2, 3, 4})); },
               {"attention", "[B, H, T, d]", "[2, 3, 4]"});
  expect_error([] { attention(randn({1, 2, 3, 4}), randn({1, 2, 3, 5}), randn({1, 2, 3, 4})); },
               {"attention", "one shape", "[1, 2, 3, 5]"});
  expect_error(
      [] { attention(randn({1, 2, 3, 4}), randn({1, 2, 3, 4}, DType::f64), randn({1, 2, 3, 4})); },
      {"attention", "one dtype", "f64"});
  expect_error([] { attention(randn({1, 2, 3, 0}), randn({1, 2, 3, 0}), randn({1, 2, 3, 0})); },
               {"attention", "head dimension", "at least 1"});
}

// The backward recomputes P = exp(S − L) from the saved L. Handed the wrong statistic, it must be
// caught by the comparison the tests make, even at the loosest tolerance (bf16's 1.6e-2): with no L
// at all (P = exp(S): rows far from summing to 1) and with m alone (P = exp(S − m), rows summing
// to ℓ ≥ 1).
TEST(AttentionBrokenStatistic, ABackwardWithoutLOrWithMAloneFailsTheCheck) {
  manual_seed(5);
  const Shape shape{1, 2, 33, 16};
  Tensor q = randn(shape, DType::f64), k = randn(shape, DType::f64), v = randn(shape, DType::f64),
         dout = randn(shape, DType::f64);
  const Pass good = run_kernels(q, k, v, dout);
  const double no_l = max_grad_error(run_kernels(q, k, v, dout, zeros({1, 2, 33}, DType::f64)), good);
  const double m_only = max_grad_error(run_kernels(q, k, v, dout, row_max(q, k)), good);
  std::printf("broken statistic (CPU, f64): no L %.3g, m without log l %.3g\n", no_l, m_only);
  EXPECT_GT(no_l, 1.6e-2);
  EXPECT_GT(m_only, 1.6e-2);
}

namespace {

mt::check::OpSpec attention_spec(int64_t d) {
  using mt::check::Cast;
  mt::check::OpSpec s;
  s.name = "attention (d = " + std::to_string(d) + ")";
  s.inputs = {{"q", Cast::Compute, true, false}, {"k", Cast::Compute, true, false},
              {"v", Cast::Compute, true, false}};
  s.op = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{attention(in[0], in[1], in[2])};
  };
  // n is T: rows of one head are coupled by the softmax, so the microbatch check (which cuts
  // dim 0 into n pieces) does not apply; the batch dimension is 2.
  s.make = [d](Generator& g, int64_t n) {
    using mt::check::normal;
    return std::vector<Tensor>{normal(g, {2, 2, n, d}), normal(g, {2, 2, n, d}),
                               normal(g, {2, 2, n, d})};
  };
  s.sizes = {1, 7, 64, 257};
  s.gradcheck_size = 5;
  s.tolerance = {{DType::f32, {1e-5, 5e-5}}, {DType::bf16, {8e-3, 1.6e-2}},
                 {DType::f16, {1e-3, 2.5e-3}}};
  s.bad_inputs = {
      {"k of another shape", [d] { attention(randn({1, 1, 3, d}), randn({1, 1, 4, d}), randn({1, 1, 3, d})); }},
      {"v of another dtype",
       [d] { attention(randn({1, 1, 3, d}), randn({1, 1, 3, d}), randn({1, 1, 3, d}, DType::f64)); }},
      {"a 3-D q", [d] { attention(randn({1, 3, d}), randn({1, 3, d}), randn({1, 3, d})); }},
  };
  return s;
}

}  // namespace

TEST(AttentionOpCheck, PassesTheOpCheck) {
  for (int64_t d : {16, 64}) MT_EXPECT_OP_CHECK(attention_spec(d));
}

// ---- CUDA ---------------------------------------------------------------------------------

#define MT_REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped"

namespace {

struct Tol {
  double out, grad;
};

Tol tol_for(DType dt) {
  switch (dt) {
    case DType::bf16: return {8e-3, 1.6e-2};
    case DType::f16: return {1e-3, 2.5e-3};
    default: return {1e-5, 5e-5};
  }
}

// q, k, v, dO of `shape` (q and k times `qk_scale`), rounded to dt; the GPU run against the CPU
// reference in f32 on the same rounded values. Returns the largest gradient error.
double expect_matches_reference(const Shape& shape, DType dt, double qk_scale,
                                const std::string& what) {
  const Device gpu = cuda_device(0);
  Tensor q = randn_like_scaled(shape, qk_scale).to(dt), k = randn_like_scaled(shape, qk_scale).to(dt),
         v = randn(shape, DType::f64).to(dt), dout = randn(shape, DType::f64).to(dt);
  set_poison_allocations(true);  // NaN in every new buffer: an element never written shows
  const Pass g = run_kernels(q.to(gpu), k.to(gpu), v.to(gpu), dout.to(gpu));
  set_poison_allocations(false);
  const Pass ref = run_kernels(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32),
                               dout.to(DType::f32));
  const Tol tol = tol_for(dt);
  const double eo = normwise(g.o.to(kCPU), ref.o), eq = normwise(g.dq.to(kCPU), ref.dq),
               ek = normwise(g.dk.to(kCPU), ref.dk), ev = normwise(g.dv.to(kCPU), ref.dv);
  const auto L = g.lse.to(kCPU).to_vector(), Lr = ref.lse.to_vector();
  double el = 0;
  for (size_t i = 0; i < L.size(); ++i)
    el = std::max(el, std::isfinite(L[i]) ? std::abs(L[i] - Lr[i]) / std::max(1.0, std::abs(Lr[i]))
                                          : INFINITY);
  std::printf("%-40s O %.2e  L %.2e  dq %.2e  dk %.2e  dv %.2e\n", what.c_str(), eo, el, eq, ek, ev);
  EXPECT_LE(eo, tol.out) << what << ": O";
  EXPECT_LE(el, 3e-5) << what << ": L";
  EXPECT_LE(eq, tol.grad) << what << ": dq";
  EXPECT_LE(ek, tol.grad) << what << ": dk";
  EXPECT_LE(ev, tol.grad) << what << ": dv";
  return std::max({eq, ek, ev});
}

std::string case_name(DType dt, const Shape& shape, const char* tag = "") {
  return std::string(dtype_name(dt)) + " " + shape_str(shape) + tag;
}

}  // namespace

TEST(AttentionCuda, EveryDtypeLengthAndHeadDimMatchesTheReference) {
  MT_REQUIRE_CUDA();
  manual_seed(10);
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (int64_t d : {32, 64, 128})
      for (int64_t T : {1, 7, 64, 257, 1024}) {
        const Shape shape{1, 2, T, d};
        expect_matches_reference(shape, dt, 1.0, case_name(dt, shape));
      }
}

// Scores up to |S| ≈ 30 and beyond: exp(S) alone would overflow fp32 at S ≈ 89 and lose every
// other key long before; the running max must carry it.
TEST(AttentionCuda, LargeLogitsMatchTheReference) {
  MT_REQUIRE_CUDA();
  manual_seed(11);
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (int64_t d : {64, 128}) {
      const Shape shape{1, 2, 257, d};
      const double a = std::sqrt(10.0);  // S = a²·(x·y)/√d: standard deviation 10
      Tensor probe_q = randn_like_scaled(shape, a), probe_k = randn_like_scaled(shape, a);
      double max_s = 0;
      for (double m : row_max(probe_q, probe_k).to_vector()) max_s = std::max(max_s, std::abs(m));
      ASSERT_GE(max_s, 30.0) << "the inputs do not reach large logits";
      expect_matches_reference(shape, dt, a, case_name(dt, shape, " |S|~30"));
    }
}

TEST(AttentionCuda, SameBitsRunToRunAndTheAtomicVariantWithinTolerance) {
  MT_REQUIRE_CUDA();
  manual_seed(12);
  const Device gpu = cuda_device(0);
  const Shape shape{2, 3, 1024, 64};
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    Tensor q = randn(shape, dt, gpu), k = randn(shape, dt, gpu), v = randn(shape, dt, gpu),
           dout = randn(shape, dt, gpu);
    set_deterministic(true);
    const Pass a = run_kernels(q, k, v, dout), b = run_kernels(q, k, v, dout);
    for (const auto& [x, y, name] : {std::tuple{a.o, b.o, "O"}, std::tuple{a.lse, b.lse, "L"},
                                     std::tuple{a.dq, b.dq, "dq"}, std::tuple{a.dk, b.dk, "dk"},
                                     std::tuple{a.dv, b.dv, "dv"}})
      EXPECT_EQ(x.to(kCPU).to_vector(), y.to(kCPU).to_vector()) << dtype_name(dt) << " " << name;
    set_deterministic(false);
    const Pass c = run_kernels(q, k, v, dout);
    set_deterministic(true);
    const double e = normwise(c.dq.to(kCPU), a.dq.to(kCPU));
    std::printf("%s atomic dq vs deterministic: %.2e\n", dtype_name(dt), e);
    EXPECT_LE(e, tol_for(dt).grad);
    EXPECT_LE(normwise(c.dk.to(kCPU), a.dk.to(kCPU)), tol_for(dt).grad);
  }
}

TEST(AttentionBrokenStatistic, TheCudaBackwardWithoutLOrWithMAloneFailsTheCheck) {
  MT_REQUIRE_CUDA();
  manual_seed(13);
  const Device gpu = cuda_device(0);
  for (DType dt : {DType::bf16, DType::f32}) {
    const Shape shape{1, 2, 257, 64};
    Tensor q = randn(shape, dt, gpu), k = randn(shape, dt, gpu), v = randn(shape, dt, gpu),
           dout = randn(shape, dt, gpu);
    const Pass good = run_kernels(q, k, v, dout);
    const double no_l = max_grad_error(run_kernels(q, k, v, dout, zeros({1, 2, 257}, DType::f32, gpu)), good);
    const double m_only =
        max_grad_error(run_kernels(q, k, v, dout, row_max(q, k).to(DType::f32).to(gpu)), good);
    std::printf("broken statistic (CUDA, %s): no L %.3g, m without log l %.3g\n", dtype_name(dt),
                no_l, m_only);
    EXPECT_GT(no_l, tol_for(DType::bf16).grad);
    EXPECT_GT(m_only, tol_for(DType::bf16).grad);
  }
}
