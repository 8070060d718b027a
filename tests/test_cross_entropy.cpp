// cross_entropy on the CPU: gradient checks for the logits, the forward against the formula, the
// normalizer and ignore_index rules, accumulation, strided logits, 16-bit rounding, misuse errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/autograd.h"
#include "core/rng.h"
#include "ops/cross_entropy/bad_target.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "tests/expect_error.h"
#include "tests/gradcheck.h"
#include "tests/f64_reference.h"
#include "tests/poison_scope.h"

using namespace mt;
using mt::test::expect_error;
using mt::test::expect_gradcheck;
using mt::test::random_leaf;
using mt::test::expect_near_reference;
using mt::test::PoisonScope;
using mt::test::unit_roundoff;

namespace {

constexpr int64_t kIgnore = -100;

Tensor targets_of(const std::vector<int64_t>& t, DType dtype = DType::i64) {
  return from_vector(t, {int64_t(t.size())}, dtype);
}

Tensor random_targets(int64_t rows, int64_t C, Generator& g) {
  std::vector<int64_t> t;
  for (int64_t r = 0; r < rows; ++r) t.push_back(int64_t(g.below(uint64_t(C))));
  return from_vector(t, {rows});
}

// Σ over kept rows of (log Σ_c exp(x[r, c]) − x[r, t_r]), without the max trick: the oracle.
double naive_loss_sum(const Tensor& logits, const std::vector<int64_t>& t, int64_t ignore_index) {
  const int64_t C = logits.size(1);
  const auto v = logits.to_vector();
  double s = 0;
  for (size_t r = 0; r < t.size(); ++r) {
    if (t[r] == ignore_index) continue;
    double z = 0;
    for (int64_t c = 0; c < C; ++c) z += std::exp(v[r * size_t(C) + size_t(c)]);
    s += std::log(z) - v[r * size_t(C) + size_t(t[r])];
  }
  return s;
}

}  // namespace

TEST(CrossEntropy, GradientCheckForLogits) {
  manual_seed(1);
  Generator g(1);
  for (int64_t C : {1, 2, 37}) {
    Tensor targets = random_targets(5, C, g);
    Tensor with_ignored = targets.clone();
    with_ignored.data<int64_t>()[3] = kIgnore;
    for (double normalizer : {0.0, 7.5}) {
      for (const Tensor& t : {targets, with_ignored}) {
        expect_gradcheck(
            [&](auto& in) { return cross_entropy(in[0], t, kIgnore, normalizer); },
            {random_leaf({5, C})},
            "cross_entropy C " + std::to_string(C) + " normalizer " + std::to_string(normalizer));
      }
    }
  }
}

TEST(CrossEntropy, ForwardMatchesTheFormulaWithTheNormalizerRule) {
  manual_seed(2);
  Tensor logits = random_leaf({5, 4}, -3, 3, false);
  const std::vector<int64_t> t{0, kIgnore, 3, 2, kIgnore};
  Tensor targets = targets_of(t);
  const double s = naive_loss_sum(logits, t, kIgnore);
  Tensor loss = cross_entropy(logits, targets);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_EQ(loss.dtype(), DType::f64);
  EXPECT_NEAR(loss.item(), s / 3, 1e-14);  // normalizer <= 0: the 3 kept targets
  EXPECT_NEAR(cross_entropy(logits, targets, kIgnore, 10).item(), s / 10, 1e-14);
  // ignore_index may be any value, a valid class too.
  const std::vector<int64_t> t2{0, 2, 3, 2, 1};
  EXPECT_NEAR(cross_entropy(logits, targets_of(t2), 2).item(),
              naive_loss_sum(logits, t2, 2) / 3, 1e-14);
  // And the backward skips the rows of that class (not rows with a negative target): rows 1 and
  // 3 get no gradient, the others one that sums to 0 over the row.
  Tensor leaf = logits.detach();
  leaf.set_requires_grad(true);
  cross_entropy(leaf, targets_of(t2), 2).backward();
  const std::vector<double> g = leaf.grad().to_vector();
  const int64_t C = leaf.size(1);
  for (int64_t r = 0; r < leaf.size(0); ++r) {
    double abs_sum = 0;
    for (int64_t c = 0; c < C; ++c) abs_sum += std::abs(g[size_t(r * C + c)]);
    if (t2[size_t(r)] == 2) EXPECT_EQ(abs_sum, 0.0) << "row " << r;
    else EXPECT_GT(abs_sum, 0.0) << "row " << r;
  }
}

