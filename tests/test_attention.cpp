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
//
// Dropout on P (AttentionDropout*, CudaAttentionDropout*): f64 gradient checks with a fixed mask;
// the mask each pass applies (the forward, the dK/dV pass, the dQ pass) read back through the
// gradients and outputs, equal to ops/dropout's for the same key, with the keep rate; p = 0 and
// eval are attention(q, k, v) to the bit; the op check; bad arguments; on a GPU, the CPU
// reference's results (same tolerances) for every dtype, T and d, the same mask bits read back
// from every kernel, the same bits run to run, and a CUDA graph whose replays draw the next
// steps' masks through the base word, as eager steps do. Without dropout, a captured backward
// (its dQ pass on a side branch) gives eager's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "check/op_check.h"
#include "check/op_check_gtest.h"
#include "core/autograd.h"
#include "core/registry.h"
#include "core/switches.h"
#include "core/rng.h"
#include "ops/attention/attention.h"
#include "ops/attention/wgmma_layout.h"
#include "ops/dropout/dropout.h"
#include "ops/elementwise/elementwise.h"
#include "tests/deterministic_guard.h"
#include "tests/expect_error.h"
#include "tests/gradcheck.h"
#include "tests/poison_scope.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/graph.h"
#include "core/cuda/runtime.h"
#include "ops/attention/attention_cuda.h"
#include "ops/attention/attention_testing.h"
#endif

using namespace mt;
using mt::test::DeterministicGuard;
using mt::test::expect_error;
using mt::test::expect_gradcheck;
using mt::test::PoisonScope;
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
                 const Tensor& lse_override = Tensor(),
                 const AttentionDropout& dropout = AttentionDropout{}) {
  Pass r;
  const Device dev = q.device();
  r.o = empty(q.shape(), q.dtype(), dev);
  r.lse = empty({q.size(0), q.size(1), q.size(2)}, grad_dtype_for(q.dtype()), dev);
  kernel<AttentionForwardFn>("attention", Phase::Forward, dev)(q, k, v, r.o, r.lse, dropout);
  r.dq = empty(q.shape(), q.dtype(), dev);
  r.dk = empty(q.shape(), q.dtype(), dev);
  r.dv = empty(q.shape(), q.dtype(), dev);
  kernel<AttentionBackwardFn>("attention", Phase::Backward, dev)(
      q, k, v, r.o, lse_override.defined() ? lse_override : r.lse, dout, r.dq, r.dk, r.dv,
      dropout);
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

// The same op cut along the batch: B's sequences are independent, so k microbatches of them add
// up to the whole batch's gradient (the microbatch check), here with n = B and T = 5. Its kernels
// are attention_spec's, whose CUDA lines cover them: this one runs on the CPU.
mt::check::OpSpec attention_batch_spec(int64_t d) {
  mt::check::OpSpec s = attention_spec(d);
  s.name = "attention, microbatches of sequences (d = " + std::to_string(d) + ")";
  for (mt::check::Input& in : s.inputs) in.batched = true;
  s.row_separable = true;
  s.make = [d](Generator& g, int64_t n) {
    using mt::check::normal;
    return std::vector<Tensor>{normal(g, {n, 2, 5, d}), normal(g, {n, 2, 5, d}),
                               normal(g, {n, 2, 5, d})};
  };
  s.sizes = {1, 7, 33};
  s.gradcheck_size = 2;
  return s;
}

}  // namespace

TEST(AttentionOpCheck, PassesTheOpCheck) {
  for (int64_t d : {16, 64}) MT_EXPECT_OP_CHECK(attention_spec(d));
}

TEST(AttentionOpCheck, MicrobatchesOfSequencesAddUpToTheBatch) {
  mt::check::Options cpu_only;
  cpu_only.cuda = false;
  MT_EXPECT_OP_CHECK(attention_batch_spec(16), cpu_only);
}

// ---- dropout on P -------------------------------------------------------------------------

namespace {

// The element offset of P[h, i, j] in P [B·H, T, T] (attention.h's e).
size_t p_index(int64_t h, int64_t i, int64_t j, int64_t T) { return size_t((h * T + i) * T + j); }

// ops/dropout's keep mask for a [B, H, T, T] tensor with this key (the base's word added on the
// host), 1 kept, 0 dropped: the convention attention.h promises.
std::vector<int> ops_dropout_keep(const Shape& shape, const AttentionDropout& a) {
  const uint64_t offset =
      a.offset + (a.base.defined() ? uint64_t(a.base.to(kCPU).data<int64_t>()[0]) : 0);
  const auto y = dropout(ones({shape[0], shape[1], shape[2], shape[2]}, DType::f32), a.p, a.seed,
                         offset).to_vector();
  std::vector<int> keep(y.size());
  for (size_t e = 0; e < y.size(); ++e) keep[e] = y[e] != 0;
  return keep;
}

// The mask each pass applied, read back through its outputs, per element of P: 1 kept, 0
// dropped, −1 not read. q random, [B, H, T, d] (f64, CPU), run in dt on dev through the public
// op; keys and queries in windows of d:
//   forward: v_j = e_{j − j0} for j0 ≤ j < j0 + d, 0 for the other keys: O[i, c] = P·Z[i, j0 + c],
//            zero exactly where dropped;
//   dK/dV pass: dO_i = e_{i − i0} for the window's queries: dV[j, c] = P·Z[i0 + c, j];
//   dQ pass: k_j = 2·e_{j − j0}, v = 1/2 everywhere, dO = 1: dP[i, j] = Z·d/2, D_i = d·O[i, 0],
//            so dQ[i, c] = s·2·dS[i, j0 + c] = 2s·P·d·(Z/2 − O[i, 0]): negative where dropped
//            (Z = 0), positive where kept (Z = 2 at p = 1/2) unless the row kept all its keys
//            (O[i, 0] = 1) or dropped them all (0); rows near those are not read.
struct MaskReadout {
  std::vector<int> forward, dkdv, dq;
};

MaskReadout read_masks(const Tensor& q, const AttentionDropout& a, DType dt, Device dev) {
  EXPECT_EQ(a.p, 0.5) << "the dQ readout needs Z = 2 for kept elements";
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), d = q.size(3), heads = B * H;
  const Shape shape = q.shape();
  auto on = [&](const Tensor& t) {
    Tensor x = t.to(dt).to(dev).detach();
    x.set_requires_grad();
    return x;
  };
  auto window = [&](int64_t r0, double value) {  // rows r0 .. r0 + d − 1 of each head: value·e_c
    Tensor t = zeros(shape, DType::f64);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c = 0; c < d && r0 + c < T; ++c) t.data<double>()[(h * T + r0 + c) * d + c] = value;
    return t;
  };
  MaskReadout r;
  r.forward.assign(size_t(heads * T * T), -1);
  r.dkdv = r.dq = r.forward;
  Generator g(99);
  const Tensor k = mt::check::normal(g, shape), v = mt::check::normal(g, shape);
  for (int64_t w0 = 0; w0 < T; w0 += d) {
    {  // forward
      const auto o = attention(on(q), on(k), on(window(w0, 1.0)), a).to(kCPU).to_vector();
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < T; ++i)
          for (int64_t c = 0; c < d && w0 + c <= i; ++c)
            r.forward[p_index(h, i, w0 + c, T)] = o[size_t((h * T + i) * d + c)] != 0;
    }
    {  // dK/dV pass
      Tensor vl = on(v);
      attention(on(q), on(k), vl, a).backward(window(w0, 1.0).to(dt).to(dev));
      const auto dv = vl.grad().to(kCPU).to_vector();
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < T; ++j)
          for (int64_t c = 0; c < d && w0 + c < T; ++c)
            if (w0 + c >= j) r.dkdv[p_index(h, w0 + c, j, T)] = dv[size_t((h * T + j) * d + c)] != 0;
    }
    {  // dQ pass
      Tensor ql = on(q);
      Tensor o = attention(ql, on(window(w0, 2.0)), on(full(shape, 0.5, DType::f64)), a);
      o.backward(ones(shape, dt, dev));
      const auto dq = ql.grad().to(kCPU).to_vector(), ov = o.to(kCPU).to_vector();
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < T; ++i) {
          const double R = ov[size_t((h * T + i) * d)];  // O[i, 0] = Σ_j P·Z / 2
          if (R < 0.05 || R > 0.95) continue;
          for (int64_t c = 0; c < d && w0 + c <= i; ++c)
            r.dq[p_index(h, i, w0 + c, T)] = dq[size_t((h * T + i) * d + c)] > 0;
        }
    }
  }
  return r;
}

