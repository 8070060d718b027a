// dropout on the CPU: the mask is a pure function of (seed, offset, position) with the right
// keep rate, the backward applies the forward's mask (gradient check), the += contract, the
// identity cases; on a GPU, the CUDA masks equal the CPU's bit for bit.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "ops/dropout/dropout.h"
#include "ops/dropout/philox.h"
#include "ops/elementwise/elementwise.h"
#include "tests/expect_error.h"
#include "tests/gradcheck.h"
#include "tests/poison_scope.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/graph.h"
#endif

using namespace mt;
using mt::test::expect_error;
using mt::test::expect_gradcheck;
using mt::test::PoisonScope;
using mt::test::random_leaf;

#define MT_REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped"

// Philox4x32-10's known-answer vectors (Random123's kat_vectors): the generator is the published
// one, not a look-alike.
TEST(Philox, KnownAnswers) {
  using philox::U32x4;
  const U32x4 zero = philox::philox4x32_10(U32x4{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);
  const U32x4 ones = philox::philox4x32_10(
      U32x4{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[1], 0x41c83b0eu);
  EXPECT_EQ(ones.v[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);
}

namespace {
// The mask as 0 / 1 / (1 - p) scale: dropout of ones, f32.
std::vector<double> mask_of(int64_t n, double p, uint64_t seed, uint64_t offset,
                            Device dev = kCPU) {
  return dropout(ones({n}, DType::f32, dev), p, seed, offset).to_vector();
}
}  // namespace

TEST(Dropout, MaskIsAPureFunctionOfSeedOffsetAndPositionWithTheKeepRate) {
  const int64_t n = 200003;
  const double p = 0.1;
  const auto a = mask_of(n, p, 42, 7);
  EXPECT_EQ(a, mask_of(n, p, 42, 7));          // the same call again: the same mask
  EXPECT_NE(a, mask_of(n, p, 42, 8));          // another offset: another mask
  EXPECT_NE(a, mask_of(n, p, 43, 7));          // another seed: another mask
  const auto prefix = mask_of(1001, p, 42, 7);  // a position's bit does not depend on n
  for (size_t i = 0; i < prefix.size(); ++i) ASSERT_EQ(prefix[i], a[i]) << i;
  int64_t kept = 0;
  const double s = double(float(1 / (1 - p)));
  for (double v : a) {
    ASSERT_TRUE(v == 0 || v == s) << v;
    kept += v != 0;
  }
  // Binomial(n, 0.9): the standard deviation is about 134 elements; 6 of them is a wide margin.
  EXPECT_NEAR(double(kept), 0.9 * double(n), 6 * std::sqrt(n * p * (1 - p)));
}

// The mask's convention, spelled out (dropout.h): element i keeps when half i % 8 of draw i / 8
// is at least round(p · 2^16). The halves go low, high through the words in order.
TEST(Dropout, ElementIKeepsWhenItsSixteenBitHalfClearsTheThreshold) {
  const philox::U32x4 zero = philox::philox4x32_10(philox::U32x4{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(philox::half16(zero, 0), 0xe8d5u);  // word 0 is 0x6627e8d5
  EXPECT_EQ(philox::half16(zero, 1), 0x6627u);
  EXPECT_EQ(philox::half16(zero, 6), 0xdbd8u);  // word 3 is 0x9b00dbd8
  EXPECT_EQ(philox::half16(zero, 7), 0x9b00u);
  EXPECT_EQ(dropout_threshold(0.1), 6554u);
  EXPECT_EQ(dropout_threshold(0.0), 0u);
  const int64_t n = 37;  // four whole draws and five elements of a fifth
  const double p = 0.3;
  const auto mask = mask_of(n, p, 11, 5);
  const double s = double(float(1 / (1 - p)));
  int dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t half = philox::half16(philox::draw(11, 5, uint64_t(i / 8)), int(i % 8));
    EXPECT_EQ(mask[size_t(i)], half >= dropout_threshold(p) ? s : 0.0) << i;
    dropped += mask[size_t(i)] == 0;
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, n);
}

TEST(Dropout, GradientCheckAndTheBackwardUsesTheForwardsMask) {
  manual_seed(1);
  Tensor x = random_leaf({4, 25});
  expect_gradcheck([](auto& in) { return dropout(in[0], 0.3, 9, 2); }, {x}, "dropout");
  // dx = dy where kept, scaled; 0 where dropped: the same positions as the forward's zeros.
  x.zero_grad();
  Tensor y = dropout(x, 0.3, 9, 2);
  y.backward(ones({4, 25}, DType::f64));
  const auto yv = y.to_vector(), xv = x.to_vector(), gv = x.grad().to_vector();
  int dropped = 0;
  for (size_t i = 0; i < yv.size(); ++i) {
    EXPECT_EQ(yv[i] == 0, gv[i] == 0) << i;
    if (yv[i] != 0) EXPECT_DOUBLE_EQ(yv[i], xv[i] * gv[i]) << i;
    dropped += gv[i] == 0;
  }
  EXPECT_GT(dropped, 10);  // p = 0.3 of 100 elements: the check above saw both kinds
}

TEST(DropoutAccumulation, BackwardTwiceIsTwiceOneBackward) {
  manual_seed(2);
  Tensor x = random_leaf({3, 11});
  Tensor seed = rand({3, 11}, DType::f64);
  dropout(x, 0.5, 1, 1).backward(seed);
  const auto g1 = x.grad().to_vector();
  dropout(x, 0.5, 1, 1).backward(seed);
  const auto g2 = x.grad().to_vector();
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_EQ(g2[i], 2 * g1[i]);
}

TEST(Dropout, ZeroPAndEvalAreTheIdentity) {
  Tensor x = random_leaf({3, 5});
  EXPECT_TRUE(dropout(x, 0.0, 1, 1).is_same(x));
  EXPECT_TRUE(dropout(x, 0.5, 1, 1, /*training=*/false).is_same(x));
  EXPECT_FALSE(dropout(x, 0.5, 1, 1).is_same(x));
}

TEST(Dropout, BadArgumentsAreClearErrors) {
  expect_error([] { dropout(ones({3}), 1.0, 1, 1); }, {"dropout", "p", "[0, 1)", "1"});
  expect_error([] { dropout(ones({3}), -0.1, 1, 1); }, {"dropout", "p", "-0.1"});
  expect_error([] { dropout(ones({3}, DType::i64), 0.1, 1, 1); }, {"dropout", "i64"});
}

// The offset base (dropout.h): the call's offset plus the word's value, read when the kernels
// run, forward and backward; advance_dropout_base sets it when run eagerly (the CPU always is).
TEST(Dropout, AnOffsetBaseAddsItsWordToTheOffset) {
  const int64_t n = 1003;
  Tensor base = zeros({1}, DType::i64);
  advance_dropout_base(base, 40, /*stride=*/1000);
  EXPECT_EQ(base.to_vector(), std::vector<double>{40});  // eagerly: set, the stride unused
  Tensor x = ones({n}, DType::f32);
  EXPECT_EQ(dropout(x, 0.3, 5, 2, true, base).to_vector(), mask_of(n, 0.3, 5, 42));
  EXPECT_NE(dropout(x, 0.3, 5, 2, true, base).to_vector(), mask_of(n, 0.3, 5, 2));
  // The backward reads the word again: the forward's mask while the word is unchanged.
  manual_seed(3);
  Tensor leaf = random_leaf({n});
  Tensor y = dropout(leaf, 0.3, 5, 2, true, base);
  y.backward(ones({n}, DType::f64));
  const auto gv = leaf.grad().to_vector(), m = mask_of(n, 0.3, 5, 42);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(gv[size_t(i)] != 0, m[size_t(i)] != 0) << i;
  expect_gradcheck([&](auto& in) { return dropout(in[0], 0.3, 5, 2, true, base); },
                   {random_leaf({3, 7})}, "dropout with a base");
  // Moved between the forward and the backward, the word would give the backward another mask:
  // the "modified in place" error (it used to go unchecked).
  Tensor again = dropout(leaf, 0.3, 5, 2, true, base);
  advance_dropout_base(base, 41, 1000);
  expect_error([&] { again.backward(ones({n}, DType::f64)); }, {"dropout", "modified in place"});
  expect_error([&] { dropout(x, 0.3, 5, 2, true, zeros({2}, DType::i64)); },
               {"dropout", "offset base", "one i64 element", "[2]"});
  expect_error([&] { dropout(x, 0.3, 5, 2, true, zeros({1}, DType::f32)); },
               {"dropout", "offset base", "f32"});
  expect_error([&] { advance_dropout_base(zeros({1}, DType::f64), 1, 1); },
               {"advance_dropout_base", "offset base", "f64"});
}

// Allocations poisoned: an element the kernels never wrote is NaN, never equal to the CPU's.
TEST(CudaDropout, MasksEqualTheCpusBitForBit) {
  MT_REQUIRE_CUDA();
  const PoisonScope poison;
  // An odd n (the scalar tail), and a buffer one element off alignment (the one-at-a-time path).
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(100003)})
    for (double p : {0.1, 0.5, 0.9}) {
      EXPECT_EQ(mask_of(n, p, 1234, 99, cuda_device(0)), mask_of(n, p, 1234, 99))
          << "n " << n << " p " << p;
    }
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    manual_seed(5);
    Tensor x = randn({1, 4099}).to(dt);
    Tensor xg = x.to(cuda_device(0));
    Tensor misaligned = xg.view({4099}).slice_rows(1, 4099);
    Tensor xc = x.view({4099}).slice_rows(1, 4099);
    EXPECT_EQ(dropout(xg, 0.2, 7, 3).to_vector(), dropout(x, 0.2, 7, 3).to_vector())
        << dtype_name(dt);
    EXPECT_EQ(dropout(misaligned, 0.2, 7, 3).to_vector(), dropout(xc, 0.2, 7, 3).to_vector())
        << dtype_name(dt) << " misaligned";
    // The backward regenerates the same mask on the GPU.
    Tensor leaf = xg.detach();
    leaf.set_requires_grad();
    Tensor up = randn({1, 4099}).to(dt);
    dropout(leaf, 0.2, 7, 3).backward(up.to(cuda_device(0)));
    Tensor cleaf = x.detach();
    cleaf.set_requires_grad();
    dropout(cleaf, 0.2, 7, 3).backward(up);
    EXPECT_EQ(leaf.grad().to_vector(), cleaf.grad().to_vector()) << dtype_name(dt);
  }
}

#ifdef MT_WITH_CUDA
// A captured dropout replays with the word the device holds at that moment: advance_dropout_base
// records `base += stride` in the graph, so two replays draw two different masks, each the mask
// an eager call of that step draws (on the GPU and on the CPU), and the backward recorded beside
// the forward applies that replay's mask.
TEST(CudaDropout, EachGraphReplayDrawsTheNextStepsMaskAsEagerDoes) {
  MT_REQUIRE_CUDA();
  const Device dev = cuda_device(0);
  const int64_t n = 4099;  // 512 packs of 8 and a tail of 3
  const uint64_t stride = 1000;
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor base = zeros({1}, DType::i64, dev);
    Tensor x = ones({n}, dt, dev).detach();
    x.set_requires_grad();
    const Tensor out = empty({n}, dt, dev);  // outlive the replays: made before the capture
    out.fill_(-1.0);
    advance_dropout_base(base, 4 * stride, stride);  // eagerly: step 4's word
    // An eager step first: the .grad the captured backward adds into exists before the capture.
    dropout(x, 0.2, 9, 3, true, base).backward(ones({n}, dt, dev));
    cuda::Graph g = cuda::Graph::capture(0, [&] {
      advance_dropout_base(base, 0, stride);  // captured: += stride (the 0 is never used)
      Tensor y = dropout(x, 0.2, 9, 3, true, base);
      out.copy_(y);
      y.backward(ones({n}, dt, dev));
    });
    std::vector<std::vector<double>> masks;
    for (int step = 5; step <= 6; ++step) {
      x.grad().fill_(0.0);
      g.replay();
      const auto replayed = out.to_vector();
      EXPECT_EQ(base.to_vector(), std::vector<double>{double(step * stride)});
      // The eager call of this step, on the GPU and on the CPU (host offset, no base).
      Tensor eager_base = zeros({1}, DType::i64, dev);
      advance_dropout_base(eager_base, step * stride, stride);
      EXPECT_EQ(replayed, dropout(ones({n}, dt, dev), 0.2, 9, 3, true, eager_base).to_vector());
      EXPECT_EQ(replayed, dropout(ones({n}, dt), 0.2, 9, 3 + step * stride).to_vector());
      EXPECT_EQ(x.grad().to_vector(), replayed);  // dx = dy · mask · s with dy = 1: y itself
      masks.push_back(replayed);
    }
    EXPECT_NE(masks[0], masks[1]);
  }
}
#endif