// Logits far from zero: exp(1000) overflows and exp(-1000) underflows, so the kernels must
// subtract each row's maximum. The oracle is log-sum-exp in f64 with its own max subtraction.
TEST(CrossEntropy, LargeLogitsMatchAnF64LogSumExp) {
  manual_seed(7);
  for (DType dt : {DType::f64, DType::f32}) {
    const int64_t rows = 4, C = 5;
    Tensor offsets = rand({rows, C}, DType::f64);
    std::vector<double> v = offsets.to_vector();
    for (int64_t c = 0; c < C; ++c) {
      v[size_t(c)] += 1000;                             // all large
      v[size_t(C + c)] -= 1000;                         // all very negative
      v[size_t(2 * C + c)] += c % 2 ? 1000.0 : -1000.0;  // both: the small terms vanish
      // row 3: the offsets alone
    }
    Tensor logits = from_vector(v, {rows, C}).to(dt).set_requires_grad();
    const std::vector<int64_t> t{2, 0, 1, 4};
    Tensor loss = cross_entropy(logits, targets_of(t));
    loss.backward();
    const auto x = logits.detach().to_vector();  // the values the kernel read, in f64
    double expected = 0;
    std::vector<double> dx(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      const double* row = x.data() + r * C;
      const double m = *std::max_element(row, row + C);
      double z = 0;
      for (int64_t c = 0; c < C; ++c) z += std::exp(row[c] - m);
      const double lse = m + std::log(z);
      expected += lse - row[t[size_t(r)]];
      for (int64_t c = 0; c < C; ++c)
        dx[size_t(r * C + c)] = (std::exp(row[c] - lse) - (c == t[size_t(r)])) / double(rows);
    }
    expected /= double(rows);
    const double tol = dt == DType::f64 ? 1e-12 : 1e-4;  // f32: 1000 + x carries 2^-14 of x
    ASSERT_TRUE(std::isfinite(loss.item())) << dtype_name(dt);
    EXPECT_NEAR(loss.item(), expected, tol) << dtype_name(dt);
    const auto g = logits.grad().to_vector();
    for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], dx[i], tol) << dtype_name(dt) << " " << i;
  }
}

// ±inf logits give the limits: a +inf logit off the target makes lse, and the loss, +inf; a row
// masked to -inf but for its target has lse = that logit, loss 0 and no gradient. Subtracting the
// max from every logit would make the first NaN (inf - inf).
TEST(CrossEntropy, InfiniteLogitsGiveTheLimitsNotNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    Tensor up = from_vector(std::vector<double>{0.5, inf, -1.0}, {1, 3}).to(dt);
    EXPECT_EQ(cross_entropy(up, targets_of({0})).item(), inf) << dtype_name(dt);
    Tensor masked =
        from_vector(std::vector<double>{-inf, 2.0, -inf, -inf}, {1, 4}).to(dt).set_requires_grad();
    Tensor loss = cross_entropy(masked, targets_of({1}));
    EXPECT_EQ(loss.item(), 0.0) << dtype_name(dt);
    loss.backward();
    for (double g : masked.grad().to_vector()) EXPECT_EQ(g, 0.0) << dtype_name(dt);
  }
}

TEST(CrossEntropy, EveryTargetIgnoredGivesZeroLossAndZeroGradientNotNaN) {
  Tensor logits = random_leaf({3, 4});
  Tensor targets = targets_of({kIgnore, kIgnore, kIgnore});
  Tensor loss = cross_entropy(logits, targets);
  EXPECT_EQ(loss.item(), 0.0);
  loss.backward();
  for (double g : logits.grad().to_vector()) EXPECT_EQ(g, 0.0);
  Tensor empty_batch = random_leaf({0, 4});
  Tensor none = cross_entropy(empty_batch, targets_of({}));
  EXPECT_EQ(none.item(), 0.0);
}