// Every element read back equals ops/dropout's mask; the forward and the dK/dV pass read every
// causal element, the dQ pass at least `min_dq_read` of them (it skips rows that kept or dropped
// nearly all).
void expect_masks_match(const MaskReadout& r, const std::vector<int>& want, int64_t T,
                        double min_dq_read, const std::string& what) {
  for (const auto& [got, pass] : {std::pair{&r.forward, "forward"}, std::pair{&r.dkdv, "dK/dV pass"},
                                  std::pair{&r.dq, "dQ pass"}}) {
    int64_t read = 0, wrong = 0, causal = 0;
    for (size_t e = 0; e < want.size(); ++e) {
      const int64_t i = int64_t(e) / T % T, j = int64_t(e) % T;
      causal += j <= i;
      if ((*got)[e] < 0) continue;
      ++read;
      if ((*got)[e] != want[e] && wrong++ < 5)
        ADD_FAILURE() << what << ", " << pass << ": element " << e << " (i " << i << ", j " << j
                      << ") kept " << (*got)[e] << ", ops/dropout says " << want[e];
    }
    EXPECT_EQ(wrong, 0) << what << ", " << pass;
    EXPECT_GE(double(read), (got == &r.dq ? min_dq_read : 1.0) * double(causal))
        << what << ", " << pass << ": too few read";
  }
}

}  // namespace

// The descriptor's fields where the PTX ISA puts them (the matrix descriptor of wgmma): start
// address >> 4 in bits 0-13 (of an 18-bit shared-memory address), leading and stride byte
// offsets >> 4 in bits 16-29 and 32-45, base offset 0 in bits 49-51, swizzle mode 1 (128 bytes)
// in bits 62-63, every other bit clear; with the offsets the kernels pass.
TEST(AttentionWgmmaLayout, DescriptorFieldsAreWherePtxPutsThem) {
  struct Case { uint32_t addr, leading, stride; };
  const Case cases[] = {{0x400, 16, 1024},           // K-major Q / K: stride 8 rows of 128 bytes
                        {0x2C00 + 32, 16, 1024},     // a k-step 32 bytes along a swizzled row
                        {0x3FC00, 128 * 64 * 2, 1024},  // V MN-major: leading = one 128-key slab
                        {0x7FC00, 64 * 64 * 2, 1024}};  // bit 18 and up are not part of it
  for (const Case& c : cases) {
    const uint64_t desc = mt::wgmma_layout::descriptor(c.addr, c.leading, c.stride);
    EXPECT_EQ(desc & 0x3FFF, (c.addr & 0x3FFFF) >> 4);
    EXPECT_EQ((desc >> 16) & 0x3FFF, c.leading >> 4);
    EXPECT_EQ((desc >> 32) & 0x3FFF, c.stride >> 4);
    EXPECT_EQ((desc >> 49) & 0x7, 0u);
    EXPECT_EQ(desc >> 62, 1u);
    const uint64_t fields = 0x3FFFull | 0x3FFFull << 16 | 0x3FFFull << 32 | 0x7ull << 49 |
                            0x3ull << 62;
    EXPECT_EQ(desc & ~fields, 0u);
  }
}

// The Hopper kernels' tensor map (wgmma_layout.h) addresses every element of every head where
// the layout puts it: contiguous heads (one head a batch, whose head stride of 0 the map is not
// given), q of a [B, T, 3C] projection (k and v differ only by their base) and heads of
// [B, T, C] at d = 128, each byte offset the map computes from (column, row, head, batch)
// against the layout's own, with (head, batch) inside the map's dimensions, where the copy
// engine would otherwise read zeros.
TEST(AttentionWgmmaLayout, TensorMapAddressesEachHeadsRowsWhereTheLayoutPutsThem) {
  struct Layout { int64_t heads, batch, head, row; };  // attention_cuda.h's HeadsLayout
  struct Case { const char* name; Layout l; int64_t n_heads, T, d; };
  const int64_t T = 5, d = 64, H = 3, B = 2, C = H * d;
  const Case cases[] = {
      {"contiguous", {1, T * d, 0, d}, B * H, T, d},
      {"q of [B, T, 3C]", {H, T * 3 * C, d, 3 * C}, B * H, T, d},
      {"d = 128 heads of [B, T, C]", {H, T * 2 * C, 2 * d, 2 * C}, B * H, T, 2 * d}};
  for (const Case& c : cases) {
    const auto m = mt::wgmma_layout::heads_tensor_map(c.l.heads, c.l.batch, c.l.head, c.l.row,
                                                      c.n_heads, c.T, c.d, 2);
    EXPECT_EQ(m.dims[0], uint64_t(c.d)) << c.name;
    EXPECT_EQ(m.dims[1], uint64_t(c.T)) << c.name;
    EXPECT_EQ(m.dims[2], uint64_t(c.l.heads)) << c.name;
    EXPECT_EQ(m.dims[3], uint64_t(c.n_heads / c.l.heads)) << c.name;
    for (uint64_t s : m.strides) EXPECT_TRUE(s > 0 && s % 16 == 0) << c.name << ": stride " << s;
    for (int64_t bh = 0; bh < c.n_heads; ++bh) {
      const int64_t b = bh / c.l.heads, h = bh % c.l.heads;
      ASSERT_TRUE(uint64_t(h) < m.dims[2] && uint64_t(b) < m.dims[3]) << c.name << ": head " << bh;
      for (int64_t i = 0; i < c.T; ++i)
        for (int64_t col = 0; col < c.d; col += 7) {
          const uint64_t map = uint64_t(col) * 2 + uint64_t(i) * m.strides[0] +
                               uint64_t(h) * m.strides[1] + uint64_t(b) * m.strides[2];
          const int64_t layout = b * c.l.batch + h * c.l.head + i * c.l.row + col;
          ASSERT_EQ(map, uint64_t(layout) * 2) << c.name << ": head " << bh << ", row " << i
                                               << ", column " << col;
        }
    }
  }
}

