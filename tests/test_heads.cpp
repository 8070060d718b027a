// split_heads and merge_heads: each equals the view → permute → contiguous chain it replaces,
// they invert each other, and both pass the op check (gradients, accumulation, microbatches,
// strides, sizes, bad inputs; on a GPU, CUDA against the CPU per dtype, 16-byte packs and single
// elements both).
#include <gtest/gtest.h>

#include "check/op_check.h"
#include "check/op_check_gtest.h"
#include "core/autograd.h"
#include "ops/elementwise/elementwise.h"
#include "ops/heads/heads.h"
#include "tests/expect_error.h"

using namespace mt;
using mt::test::expect_error;

TEST(Heads, SplitAndMergeEqualThePermutationsTheyReplace) {
  manual_seed(3);
  const int64_t B = 2, T = 5, H = 3, d = 4, C = H * d;
  const Tensor qkv = randn({B, T, 3 * C}, DType::f64);
  const std::vector<Tensor> parts = split_heads(qkv, H);
  ASSERT_EQ(parts.size(), 3u);
  const Tensor all = qkv.view({B, T, 3, H, d}).permute({2, 0, 3, 1, 4}).contiguous();
  for (int64_t p = 0; p < 3; ++p) {
    EXPECT_EQ(parts[size_t(p)].shape(), (Shape{B, H, T, d}));
    EXPECT_EQ(parts[size_t(p)].to_vector(), all.slice_rows(p, p + 1).to_vector()) << "part " << p;
  }
  const Tensor y = randn({B, H, T, d}, DType::f64);
  const Tensor merged = merge_heads(y);
  EXPECT_EQ(merged.shape(), (Shape{B, T, C}));
  EXPECT_EQ(merged.to_vector(), y.transpose(1, 2).contiguous().view({B, T, C}).to_vector());
  // merge_heads undoes a split part: the part's columns of qkv come back.
  EXPECT_EQ(merge_heads(parts[1]).to_vector(), qkv.narrow(2, C, C).contiguous().to_vector());
}

TEST(Heads, APartWithoutGradientGivesZerosInItsColumns) {
  manual_seed(4);
  const int64_t B = 2, T = 3, H = 2, d = 2, C = H * d;
  Tensor qkv = randn({B, T, 3 * C}, DType::f64).set_requires_grad(true);
  std::vector<Tensor> parts = split_heads(qkv, H);
  sum(mul(parts[0], parts[2])).backward();  // k unused
  const Tensor g = qkv.grad();
  EXPECT_EQ(g.narrow(2, C, C).contiguous().to_vector(), std::vector<double>(size_t(B * T * C), 0.0));
  EXPECT_EQ(merge_heads(parts[2].detach()).to_vector(), g.narrow(2, 0, C).contiguous().to_vector());
}

namespace {

using mt::check::Cast;

mt::check::OpSpec split_spec(int64_t d) {
  mt::check::OpSpec s;
  s.name = "split_heads";
  s.inputs = {{"qkv", Cast::Compute, true, /*batched=*/true}};
  s.op = [](const std::vector<Tensor>& in) { return split_heads(in[0], 2); };
  s.make = [d](Generator& g, int64_t n) {
    return std::vector<Tensor>{mt::check::normal(g, {n, 3, 3 * 2 * d})};
  };
  s.row_separable = true;
  s.bad_inputs = {{"a 2-D qkv", [] { split_heads(randn({4, 24}), 2); }},
                  {"3*C not divisible by 3*n_head", [] { split_heads(randn({1, 2, 20}), 3); }},
                  {"integer qkv", [] { split_heads(ones({1, 2, 6}, DType::i64), 1); }},
                  {"n_head 0", [] { split_heads(randn({1, 2, 6}), 0); }}};
  return s;
}

mt::check::OpSpec merge_spec(int64_t d) {
  mt::check::OpSpec s;
  s.name = "merge_heads";
  s.inputs = {{"y", Cast::Compute, true, /*batched=*/true}};
  s.op = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{merge_heads(in[0])}; };
  s.make = [d](Generator& g, int64_t n) {
    return std::vector<Tensor>{mt::check::normal(g, {n, 2, 3, d})};
  };
  s.row_separable = true;
  s.bad_inputs = {{"a 3-D y", [] { merge_heads(randn({2, 3, 4})); }},
                  {"integer y", [] { merge_heads(ones({1, 2, 3, 4}, DType::i64)); }}};
  return s;
}

}  // namespace

// d = 8: a row of 8 f32, bf16 or f16 is a whole number of 16-byte packs; d = 3 is not (one
// element per thread on a GPU).
TEST(HeadsOpCheck, SplitHeadsPassesTheOpCheck) {
  for (int64_t d : {8, 3}) MT_EXPECT_OP_CHECK(split_spec(d));
}

TEST(HeadsOpCheck, MergeHeadsPassesTheOpCheck) {
  for (int64_t d : {8, 3}) MT_EXPECT_OP_CHECK(merge_spec(d));
}

TEST(Heads, BadInputsNameTheOpAndTheShape) {
  expect_error([] { split_heads(randn({1, 2, 20}), 3); }, {"split_heads", "20", "n_head = 3"});
  expect_error([] { merge_heads(randn({2, 3, 4})); }, {"merge_heads", "[2, 3, 4]"});
}