TEST(CrossEntropyAccumulation, BackwardTwiceIsTwiceOneBackward) {
  manual_seed(3);
  Generator g(3);
  Tensor logits = random_leaf({6, 37});
  Tensor targets = random_targets(6, 37, g);
  cross_entropy(logits, targets, kIgnore, 23).backward();
  const auto once = logits.grad().to_vector();
  {
    NoGradGuard eval;
    cross_entropy(logits, targets, kIgnore, 23);
  }
  EXPECT_EQ(logits.grad().to_vector(), once);
  cross_entropy(logits, targets, kIgnore, 23).backward();
  const auto twice = logits.grad().to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_EQ(twice[i], 2 * once[i]);
  logits.zero_grad();
  cross_entropy(logits, targets, kIgnore, 23).backward();
  EXPECT_EQ(logits.grad().to_vector(), once);
}

TEST(CrossEntropyTrap3, NonContiguousLogitsMatchContiguous) {
  manual_seed(4);
  Generator g(4);
  Tensor lt = random_leaf({37, 6});
  Tensor targets = random_targets(6, 37, g);
  Tensor seed = full({}, 0.7, DType::f64);
  Tensor strided_loss = cross_entropy(lt.t(), targets);
  strided_loss.backward(seed);
  Tensor logits = lt.detach().t().contiguous();
  logits.set_requires_grad();
  Tensor loss = cross_entropy(logits, targets);
  loss.backward(seed);
  EXPECT_EQ(loss.item(), strided_loss.item());
  EXPECT_EQ(logits.grad().t().to_vector(), lt.grad().to_vector());
}

TEST(CrossEntropy, SixteenBitIsFp32MathOnTheRoundedLogitsRoundedOnce) {
  manual_seed(5);
  Generator g(5);
  Tensor targets = random_targets(4, 37, g);
  targets.data<int64_t>()[1] = kIgnore;
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor logits = randn({4, 37}).to(t);
    logits.set_requires_grad();
    Tensor loss = cross_entropy(logits, targets, kIgnore, 9);
    EXPECT_EQ(loss.dtype(), DType::f32);
    loss.backward();
    Tensor ref = logits.detach().to(DType::f32);
    ref.set_requires_grad();
    Tensor ref_loss = cross_entropy(ref, targets, kIgnore, 9);
    ref_loss.backward();
    EXPECT_EQ(loss.item(), ref_loss.item()) << dtype_name(t);
    EXPECT_EQ(logits.grad().to_vector(), ref.grad().to(t).to_vector()) << dtype_name(t);
    // The math: f64 on the same rounded logits. The loss is an fp32 value; dlogits is rounded to t.
    Tensor r64 = logits.detach().to(DType::f64);
    r64.set_requires_grad();
    Tensor loss64 = cross_entropy(r64, targets, kIgnore, 9);
    loss64.backward();
    expect_near_reference(loss, loss64, 1e-6, dtype_name(t));
    expect_near_reference(logits.grad(), r64.grad(), 2 * unit_roundoff(t), dtype_name(t));
  }
}

TEST(CrossEntropy, BadArgumentsAreClearErrors) {
  Tensor logits = random_leaf({3, 4});
  expect_error([&] { cross_entropy(logits, targets_of({0, 1, 4})); },
               {"cross_entropy", "row 2", "target 4", "C = 4"});
  expect_error([&] { cross_entropy(logits, targets_of({-1, 1, 2})); },
               {"cross_entropy", "row 0", "target -1", "C = 4"});
  expect_error([&] { cross_entropy(logits, targets_of({0, 1})); },
               {"cross_entropy", "targets", "[2]", "[3, 4]"});
  expect_error([&] { cross_entropy(logits, targets_of({0, 1, 2}, DType::i32)); },
               {"cross_entropy", "targets", "i64", "i32"});
  expect_error([&] { cross_entropy(random_leaf({4}), targets_of({0})); },
               {"cross_entropy", "logits", "[4]"});
  expect_error([&] { cross_entropy(random_leaf({3, 0}), targets_of({0, 0, 0})); },
               {"cross_entropy", "logits", "[3, 0]"});
  expect_error([&] { cross_entropy(logits, targets_of({0, 1, 2}), kIgnore, NAN); },
               {"cross_entropy", "normalizer", "nan"});
}