// The Hopper kernels' work items (wgmma_layout.h): every (head, tile) exactly once; the sections
// one after the other, each `section` heads but the last; in a section, no item walks further
// than the one before (tile t walks t + 1 K/V tiles), so blocks that take them one after another
// end together. With one section (section >= heads) the order is the one before the sections,
// which the backward's grids had: every head's last tile, then every head's second-to-last, ...
TEST(AttentionWgmmaLayout, WorkItemsCoverEveryTileOnceSectionBySectionLongestWalkFirst) {
  struct Case {
    int heads, q_tiles, section;
  };
  for (const auto [heads, q_tiles, section] : {Case{192, 8, 64}, Case{192, 8, 128}, {192, 8, 192},
                                               {1, 1, 1}, {3, 5, 2}, {3, 5, 8}, {7, 1, 4},
                                               {1, 9, 1}, {64, 32, 16}, {5, 3, 1}, {10, 4, 3}}) {
    const std::string where = std::to_string(heads) + " heads, " + std::to_string(q_tiles) +
                              " tiles, sections of " + std::to_string(section);
    std::vector<int> seen(size_t(heads) * q_tiles, 0);
    int last_tile = q_tiles, last_section = 0;
    for (int item = 0; item < heads * q_tiles; ++item) {
      const auto w = mt::wgmma_layout::work_item(item, heads, q_tiles, section);
      ASSERT_TRUE(w.head >= 0 && w.head < heads && w.tile >= 0 && w.tile < q_tiles)
          << where << ": item " << item;
      ++seen[size_t(w.head) * q_tiles + w.tile];
      const int sec = w.head / section;
      EXPECT_TRUE(sec == last_section || sec == last_section + 1)
          << where << ": item " << item << " is in section " << sec << " after " << last_section;
      if (sec == last_section)
        EXPECT_LE(w.tile, last_tile) << where << ": item " << item << " walks further";
      last_section = sec;
      last_tile = w.tile;
      if (section >= heads) {
        EXPECT_EQ(w.head, item % heads) << where << ": item " << item;
        EXPECT_EQ(w.tile, q_tiles - 1 - item / heads) << where << ": item " << item;
      }
    }
    for (size_t i = 0; i < seen.size(); ++i)
      EXPECT_EQ(seen[i], 1) << where << ": (head, tile) " << i / q_tiles << ", " << i % q_tiles;
  }
}

// Sections of at most `most` heads: as few as that allows, each as small as that count allows.
TEST(AttentionWgmmaLayout, SectionsAreAsFewAsTheLimitAllowsAndNoLargerThanNeeded) {
  using mt::wgmma_layout::balanced_section;
  EXPECT_EQ(balanced_section(192, 66), 64);  // 64, 64, 64 (not 66, 66, 60)
  EXPECT_EQ(balanced_section(65, 64), 33);   // 33, 32 (not 64, 1)
  EXPECT_EQ(balanced_section(10, 3), 3);     // four sections need 3
  EXPECT_EQ(balanced_section(12, 1000), 12);
  EXPECT_EQ(balanced_section(12, 0), 1);
  for (int heads : {1, 7, 64, 100, 192, 384})
    for (int64_t most : {1, 2, 5, 33, 66, 128, 500}) {
      const int s = balanced_section(heads, most);
      const int64_t m = std::min<int64_t>(most, heads), sections = (heads + m - 1) / m;
      EXPECT_LE(s, m) << heads << " heads, at most " << most;
      EXPECT_EQ((heads + s - 1) / s, sections) << heads << " heads, at most " << most;
      if (s > 1)
        EXPECT_GT((heads + s - 2) / (s - 1), sections) << heads << " heads, at most " << most;
    }
}

// The forward's sections: the heads whose K and V fit in a third of L2 (GPT-2's 256 KiB a head
// in the 50 MiB of an H100: 66, so three sections of 64); the backward's: the heads whose blocks
// number at most the SMs. The shapes measured in docs/perf.md.
TEST(AttentionWgmmaLayout, SectionSizesAtTheMeasuredShapes) {
  using mt::wgmma_layout::section_heads;
  using mt::wgmma_layout::backward_section_heads;
  constexpr int64_t MiB = 1 << 20, l2 = 50 * MiB;
  EXPECT_EQ(section_heads(2 * 1024 * 64 * 2, l2, 192), 64);   // [16, 12, 1024, 64]
  EXPECT_EQ(section_heads(2 * 2048 * 64 * 2, l2, 96), 32);    // [8, 12, 2048, 64]
  EXPECT_EQ(section_heads(2 * 4096 * 128 * 2, l2, 64), 8);    // [4, 16, 4096, 128]
  EXPECT_EQ(section_heads(2 * 64 * 64 * 2, l2, 192), 192);    // all fit: one section
  EXPECT_EQ(section_heads(64 * MiB, l2, 12), 1);              // not even one fits: one a section
  EXPECT_EQ(backward_section_heads(16, 132, 192), 8);  // [16, 12, 1024, 64]: 16 key tiles a head
  EXPECT_EQ(backward_section_heads(32, 132, 96), 4);   // [8, 12, 2048, 64]
  EXPECT_EQ(backward_section_heads(32, 132, 64), 4);   // [4, 16, 4096, 128]: 128 rows a block
  EXPECT_EQ(backward_section_heads(4, 132, 384), 32);  // [64, 6, 256, 64]: 12 sections of 32
  EXPECT_EQ(backward_section_heads(4, 132, 5), 5);
  EXPECT_EQ(backward_section_heads(300, 132, 12), 1);  // one head has more blocks than SMs
}

// Finite differences of the same fixed mask (a pure function of the key): T of 5, 7 and 13 (not
// multiples of 4, so rows start mid-group), the mask dropping some of every shape's entries.
TEST(AttentionDropout, GradientCheckForQKV) {
  manual_seed(21);
  for (Shape shape : {Shape{1, 1, 1, 3}, Shape{1, 2, 5, 3}, Shape{2, 1, 7, 4}, Shape{1, 1, 13, 2}}) {
    const AttentionDropout a{.p = 0.3, .seed = 17, .offset = 5};
    const auto keep = ops_dropout_keep(shape, a);
    int64_t dropped = 0;
    for (int64_t e = 0; e < int64_t(keep.size()); ++e)
      dropped += keep[size_t(e)] == 0 && e % shape[2] <= e / shape[2] % shape[2];
    if (shape[2] > 1) EXPECT_GT(dropped, 0) << shape_str(shape) << ": the mask drops nothing";
    Tensor q = random_leaf(shape), k = random_leaf(shape), v = random_leaf(shape);
    expect_gradcheck([&](auto& in) { return attention(in[0], in[1], in[2], a); }, {q, k, v},
                     "attention with dropout " + shape_str(shape));
  }
}

