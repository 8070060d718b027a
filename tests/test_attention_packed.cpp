// attention_packed: the same numbers, bit for bit, as split_heads → attention → merge_heads (the
// output and qkv's gradient, with and without dropout) on the CPU and, on a GPU, for every kernel
// family (tensor cores at d = 32, 64, 128; the CUDA-core path; the atomic dQ variant within
// tolerance, since its sums arrive in any order); an f64 gradient check; backward twice = twice;
// the op check; bad inputs. The kernels are attention's, checked against the formulas in
// tests/test_attention.cpp: what is new here is where they read and write (each head's rows in
// place in [B, T, 3·C] and [B, T, C]), so a wrong stride or offset shows as different numbers or
// as an element left unwritten (every new buffer is poisoned with NaN in the GPU runs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "check/op_check.h"
#include "check/op_check_gtest.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "core/switches.h"
#include "ops/attention/attention.h"
#include "ops/heads/heads.h"
#include "tests/deterministic_guard.h"
#include "tests/expect_error.h"
#include "tests/gradcheck.h"
#include "tests/poison_scope.h"

using namespace mt;
using mt::test::DeterministicGuard;
using mt::test::expect_error;
using mt::test::expect_gradcheck;
using mt::test::PoisonScope;
using mt::test::random_leaf;

namespace {

struct Pass {
  std::vector<double> y, grad;
};

// y and qkv's .grad for upstream gradient g, through attention_packed or through the chain of
// three ops it replaces.
Pass run(bool packed, const Tensor& qkv_values, const Tensor& g, int64_t H,
        const AttentionDropout& dropout) {
  Tensor qkv = qkv_values.detach();
  qkv.set_requires_grad();
  Tensor y;
  if (packed) {
    y = attention_packed(qkv, H, dropout);
  } else {
    const std::vector<Tensor> p = split_heads(qkv, H);
    y = merge_heads(attention(p[0], p[1], p[2], dropout));
  }
  y.backward(g);
  return {y.to(kCPU).to_vector(), qkv.grad().to(kCPU).to_vector()};
}

// Compares the two routes at [B, T, 3·H·d] in dtype dt on dev, with and without dropout.
void expect_same_bits(int64_t B, int64_t T, int64_t H, int64_t d, DType dt, Device dev) {
  const std::string what = std::string(dtype_name(dt)) + " B=" + std::to_string(B) + " T=" +
                           std::to_string(T) + " H=" + std::to_string(H) + " d=" + std::to_string(d);
  const Tensor qkv = randn({B, T, 3 * H * d}, DType::f64).to(dt).to(dev);
  const Tensor g = randn({B, T, H * d}, DType::f64).to(dt).to(dev);
  for (double p : {0.0, 0.3}) {
    const AttentionDropout drop{.p = p, .seed = 77, .offset = 5};
    const Pass a = run(true, qkv, g, H, drop), b = run(false, qkv, g, H, drop);
    ASSERT_EQ(a.y.size(), size_t(B * T * H * d));
    EXPECT_EQ(a.y, b.y) << what << " p=" << p << ": y";
    EXPECT_EQ(a.grad, b.grad) << what << " p=" << p << ": dqkv";
    bool finite = true;
    for (double x : a.grad) finite = finite && std::isfinite(x);
    EXPECT_TRUE(finite) << what << ": an element of dqkv was never written";
  }
}

}  // namespace

TEST(AttentionPacked, EqualsSplitAttentionMergeBitForBit) {
  manual_seed(40);
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    expect_same_bits(2, 7, 3, 4, dt, kCPU);
    expect_same_bits(1, 1, 2, 8, dt, kCPU);
  }
  expect_same_bits(2, 33, 2, 16, DType::f32, kCPU);
}

TEST(AttentionPacked, GradientCheck) {
  manual_seed(41);
  for (Shape shape : {Shape{1, 1, 3}, Shape{2, 5, 2 * 3 * 3}, Shape{1, 6, 3 * 4}}) {
    const int64_t H = shape[2] == 3 ? 1 : 2;
    Tensor qkv = random_leaf(shape);
    expect_gradcheck([H](auto& in) { return attention_packed(in[0], H); }, {qkv},
                     "attention_packed " + shape_str(shape));
    expect_gradcheck(
        [H](auto& in) { return attention_packed(in[0], H, {.p = 0.25, .seed = 3, .offset = 8}); },
        {qkv}, "attention_packed with dropout " + shape_str(shape));
  }
}

TEST(AttentionPackedAccumulation, BackwardTwiceIsTwiceOneBackward) {
  manual_seed(42);
  Tensor qkv = random_leaf({2, 9, 3 * 2 * 4});
  Tensor seed = rand({2, 9, 2 * 4}, DType::f64);
  attention_packed(qkv, 2).backward(seed);
  const auto once = qkv.grad().to_vector();
  attention_packed(qkv, 2).backward(seed);
  const auto twice = qkv.grad().to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_EQ(twice[i], 2 * once[i]) << i;
}