// The CUDA forward cannot throw: it leaves a BadTargetRecord that the host raises later
// (bad_target.h). Its logic is plain C++, checked here, where CI runs it.
TEST(CrossEntropyBadTarget, CpuThrowsTheMessageTheDeviceRecordRaises) {
  std::string cpu;
  try {
    cross_entropy(random_leaf({3, 4}), targets_of({0, 7, 1}));
  } catch (const Error& e) {
    cpu = e.what();
  }
  EXPECT_EQ(cpu, bad_target_message(1, 7, 4, kIgnore));
  EXPECT_EQ(cpu, "cross_entropy: row 1 has target 7, outside [0, 4) for C = 4 classes (and not "
                 "ignore_index -100)");

  BadTargetRecord r;
  raise_bad_target(r);  // nothing waiting: no error
  note_bad_target(r, 1, 7, 4, kIgnore);
  note_bad_target(r, 0, -5, 4, kIgnore);  // a later call's: the first waiting one is reported
  std::string device;
  try {
    raise_bad_target(r);
  } catch (const Error& e) {
    device = e.what();
  }
  EXPECT_EQ(device, cpu);
  EXPECT_EQ(r.row, -1);
  raise_bad_target(r);  // reported once; the record is clean again
  note_bad_target(r, 2, 4, 4, 3);
  expect_error([&] { raise_bad_target(r); }, {"row 2", "target 4", "C = 4", "ignore_index 3"});
}

// ---- a padded vocabulary: valid_classes < C ---------------------------------------------------

namespace {
// Logits [rows, C] whose padding columns (>= valid) hold large values: if they counted, the loss
// and the gradient would move far.
Tensor padded_logits(int64_t rows, int64_t C, int64_t valid, uint64_t seed) {
  manual_seed(seed);
  Tensor l = random_leaf({rows, C}, -3, 3, false);
  double* p = l.data<double>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = valid; c < C; ++c) p[r * C + c] = 40.0 + double(c % 7);
  return l;
}
}  // namespace

TEST(CrossEntropyPadded, EqualsTheUnpaddedLossAndGivesThePaddingZeroGradient) {
  const int64_t rows = 6, C = 16, valid = 11;
  Tensor l = padded_logits(rows, C, valid, 21);
  l.set_requires_grad();
  Tensor t = targets_of({0, 10, kIgnore, 3, 10, 7});
  Tensor loss = cross_entropy(l, t, kIgnore, 0, valid);
  loss.backward();

  // The same rows cut to their valid columns, through the unpadded op.
  Tensor cut = empty({rows, valid}, DType::f64);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < valid; ++c)
      cut.data<double>()[r * valid + c] = l.data<double>()[r * C + c];
  cut.set_requires_grad();
  Tensor ref = cross_entropy(cut, t, kIgnore);
  ref.backward();
  EXPECT_NEAR(loss.item(), ref.item(), 1e-14);
  const auto g = l.grad().to_vector(), gr = cut.grad().to_vector();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < valid; ++c)
      EXPECT_NEAR(g[size_t(r * C + c)], gr[size_t(r * valid + c)], 1e-15) << r << ", " << c;
    for (int64_t c = valid; c < C; ++c) EXPECT_EQ(g[size_t(r * C + c)], 0.0) << r << ", " << c;
  }
}

TEST(CrossEntropyPadded, GradientCheck) {
  Tensor l = padded_logits(4, 9, 6, 22);
  l.set_requires_grad();
  Tensor t = targets_of({5, 0, kIgnore, 2});
  expect_gradcheck([&](auto& in) { return cross_entropy(in[0], t, kIgnore, 3.0, 6); }, {l},
                   "padded cross_entropy");
}