// The CPU kernels' mask, read through the forward's output and both halves of the backward,
// is ops/dropout's for the same (seed, offset, base); across a big enough T the keep rate is 1 − p.
TEST(AttentionDropout, EveryPassAppliesOpsDropoutsMask) {
  manual_seed(22);
  for (Shape shape : {Shape{2, 2, 13, 4}, Shape{1, 2, 37, 16}}) {
    const AttentionDropout a{.p = 0.5, .seed = 1234, .offset = 77};
    const Tensor q = randn(shape, DType::f64);
    expect_masks_match(read_masks(q, a, DType::f64, kCPU), ops_dropout_keep(shape, a), shape[2],
                       0.5, "CPU " + shape_str(shape));
  }
  // The keep rate, at p = 0.3 over 2 · 200·201/2 probabilities (binomial standard deviation
  // about 63 kept; 6 of them is a wide margin), read with v = I (d = T).
  const int64_t T = 200;
  const AttentionDropout a{.p = 0.3, .seed = 5, .offset = 9};
  Tensor v = zeros({1, 2, T, T}, DType::f64);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 0; j < T; ++j) v.data<double>()[(h * T + j) * T + j] = 1;
  const auto o = attention(randn({1, 2, T, T}, DType::f64), randn({1, 2, T, T}, DType::f64), v, a)
                     .to_vector();
  const auto want = ops_dropout_keep({1, 2, T, T}, a);
  int64_t kept = 0, n = 0, wrong = 0;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j <= i; ++j, ++n) {
        const bool k = o[p_index(h, i, j, T)] != 0;
        kept += k;
        wrong += k != bool(want[p_index(h, i, j, T)]);
      }
  EXPECT_EQ(wrong, 0);
  EXPECT_NEAR(double(kept), 0.7 * double(n), 6 * std::sqrt(double(n) * 0.3 * 0.7));
}

// The base word adds to the offset, forward and backward, as in ops/dropout.
TEST(AttentionDropout, AnOffsetBaseAddsItsWordToTheOffset) {
  manual_seed(23);
  const Shape shape{1, 2, 9, 4};
  Tensor base = zeros({1}, DType::i64);
  advance_dropout_base(base, 40, 1000);
  const AttentionDropout with_base{.p = 0.5, .seed = 3, .offset = 2, .base = base};
  const Tensor q = randn(shape, DType::f64);
  expect_masks_match(read_masks(q, with_base, DType::f64, kCPU),
                     ops_dropout_keep(shape, {.p = 0.5, .seed = 3, .offset = 42}), 9, 0.5,
                     "base 40 + offset 2");
  Tensor k = randn(shape, DType::f64), v = randn(shape, DType::f64);
  EXPECT_EQ(attention(q, k, v, with_base).to_vector(),
            attention(q, k, v, {.p = 0.5, .seed = 3, .offset = 42}).to_vector());
  EXPECT_NE(attention(q, k, v, with_base).to_vector(),
            attention(q, k, v, {.p = 0.5, .seed = 3, .offset = 2}).to_vector());
  // The backward regenerates the mask from the word: moved since the forward, it would draw
  // another mask, so it is the "modified in place" error (the word used to go unchecked).
  Tensor leaf = randn(shape, DType::f64).set_requires_grad();
  for (bool packed : {false, true}) {
    Tensor y = packed ? attention_packed(randn({1, 9, 24}, DType::f64).set_requires_grad(), 2,
                                         with_base)
                      : attention(leaf, k, v, with_base);
    advance_dropout_base(base, 80, 1000);
    expect_error([&] { sum(y).backward(); }, {packed ? "attention_packed" : "attention",
                                              "modified in place"});
  }
}

// p = 0 and training = false are attention(q, k, v): the same output and gradients, to the bit.
TEST(AttentionDropout, ZeroPAndEvalAreAttentionItself) {
  manual_seed(24);
  for (DType dt : {DType::f64, DType::f32}) {
    const Shape shape{2, 2, 11, 8};
    Tensor dout = randn(shape, dt);
    const Tensor q0 = randn(shape, dt), k0 = randn(shape, dt), v0 = randn(shape, dt);
    auto run = [&](const AttentionDropout* a) {
      Tensor q = q0.detach(), k = k0.detach(), v = v0.detach();
      q.set_requires_grad(), k.set_requires_grad(), v.set_requires_grad();
      Tensor o = a ? attention(q, k, v, *a) : attention(q, k, v);
      o.backward(dout);
      return std::vector{o.to_vector(), q.grad().to_vector(), k.grad().to_vector(),
                         v.grad().to_vector()};
    };
    const auto plain = run(nullptr);
    const AttentionDropout zero{.p = 0.0, .seed = 1, .offset = 2};
    const AttentionDropout eval{.p = 0.5, .seed = 1, .offset = 2, .training = false};
    const AttentionDropout on{.p = 0.5, .seed = 1, .offset = 2};
    EXPECT_EQ(run(&zero), plain) << dtype_name(dt);
    EXPECT_EQ(run(&eval), plain) << dtype_name(dt);
    EXPECT_NE(run(&on)[0], plain[0]) << dtype_name(dt);
  }
}

TEST(AttentionDropout, BadArgumentsAreClearErrors) {
  const Tensor x = randn({1, 1, 3, 4});
  expect_error([&] { attention(x, x, x, {.p = 1.0}); }, {"attention", "dropout p", "[0, 1)", "1"});
  expect_error([&] { attention(x, x, x, {.p = -0.1}); }, {"attention", "dropout p", "-0.1"});
  expect_error([&] { attention(x, x, x, {.p = 1.5, .training = false}); }, {"attention", "1.5"});
  expect_error([&] { attention(x, x, x, {.p = 0.1, .base = zeros({2}, DType::i64)}); },
               {"attention", "offset base", "one i64 element", "[2]"});
  expect_error([&] { attention(x, x, x, {.p = 0.1, .base = zeros({1}, DType::f32)}); },
               {"attention", "offset base", "f32"});
}

namespace {

mt::check::OpSpec attention_dropout_spec(int64_t d) {
  mt::check::OpSpec s = attention_spec(d);
  s.name = "attention with dropout (d = " + std::to_string(d) + ")";
  // T = 1 is left to attention_spec: with one key the softmax is constant, so dQ and dK are 0 in
  // exact arithmetic, and with dropout the two sides' roundings of them (dP = Z·(dO·v) against
  // D = dO·(Z·v)) no longer cancel exactly: a relative error of rounding noise against rounding
  // noise. The CPU gradient check and the CUDA reference test below cover T = 1 with dropout.
  s.sizes = {2, 7, 64, 257};
  s.op = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{attention(in[0], in[1], in[2], {.p = 0.2, .seed = 8, .offset = 1})};
  };
  s.bad_inputs.push_back({"p = 1", [d] {
                            const Tensor x = randn({1, 1, 3, d});
                            attention(x, x, x, {.p = 1.0});
                          }});
  return s;
}

}  // namespace