TEST(AttentionPacked, MisuseIsAnError) {
  expect_error([] { attention_packed(randn({4, 24}), 2); },
               {"attention_packed", "[B, T, 3*C]", "[4, 24]"});
  expect_error([] { attention_packed(randn({1, 4, 20}), 2); },
               {"attention_packed", "20", "3 * n_head * d", "n_head = 2"});
  expect_error([] { attention_packed(randn({1, 4, 12}), 0); }, {"attention_packed", "n_head = 0"});
  expect_error([] { attention_packed(randn({1, 4, 12}), 2, {.p = 1.0}); },
               {"attention_packed", "dropout p", "[0, 1)"});
  expect_error([] { attention_packed(randn({1, 4, 12}), 2, {.p = 0.5, .base = randn({1})}); },
               {"attention_packed", "offset base", "one i64 element"});
}

namespace {

mt::check::OpSpec packed_spec(int64_t d) {
  using mt::check::Cast;
  mt::check::OpSpec s;
  s.name = "attention_packed";
  s.inputs = {{"qkv", Cast::Compute, true, false}};
  s.op = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{attention_packed(in[0], 2)};
  };
  // n is T (the softmax couples a head's rows: not row-separable); B = 2, two heads of d.
  s.make = [d](Generator& g, int64_t n) {
    return std::vector<Tensor>{mt::check::normal(g, {2, n, 3 * 2 * d})};
  };
  s.sizes = {1, 7, 64, 257};
  s.gradcheck_size = 5;
  s.tolerance = {{DType::f32, {1e-5, 5e-5}}, {DType::bf16, {8e-3, 1.6e-2}},
                 {DType::f16, {1e-3, 2.5e-3}}};  // attention's (tests/test_attention.cpp)
  s.bad_inputs = {{"a 2-D qkv", [] { attention_packed(randn({4, 24}), 2); }},
                  {"3C not divisible by 3 heads", [] { attention_packed(randn({1, 4, 20}), 3); }}};
  return s;
}

// Cut along the batch instead (n = B, T = 5): sequences are independent, so the microbatch check
// applies. On the CPU: the kernels are packed_spec's, whose CUDA lines cover them.
mt::check::OpSpec packed_batch_spec(int64_t d) {
  mt::check::OpSpec s = packed_spec(d);
  s.name = "attention_packed, microbatches of sequences";
  s.inputs[0].batched = true;
  s.row_separable = true;
  s.make = [d](Generator& g, int64_t n) {
    return std::vector<Tensor>{mt::check::normal(g, {n, 5, 3 * 2 * d})};
  };
  s.sizes = {1, 7, 33};
  s.gradcheck_size = 2;
  return s;
}

}  // namespace

TEST(AttentionPackedOpCheck, PassesTheOpCheck) {
  for (int64_t d : {16, 64}) MT_EXPECT_OP_CHECK(packed_spec(d));
}

TEST(AttentionPackedOpCheck, MicrobatchesOfSequencesAddUpToTheBatch) {
  mt::check::Options cpu_only;
  cpu_only.cuda = false;
  MT_EXPECT_OP_CHECK(packed_batch_spec(16), cpu_only);
}

// ---- CUDA ---------------------------------------------------------------------------------

#define MT_REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped"

TEST(AttentionPackedCuda, EqualsSplitAttentionMergeBitForBitInEveryKernelFamily) {
  MT_REQUIRE_CUDA();
  manual_seed(43);
  const DeterministicGuard det(true);
  const Device gpu = cuda_device(0);
  const PoisonScope poison;  // NaN in every new buffer: an element never written shows
  for (int64_t d : {32, 64, 128}) expect_same_bits(2, 257, 3, d, DType::bf16, gpu);  // tensor cores
  expect_same_bits(2, 1024, 12, 64, DType::bf16, gpu);  // GPT-2's heads, 16 Q tiles
  expect_same_bits(1, 65, 2, 64, DType::f16, gpu);
  expect_same_bits(2, 65, 3, 64, DType::f32, gpu);   // the CUDA-core path
  expect_same_bits(1, 33, 2, 48, DType::bf16, gpu);  // d off the tensor cores
}

// The atomic dQ variant adds into an fp32 scratch and rounds it into dq's place in dqkv last:
// within attention's bf16 tolerance of the deterministic run, every element written.
TEST(AttentionPackedCuda, TheAtomicVariantWritesDqIntoTheProjectionsLayout) {
  MT_REQUIRE_CUDA();
  manual_seed(44);
  const Device gpu = cuda_device(0);
  const int64_t B = 2, T = 257, H = 3, d = 64, C = H * d;
  const Tensor qkv = randn({B, T, 3 * C}, DType::f64).to(DType::bf16).to(gpu);
  const Tensor g = randn({B, T, C}, DType::f64).to(DType::bf16).to(gpu);
  Pass exact, atomic;
  {
    const DeterministicGuard det(true);
    exact = run(true, qkv, g, H, {});
  }
  {
    const DeterministicGuard det(false);
    const PoisonScope poison;
    atomic = run(true, qkv, g, H, {});
  }
  double err = 0, scale = 0;
  for (size_t i = 0; i < exact.grad.size(); ++i) {
    err = std::max(err, std::isfinite(atomic.grad[i]) ? std::abs(atomic.grad[i] - exact.grad[i])
                                                      : INFINITY);
    scale = std::max(scale, std::abs(exact.grad[i]));
  }
  std::printf("attention_packed atomic dq vs deterministic: %.2e\n", err / scale);
  EXPECT_LE(err / scale, 1.6e-2);
  EXPECT_EQ(atomic.y, exact.y);
}