TEST(CrossEntropyPadded, ATargetInThePaddingIsABadTarget) {
  Tensor l = padded_logits(2, 16, 11, 23);
  expect_error([&] { cross_entropy(l, targets_of({3, 11}), kIgnore, 0, 11); },
               {"cross_entropy", "row 1", "target 11", "[0, 11)"});
  expect_error([&] { cross_entropy(l, targets_of({3, 1}), kIgnore, 0, 17); },
               {"cross_entropy", "valid_classes", "17", "[2, 16]"});
  expect_error([&] { cross_entropy(l, targets_of({3, 1}), kIgnore, 0, -1); },
               {"cross_entropy", "valid_classes", "-1"});
}

// GPT-2's vocabulary on the GPU: 50257 classes in rows of 50304 (16-byte packs cover the padding
// boundary mid-pack; 256 threads a row), allocations poisoned, padding gradients exactly 0, and
// every other element against the f64 op on the same rounded logits. Element by element: with
// U(-3, 3) logits no gradient off the target is above ~6.4e-6, so a bound at the target column's
// scale (~1/19) would pass a backward without the softmax term. In f32 the bound is what fp32
// math leaves (lse is off by ~1e-6, and each exp with it); 16-bit adds one rounding to the dtype,
// and in f16 the gradients off the target are subnormal, so their rounding is absolute (2^-25).
TEST(CudaCrossEntropyPadded, Gpt2VocabularyMatchesTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  const PoisonScope poison;
  const int64_t rows = 24, C = 50304, valid = 50257;
  Tensor base = padded_logits(rows, C, valid, 24);
  std::vector<int64_t> tv;
  for (int64_t r = 0; r < rows; ++r) tv.push_back(r % 5 == 4 ? kIgnore : (r * 7919) % valid);
  tv[1] = valid - 1;  // the last real class, in the pack that holds the first padding column
  Tensor t = targets_of(tv);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor rounded = base.to(dt);
    Tensor l64 = rounded.to(DType::f64), lg = rounded.to(cuda_device(0));
    l64.set_requires_grad();
    lg.set_requires_grad();
    Tensor loss64 = cross_entropy(l64, t, kIgnore, 19.0, valid);
    Tensor loss_g = cross_entropy(lg, t.to(cuda_device(0)), kIgnore, 19.0, valid);
    EXPECT_NEAR(loss_g.item(), loss64.item(), 1e-5 * std::abs(loss64.item()));
    loss64.backward();
    loss_g.backward();
    const auto gg = lg.grad().to_vector(), gr = l64.grad().to_vector();
    ASSERT_EQ(gg.size(), gr.size());
    const double rel = dt == DType::f32 ? 1e-5 : 2 * unit_roundoff(dt);
    // f16's absolute rounding of subnormals; else far below the bound of the smallest (~1.6e-8).
    const double abs_floor = dt == DType::f16 ? 0x1p-25 : 1e-15;
    double used = 0;  // the largest share of its bound an element's error takes
    int64_t bad = 0;
    for (size_t i = 0; i < gg.size(); ++i) {
      if (int64_t(i) % C >= valid) {
        ASSERT_EQ(gg[i], 0.0) << "padding element " << i;
        continue;
      }
      const double err = std::abs(gg[i] - gr[i]), bound = rel * std::abs(gr[i]) + abs_floor;
      if (!(err <= bound) && bad++ < 5)  // a NaN (an element never written) fails too
        ADD_FAILURE() << "element " << i << " (row " << int64_t(i) / C << ", class "
                      << int64_t(i) % C << ") is " << gg[i] << ", the f64 reference " << gr[i];
      used = std::max(used, err / bound);
    }
    EXPECT_EQ(bad, 0) << bad << " gradient elements outside the bound";
    std::printf("cross_entropy %s, 50257 classes: the worst gradient element used %.2f of its "
                "bound\n", dtype_name(dt), used);
  }
}