TEST(AttentionDropoutOpCheck, PassesTheOpCheck) {
  mt::check::Options cpu_only;
  cpu_only.cuda = false;  // CudaAttentionDropout.PassesTheOpCheckOnTheGpu has the CUDA lines
  for (int64_t d : {16, 64}) MT_EXPECT_OP_CHECK(attention_dropout_spec(d), cpu_only);
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

// max |a − b| over the elements, on the CPU in f64; infinity where a difference is not finite
// (an element a kernel never wrote still holds the NaN poison).
double max_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to(kCPU).to(DType::f64).to_vector(), y = b.to(kCPU).to(DType::f64).to_vector();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double diff = std::abs(x[i] - y[i]);
    if (!std::isfinite(diff)) return INFINITY;
    m = std::max(m, diff);
  }
  return m;
}

// q, k, v, dO of `shape` (q and k times `qk_scale`), rounded to dt; the GPU run against the CPU
// reference in f32 on the same rounded values. Returns the largest gradient error.
double expect_matches_reference(const Shape& shape, DType dt, double qk_scale,
                                const std::string& what,
                                const AttentionDropout& dropout = AttentionDropout{}) {
  const Device gpu = cuda_device(0);
  Tensor q = randn_like_scaled(shape, qk_scale).to(dt), k = randn_like_scaled(shape, qk_scale).to(dt),
         v = randn(shape, DType::f64).to(dt), dout = randn(shape, DType::f64).to(dt);
  const Pass g = [&] {
    const PoisonScope poison;  // NaN in every new buffer: an element never written shows
    return run_kernels(q.to(gpu), k.to(gpu), v.to(gpu), dout.to(gpu), Tensor(), dropout);
  }();
  const Pass ref = run_kernels(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32),
                               dout.to(DType::f32), Tensor(), dropout);
  const Tol tol = tol_for(dt);
  // With one key (T = 1) dQ and dK are 0 in exact arithmetic (the softmax of one score is
  // constant, so dS = 0): both sides hold rounding noise, measured against dO's size instead.
  const bool one_key = shape[2] == 1;
  const double dout_size = max_diff(dout, zeros(shape));
  const double eq = one_key ? max_diff(g.dq, ref.dq) / dout_size : normwise(g.dq.to(kCPU), ref.dq);
  const double ek = one_key ? max_diff(g.dk, ref.dk) / dout_size : normwise(g.dk.to(kCPU), ref.dk);
  const double eo = normwise(g.o.to(kCPU), ref.o), ev = normwise(g.dv.to(kCPU), ref.dv);
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

