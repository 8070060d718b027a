// Gradient accumulation over microbatches, end to end through every op's backward:
//
//   Linear -> RMSNorm -> ScaledSiLU -> Linear -> cross_entropy
//
// One optimizer step over B samples, split into k microbatches of uneven sizes b1..bk, each
// backward adding into .grad, must leave the full-batch gradient. That holds only when every
// microbatch divides its summed loss by the WHOLE step's count of targets (B, or the number of
// non-ignored targets), never by its own: the last test shows the trap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "core/rng.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/linear/linear.h"
#include "ops/rms_norm/rms_norm.h"
#include "ops/scaled_silu/scaled_silu.h"
#include "tests/gradcheck.h"
#include "tests/small_mlp.h"

using namespace mt;

namespace {

constexpr int64_t B = 23, D = test::SmallMlp::D, C = test::SmallMlp::C;
constexpr int64_t kIgnore = test::SmallMlp::kIgnore;
const std::vector<std::vector<int64_t>> kSplits{{23}, {15, 8}, {4, 12, 7}, {9, 1, 6, 7}};

using Model = test::SmallMlp;

struct Batch {
  Tensor x, targets;
};

Batch make_batch(DType dtype, const std::vector<int64_t>& ignored_rows = {}) {
  Generator gen(7);
  std::vector<int64_t> t;
  for (int64_t r = 0; r < B; ++r) t.push_back(int64_t(gen.below(C)));
  for (int64_t r : ignored_rows) t[size_t(r)] = kIgnore;
  return {test::random_leaf({B, D}, -2, 2, /*grad=*/false).to(dtype), from_vector(t, {B})};
}

using Grads = std::vector<std::vector<double>>;

// One optimizer step's gradients: zero_grad, then one backward per microbatch of `sizes`, the
// microbatch's loss divided by normalizer(its targets).
template <class Normalizer>
Grads accumulate(const Model& m, const Batch& batch, const std::vector<int64_t>& sizes,
                 Normalizer normalizer) {
  for (Tensor p : m.params()) p.zero_grad();
  int64_t begin = 0;
  for (int64_t n : sizes) {
    Tensor t = batch.targets.slice_rows(begin, begin + n);
    m.loss(batch.x.slice_rows(begin, begin + n), t, normalizer(t)).backward();
    begin += n;
  }
  Grads g;
  for (const Tensor& p : m.params()) g.push_back(p.grad().to_vector());
  return g;
}

// max over parameters of max|a − b| / max|b|: the error relative to each gradient's scale.
double max_relative_error(const Grads& got, const Grads& want) {
  double worst = 0;
  for (size_t p = 0; p < want.size(); ++p) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want[p].size(); ++i) {
      diff = std::max(diff, std::abs(got[p][i] - want[p][i]));
      scale = std::max(scale, std::abs(want[p][i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

int64_t kept(const Tensor& targets) {
  auto t = targets.to_vector();
  return int64_t(std::count_if(t.begin(), t.end(), [](double v) { return v != kIgnore; }));
}

void expect_microbatches_match_full_batch(DType dtype, double tolerance) {
  manual_seed(1);
  Model m(dtype);
  Batch batch = make_batch(dtype);
  const Grads full = accumulate(m, batch, {B}, [](const Tensor&) { return 0.0; });  // the mean
  for (const auto& sizes : kSplits) {
    const Grads acc = accumulate(m, batch, sizes, [](const Tensor&) { return double(B); });
    EXPECT_LE(max_relative_error(acc, full), tolerance)
        << dtype_name(dtype) << ", k = " << sizes.size();
  }
}

}  // namespace

TEST(Microbatch, AccumulatedGradsEqualFullBatchF64) {
  expect_microbatches_match_full_batch(DType::f64, 1e-12);
}

TEST(Microbatch, AccumulatedGradsEqualFullBatchF32) {
  expect_microbatches_match_full_batch(DType::f32, 1e-5);
}

// Ignored targets spread unevenly: the first microbatch of the k = 4 split has four, the second
// (a single row) is ignored entirely. The normalizer is the step's count of kept targets.
TEST(Microbatch, IgnoredTargetsUseTheWholeStepsCount) {
  for (auto [dtype, tolerance] : {std::pair{DType::f64, 1e-12}, std::pair{DType::f32, 1e-5}}) {
    manual_seed(2);
    Model m(dtype);
    Batch batch = make_batch(dtype, {0, 1, 2, 5, 9, 20});
    const double n = double(kept(batch.targets));
    ASSERT_EQ(n, B - 6);
    const Grads full = accumulate(m, batch, {B}, [](const Tensor&) { return 0.0; });
    for (const auto& sizes : kSplits) {
      const Grads acc = accumulate(m, batch, sizes, [n](const Tensor&) { return n; });
      EXPECT_LE(max_relative_error(acc, full), tolerance)
          << dtype_name(dtype) << ", k = " << sizes.size();
    }
  }
}

// The negative control: dividing each microbatch by its own count (the per-call mean) weights
// the samples of small microbatches more, and the accumulated gradient is measurably wrong.
TEST(MicrobatchTrap, DividingByOwnCountIsWrong) {
  manual_seed(3);
  Model m(DType::f64);
  Batch batch = make_batch(DType::f64);
  const Grads full = accumulate(m, batch, {B}, [](const Tensor&) { return 0.0; });
  for (const auto& sizes : kSplits) {
    if (sizes.size() == 1) continue;  // one microbatch: its own count is the step's
    const Grads own = accumulate(m, batch, sizes, [](const Tensor& t) { return double(kept(t)); });
    EXPECT_GT(max_relative_error(own, full), 1e-3) << "k = " << sizes.size();
  }
}