// A leaf holding a copy of t's values: an eager and a captured run each get their own .grad.
Tensor leaf(const Tensor& t) {
  Tensor x = t.clone().detach();
  x.set_requires_grad();
  return x;
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

// Views of at most one element count as contiguous whatever their strides, so the op passes them
// through as they are: T = 0 and T = 1 slices of a longer tensor, forward and backward, on the
// CPU and (when there is one) the GPU, the one element's output and gradients as the formula
// gives them (one key: O = v, dq = dk = 0, dv = dO, to L's fp32 rounding).
TEST(Attention, EmptyAndOneElementViewsRun) {
  std::vector<Device> devices{kCPU};
  if (cuda_available()) devices.push_back(cuda_device(0));
  for (const Device dev : devices)
    for (int64_t T : {0, 1}) {
      SCOPED_TRACE(dev.str() + " T=" + std::to_string(T));
      const Tensor base = randn({1, 1, 3, 1}).to(dev);
      Tensor q = base.narrow(2, 1, T).detach(), k = base.narrow(2, 0, T).detach(),
             v = base.narrow(2, 2, T).detach();
      for (Tensor* t : {&q, &k, &v}) t->set_requires_grad();
      Tensor y = attention(q, k, v);
      ASSERT_EQ(y.shape(), (Shape{1, 1, T, 1}));
      sum(y).backward();
      if (T == 1) {  // P = exp(S − L) is 1 up to L's fp32 rounding
        EXPECT_NEAR(y.item(), v.item(), 1e-6 * std::abs(v.item()));
        EXPECT_NEAR(q.grad().item(), 0.0, 1e-6);
        EXPECT_NEAR(k.grad().item(), 0.0, 1e-6);
        EXPECT_NEAR(v.grad().item(), 1.0, 1e-6);
      }
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

// ---- CUDA, dropout on P -------------------------------------------------------------------

// Every kernel with dropout against the CPU reference with the same key, at the tolerances of
// the kernels without it: bf16 and f16 on the tensor cores at d = 32, 64, 128, f32 on the
// CUDA-core path, and d = 48 (bf16 off the tensor cores).
TEST(CudaAttentionDropout, EveryDtypeLengthAndHeadDimMatchesTheReference) {
  MT_REQUIRE_CUDA();
  manual_seed(30);
  DeterministicGuard det(true);
  const AttentionDropout a{.p = 0.2, .seed = 4242, .offset = 31};
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (int64_t d : {32, 64, 128})
      for (int64_t T : {1, 7, 64, 257}) {
        const Shape shape{2, 3, T, d};
        expect_matches_reference(shape, dt, 1.0, case_name(dt, shape, " dropout 0.2"), a);
      }
  for (int64_t T : {7, 257})
    expect_matches_reference({1, 2, T, 48}, DType::bf16, 1.0,
                             case_name(DType::bf16, {1, 2, T, 48}, " dropout 0.2"), a);
  // The atomic dQ variant takes its mask from the dK/dV pass.
  set_deterministic(false);
  for (DType dt : {DType::bf16, DType::f16})
    expect_matches_reference({2, 3, 257, 64}, dt, 1.0, case_name(dt, {2, 3, 257, 64}, " dropout, atomic dq"), a);
}

// The mask each kernel applies, read back through the outputs (read_masks above), bit for bit
// ops/dropout's: the tensor-core forward, dK/dV and dQ passes (bf16, f16), the atomic dQ variant,
// and the CUDA-core kernels (f32, and bf16 at d = 48), at T not a multiple of 4 or of the tiles.
TEST(CudaAttentionDropout, EveryKernelAppliesOpsDropoutsMaskBitForBit) {
  MT_REQUIRE_CUDA();
  manual_seed(31);
  const Device gpu = cuda_device(0);
  const AttentionDropout a{.p = 0.5, .seed = 99, .offset = 1000};
  for (bool det : {true, false}) {
    DeterministicGuard guard(det);
    for (DType dt : {DType::bf16, DType::f16, DType::f32})
      for (int64_t d : {32, 64, 128})
        for (int64_t T : {1, 7, 64, 257}) {
          if (!det && dt == DType::f32) continue;  // the CUDA-core path has no atomic variant
          const Shape shape{1, 2, T, d};
          const Tensor q = randn(shape, DType::f64);
          expect_masks_match(read_masks(q, a, dt, gpu), ops_dropout_keep(shape, a), T,
                             T >= 64 ? 0.5 : 0.0,
                             case_name(dt, shape, det ? "" : " atomic dq"));
        }
  }
  const Shape odd{1, 2, 71, 48};
  expect_masks_match(read_masks(randn(odd, DType::f64), a, DType::bf16, gpu),
                     ops_dropout_keep(odd, a), 71, 0.5, case_name(DType::bf16, odd));
}

// The same inputs and key give the same bits on every run, and another offset another mask.
TEST(CudaAttentionDropout, SameBitsRunToRun) {
  MT_REQUIRE_CUDA();
  manual_seed(32);
  DeterministicGuard det(true);
  const Device gpu = cuda_device(0);
  const Shape shape{2, 3, 1024, 64};
  const AttentionDropout a{.p = 0.1, .seed = 7, .offset = 3};
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    Tensor q = randn(shape, dt, gpu), k = randn(shape, dt, gpu), v = randn(shape, dt, gpu),
           dout = randn(shape, dt, gpu);
    const Pass x = run_kernels(q, k, v, dout, Tensor(), a), y = run_kernels(q, k, v, dout, Tensor(), a);
    for (const auto& [p1, p2, name] : {std::tuple{x.o, y.o, "O"}, std::tuple{x.lse, y.lse, "L"},
                                       std::tuple{x.dq, y.dq, "dq"}, std::tuple{x.dk, y.dk, "dk"},
                                       std::tuple{x.dv, y.dv, "dv"}})
      EXPECT_EQ(p1.to(kCPU).to_vector(), p2.to(kCPU).to_vector()) << dtype_name(dt) << " " << name;
    const Pass other = run_kernels(q, k, v, dout, Tensor(), {.p = 0.1, .seed = 7, .offset = 4});
    EXPECT_NE(other.o.to(kCPU).to_vector(), x.o.to(kCPU).to_vector()) << dtype_name(dt);
    // L is the softmax's statistic, before dropout: the same with or without it.
    EXPECT_EQ(run_kernels(q, k, v, dout).lse.to(kCPU).to_vector(), x.lse.to(kCPU).to_vector());
  }
}

// p = 0 and eval on the GPU are attention(q, k, v) to the bit (the kernels without dropout).
TEST(CudaAttentionDropout, ZeroPAndEvalAreAttentionItself) {
  MT_REQUIRE_CUDA();
  manual_seed(33);
  const Device gpu = cuda_device(0);
  for (DType dt : {DType::bf16, DType::f32}) {
    const Shape shape{2, 2, 129, 64};
    const Tensor q = randn(shape, dt, gpu), k = randn(shape, dt, gpu), v = randn(shape, dt, gpu);
    const auto plain = attention(q, k, v).to(kCPU).to_vector();
    EXPECT_EQ(attention(q, k, v, {.p = 0.0, .seed = 1}).to(kCPU).to_vector(), plain);
    EXPECT_EQ(attention(q, k, v, {.p = 0.3, .seed = 1, .training = false}).to(kCPU).to_vector(), plain);
    EXPECT_NE(attention(q, k, v, {.p = 0.3, .seed = 1}).to(kCPU).to_vector(), plain);
  }
}

TEST(CudaAttentionDropout, PassesTheOpCheckOnTheGpu) {
  MT_REQUIRE_CUDA();
  mt::check::Options gpu_only;
  gpu_only.cpu = false;
  for (int64_t d : {16, 64}) MT_EXPECT_OP_CHECK(attention_dropout_spec(d), gpu_only);
}

#ifdef MT_WITH_CUDA
// The backward's row sums D = rowsum(dO ∘ O) load 16-byte packs where the heads are aligned and
// single elements where not, in the same chunks and the same order (attention.cu): a dO one
// element off alignment must give the same bits as an aligned copy of it. Through the launcher:
// the op itself hands the kernels aligned copies. f32 (the CUDA-core kernels, which take
// misaligned heads); d = 64 packs evenly, d = 44 leaves a partial pack at each row's end.
TEST(AttentionCuda, RowSumsGiveTheSameBitsAlignedOrNot) {
  MT_REQUIRE_CUDA();
  manual_seed(13);
  const Device gpu = cuda_device(0);
  const cudaStream_t st = cuda::stream(0);
  for (int64_t d : {64, 44}) {
    SCOPED_TRACE("d=" + std::to_string(d));
    const int64_t heads = 6, T = 77, n = heads * T * d;
    const cuda::HeadsLayout layout = cuda::contiguous_heads(T, d);
    Tensor q = randn({n}, DType::f32, gpu), k = randn({n}, DType::f32, gpu),
           v = randn({n}, DType::f32, gpu), o = empty({n}, DType::f32, gpu),
           lse = empty({heads * T}, DType::f32, gpu);
    cuda::attention_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), layout, o.data_ptr(), layout,
                            lse.data<float>(), heads, T, d, DType::f32, st);
    const Tensor off = randn({n + 1}, DType::f32, gpu).narrow(0, 1, n);
    ASSERT_NE(reinterpret_cast<uintptr_t>(off.data_ptr()) % 16, 0u) << "the view is aligned after all";
    auto grads = [&](const Tensor& dout) {
      Tensor dq = empty({n}, DType::f32, gpu), dk = empty({n}, DType::f32, gpu),
             dv = empty({n}, DType::f32, gpu);
      cuda::attention_backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), layout, o.data_ptr(),
                               dout.data_ptr(), layout, lse.data<float>(), dq.data_ptr(),
                               dk.data_ptr(), dv.data_ptr(), heads, T, d, DType::f32,
                               /*deterministic=*/true, st);
      return std::vector<std::vector<double>>{dq.to_vector(), dk.to_vector(), dv.to_vector()};
    };
    EXPECT_EQ(grads(off), grads(off.clone()));
  }
}
#endif

#ifdef MT_WITH_CUDA
// A captured forward and backward replays with the word the device holds at that moment:
// advance_dropout_base records `base += stride` in the graph, so two replays draw two masks, each
// the mask an eager step of that step draws: O and the three gradients bitwise equal to eager
// calls at the next offsets, on the tensor-core kernels (bf16) and the CUDA-core ones (f32).
TEST(CudaAttentionDropout, EachGraphReplayDrawsTheNextStepsMaskAsEagerDoes) {
  MT_REQUIRE_CUDA();
  manual_seed(34);
  DeterministicGuard det(true);
  const Device dev = cuda_device(0);
  const uint64_t stride = 1000;
  for (DType dt : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Shape shape{2, 2, 67, 64};
    const Tensor q0 = randn(shape, dt, dev), k0 = randn(shape, dt, dev), v0 = randn(shape, dt, dev),
                 dout = randn(shape, dt, dev);
    Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
    Tensor base = zeros({1}, DType::i64, dev);
    const Tensor out = empty(shape, dt, dev);  // outlives the replays: made before the capture
    advance_dropout_base(base, 4 * stride, stride);  // eagerly: step 4's word
    const AttentionDropout a{.p = 0.2, .seed = 9, .offset = 3, .base = base};
    // An eager step first: the .grad the captured backward adds into exists before the capture.
    attention(q, k, v, a).backward(dout);
    cuda::Graph g = cuda::Graph::capture(0, [&] {
      advance_dropout_base(base, 0, stride);  // captured: += stride (the 0 is never used)
      Tensor y = attention(q, k, v, a);
      out.copy_(y);
      y.backward(dout);
    });
    std::vector<std::vector<double>> outs;
    for (int step = 5; step <= 6; ++step) {
      for (Tensor* t : {&q, &k, &v}) t->grad().fill_(0.0);
      g.replay();
      EXPECT_EQ(base.to_vector(), std::vector<double>{double(step * stride)});
      // The eager call of this step: the host offset alone, and the base word set eagerly.
      Tensor eager_base = zeros({1}, DType::i64, dev);
      advance_dropout_base(eager_base, step * stride, stride);
      for (const AttentionDropout& e :
           {AttentionDropout{.p = 0.2, .seed = 9, .offset = 3 + step * stride},
            AttentionDropout{.p = 0.2, .seed = 9, .offset = 3, .base = eager_base}}) {
        Tensor eq = leaf(q0), ek = leaf(k0), ev = leaf(v0);
        Tensor y = attention(eq, ek, ev, e);
        y.backward(dout);
        EXPECT_EQ(out.to_vector(), y.to_vector()) << "step " << step << ": O";
        EXPECT_EQ(q.grad().to_vector(), eq.grad().to_vector()) << "step " << step << ": dq";
        EXPECT_EQ(k.grad().to_vector(), ek.grad().to_vector()) << "step " << step << ": dk";
        EXPECT_EQ(v.grad().to_vector(), ev.grad().to_vector()) << "step " << step << ": dv";
      }
      outs.push_back(out.to_vector());
    }
    EXPECT_NE(outs[0], outs[1]);
  }
}

// In a graph capture the dQ pass runs on a side branch beside the dK/dV pass (attention.cu): the
// graph must have a branch, and its replay must give eager's bits, at every head dimension the
// tensor cores take, with a ragged last tile, for separate q, k, v and for the packed projection
// (where the two passes write column ranges of one dqkv).
TEST(CudaAttention, ACapturedBackwardIsTheEagerOneBitForBit) {
  MT_REQUIRE_CUDA();
  manual_seed(35);
  DeterministicGuard det(true);
  const Device dev = cuda_device(0);
  const DType dt = DType::bf16;
  const int64_t B = 2, H = 3, T = 257;
  // The eager pass, then the same as a graph (after an eager call: the .grad it adds into), its
  // output and gradients against eager's.
  auto check = [&](const std::vector<Tensor>& inputs, const Tensor& dout, const auto& op) {
    std::vector<Tensor> eager, graphed;
    for (const Tensor& t : inputs) eager.push_back(leaf(t)), graphed.push_back(leaf(t));
    const Tensor ey = op(eager);
    ey.backward(dout);
    const Tensor out = empty(ey.shape(), dt, dev);
    op(graphed).backward(dout);
    cuda::Graph g = cuda::Graph::capture(0, [&] {
      Tensor y = op(graphed);
      out.copy_(y);
      y.backward(dout);
    });
    EXPECT_LT(g.longest_chain(), g.num_nodes()) << "no side branch: " << g.node_kinds();
    for (Tensor& t : graphed) t.grad().fill_(0.0);  // .grad accumulates: one replay's worth
    g.replay();
    EXPECT_EQ(out.to_vector(), ey.to_vector()) << "output";
    for (size_t i = 0; i < inputs.size(); ++i)
      EXPECT_EQ(graphed[i].grad().to_vector(), eager[i].grad().to_vector()) << "gradient " << i;
  };
  for (int64_t d : {32, 64, 128}) {
    SCOPED_TRACE("d = " + std::to_string(d));
    const Shape shape{B, H, T, d};
    check({randn(shape, dt, dev), randn(shape, dt, dev), randn(shape, dt, dev)},
          randn(shape, dt, dev),
          [](const std::vector<Tensor>& x) { return attention(x[0], x[1], x[2]); });
  }
  SCOPED_TRACE("packed, d = 64");
  check({randn({B, T, 3 * H * 64}, dt, dev)}, randn({B, T, H * 64}, dt, dev),
        [H](const std::vector<Tensor>& x) { return attention_packed(x[0], H); });
}

// One launch's limits (a grid's 65535 blocks in y: the tile kernels' tiles of at least 64 rows,
// the CUDA-core kernels' heads) refuse a shape before anything touches the device, so this runs
// without a GPU: T one past 65535 · 64, and 65536 heads, each with the limit in the message.
TEST(AttentionCudaLimits, AShapePastOneLaunchIsRefusedWithTheLimit) {
  const int64_t too_long = int64_t(65535) * 64 + 1;
  const cuda::HeadsLayout l = cuda::contiguous_heads(too_long, 64);
  for (const auto& [heads, T] : {std::pair<int64_t, int64_t>{1, too_long}, {65536, 16}}) {
    SCOPED_TRACE(std::to_string(heads) + " heads, T = " + std::to_string(T));
    expect_error([&] { cuda::attention_forward(nullptr, nullptr, nullptr, l, nullptr, l, nullptr,
                                               heads, T, 64, DType::bf16, nullptr); },
                 {"attention_forward", "at most 65535 heads and 4194240 positions"});
    expect_error([&] { cuda::attention_backward(nullptr, nullptr, nullptr, l, nullptr, nullptr, l,
                                                nullptr, nullptr, nullptr, nullptr, heads, T, 64,
                                                DType::bf16, true, nullptr); },
                 {"attention_backward", "at most 65535 heads and 4194240 positions"});
  }
}

// The Hopper forward is persistent (a block an SM taking (head, Q tile) items from a counter):
// with far more items than SMs every block walks many, its buffers and barriers carried from one
// item to the next, the ragged last tile among them; and a graph replay gives the eager bits
// twice over. On the framework's stream no memset zeroes the counter: each launch leaves it at
// zero for the next, eager or replayed (a launch that did not would leave the next one only its
// first item a block, and the rest of its O unwritten).
TEST(AttentionCuda, ManyItemsABlockMatchTheReferenceAndReplay) {
  MT_REQUIRE_CUDA();
  manual_seed(12);
  for (int64_t d : {64, 128}) {
    const Shape shape{4, 50, 300, d};  // 200 heads × 3 Q tiles: 600 items
    expect_matches_reference(shape, DType::bf16, 1.0, case_name(DType::bf16, shape));
    const Device dev = cuda_device(0);
    const Tensor q = randn(shape, DType::bf16, dev), k = randn(shape, DType::bf16, dev),
                 v = randn(shape, DType::bf16, dev);
    const Tensor eager = attention(q, k, v), out = empty(shape, DType::bf16, dev);
    cuda::Graph g = cuda::Graph::capture(0, [&] { out.copy_(attention(q, k, v)); });
    for (int replay = 0; replay < 2; ++replay) {
      out.fill_(0.0);
      g.replay();
      EXPECT_EQ(out.to_vector(), eager.to_vector()) << "d = " << d << ", replay " << replay;
    }
  }
}

// The Hopper forward's work counter: on the framework's stream the kernel's own, which every launch
// leaves at zero for the next; on any other stream a counter of the launch's own, zeroed in
// stream order, since such a launch may run beside one on the framework's stream. The reference
// bits come from a launch on a stream of the test's own; then launches on the two streams
// alternate, each checked (a framework-stream launch that found the counter where the one before
// left it, not at zero, would walk only its first item a block and leave the rest of O unwritten);
// then one on each stream back to back, into two outputs; then a graph captured on the test's
// stream, its memset replayed with it. What this cannot show is two streams sharing the counter:
// on an H200 a mutant that shared it passed, at this size and at 96 heads × T = 2000 (0.15 ms a
// launch). A grid fills every SM, so the second's blocks start only as the first's leave their
// SMs, and a block leaves after its producer has counted past the end: by then the counter has
// most likely been zeroed already. (Two grids of half the SMs each, at once, let that mutant pass
// too: with as many items as blocks the counts can end anywhere and O is still whole.) The next
// test shows it without a race.
TEST(AttentionCuda, TheForwardsCounterIsZeroAgainAfterEachLaunchAndPerStreamElsewhere) {
  MT_REQUIRE_CUDA();
  if (!cuda::attention_uses_wgmma(DType::bf16, 64))
    GTEST_SKIP() << "the persistent forward runs on an sm_90a build on a compute 9.0 GPU only";
  manual_seed(14);
  const Device gpu = cuda_device(0);
  const int64_t heads = 200, T = 300, d = 64, n = heads * T * d;  // 600 items
  const cuda::HeadsLayout layout = cuda::contiguous_heads(T, d);
  const Tensor q = randn({n}, DType::bf16, gpu), k = randn({n}, DType::bf16, gpu),
               v = randn({n}, DType::bf16, gpu);
  const Tensor o = empty({n}, DType::bf16, gpu), lse = empty({heads * T}, DType::f32, gpu);
  const Tensor o2 = empty({n}, DType::bf16, gpu), lse2 = empty({heads * T}, DType::f32, gpu);
  auto forward = [&](cudaStream_t st, const Tensor& out, const Tensor& l) {
    cuda::attention_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), layout, out.data_ptr(),
                            layout, l.data<float>(), heads, T, d, DType::bf16, st);
  };
  cudaStream_t own = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), cudaSuccess);
  const std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> own_guard(
      own, [](cudaStream_t st) { (void)cudaStreamDestroy(st); });
  auto poison = [&] {  // on the framework's stream, done before a launch on either
    o.fill_(0.0), lse.fill_(0.0), o2.fill_(0.0), lse2.fill_(0.0);
    cuda::synchronize(0);
  };
  auto on_own = [&](const Tensor& out, const Tensor& l) {
    forward(own, out, l);
    ASSERT_EQ(cudaStreamSynchronize(own), cudaSuccess);
  };
  poison();
  on_own(o, lse);
  const std::vector<double> want = o.to_vector(), want_lse = lse.to_vector();
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    poison();
    forward(cuda::stream(0), o, lse);
    EXPECT_EQ(o.to_vector(), want) << "the framework's stream";
    EXPECT_EQ(lse.to_vector(), want_lse) << "the framework's stream";
    poison();
    on_own(o, lse);
    EXPECT_EQ(o.to_vector(), want) << "the test's stream";
    EXPECT_EQ(lse.to_vector(), want_lse) << "the test's stream";
  }
  poison();
  forward(cuda::stream(0), o, lse);
  forward(own, o2, lse2);
  ASSERT_EQ(cudaStreamSynchronize(own), cudaSuccess);
  EXPECT_EQ(o.to_vector(), want) << "the framework's stream, beside the test's";
  EXPECT_EQ(lse.to_vector(), want_lse) << "the framework's stream, beside the test's";
  EXPECT_EQ(o2.to_vector(), want) << "the test's stream, beside the framework's";
  EXPECT_EQ(lse2.to_vector(), want_lse) << "the test's stream, beside the framework's";
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(own, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  try {
    forward(own, o, lse);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the forward failed inside the capture: " << e.what();
  }
  ASSERT_EQ(cudaStreamEndCapture(own, &graph), cudaSuccess);  // before any assertion can leave
  const std::unique_ptr<CUgraph_st, void (*)(cudaGraph_t)> graph_guard(
      graph, [](cudaGraph_t g) { (void)cudaGraphDestroy(g); });
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  const std::unique_ptr<CUgraphExec_st, void (*)(cudaGraphExec_t)> exec_guard(
      exec, [](cudaGraphExec_t e) { (void)cudaGraphExecDestroy(e); });
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    poison();
    ASSERT_EQ(cudaGraphLaunch(exec, own), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(own), cudaSuccess);
    EXPECT_EQ(o.to_vector(), want);
    EXPECT_EQ(lse.to_vector(), want_lse);
    forward(cuda::stream(0), o2, lse2);  // the kernel's own counter, between the replays
  }
  cuda::synchronize(0);
  EXPECT_EQ(o2.to_vector(), want) << "the framework's stream, after the replays";
}

// A launch on another stream never touches the framework stream's counters. They are set to
// where a framework-stream launch in flight would have them (the item counter at two thirds of
// the items, no block done); a launch on the test's stream must still write all of O and L and
// leave them as set. Had it counted on them, its blocks would go on from there (plus the grid)
// after their first item, and the items between would stay unwritten.
TEST(AttentionCuda, ALaunchOnAnotherStreamLeavesTheFrameworkStreamsCountersAlone) {
  MT_REQUIRE_CUDA();
  if (!cuda::attention_uses_wgmma(DType::bf16, 64))
    GTEST_SKIP() << "the persistent forward runs on an sm_90a build on a compute 9.0 GPU only";
  manual_seed(15);
  const Device gpu = cuda_device(0);
  const int64_t heads = 200, T = 300, d = 64, n = heads * T * d;
  const int items = int(heads * ((T + 127) / 128));  // Q tiles of 128 rows: 600, past any grid
  ASSERT_GT(items, 2 * cuda::sm_count(0));
  const cuda::HeadsLayout layout = cuda::contiguous_heads(T, d);
  const Tensor q = randn({n}, DType::bf16, gpu), k = randn({n}, DType::bf16, gpu),
               v = randn({n}, DType::bf16, gpu);
  const Tensor o = empty({n}, DType::bf16, gpu), lse = empty({heads * T}, DType::f32, gpu);
  auto forward = [&](cudaStream_t st) {
    o.fill_(0.0), lse.fill_(0.0);
    cuda::synchronize(0);
    cuda::attention_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), layout, o.data_ptr(),
                            layout, lse.data<float>(), heads, T, d, DType::bf16, st);
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);  // the outputs' checks follow
  };
  cudaStream_t own = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), cudaSuccess);
  const std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> own_guard(
      own, [](cudaStream_t st) { (void)cudaStreamDestroy(st); });
  forward(cuda::stream(0));
  const std::vector<double> want = o.to_vector(), want_lse = lse.to_vector();
  EXPECT_EQ(cuda::testing::attention_forward_counters(), (std::array<int, 2>{0, 0}));
  const std::array<int, 2> in_flight{items * 2 / 3, 0};
  cuda::testing::set_attention_forward_counters(in_flight);
  struct PutBack {  // however the test ends, the next launch on the framework's stream finds zero
    ~PutBack() {
      try {
        cuda::testing::set_attention_forward_counters({0, 0});
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the counters could not be put back: " << e.what();
      }
    }
  } put_back;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    forward(own);
    EXPECT_EQ(o.to_vector(), want);
    EXPECT_EQ(lse.to_vector(), want_lse);
    EXPECT_EQ(cuda::testing::attention_forward_counters(), in_flight);
  }
}
#endif
