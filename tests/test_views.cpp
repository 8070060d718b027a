// The views that wire attention heads (core/views.cpp): narrow, permute, split and chunk. Values
// against the index formulas, f64 gradient checks, accumulation, the q/k/v split and head merge
// of a GPT, misuse errors, and CUDA against the CPU bit for bit (skipped without a GPU). The
// public op check runs them too (tests/test_op_check.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "ops/elementwise/elementwise.h"
#include "tests/expect_error.h"
#include "tests/gradcheck.h"

using namespace mt;
using mt::test::expect_error;
using mt::test::expect_gradcheck;
using mt::test::random_leaf;

namespace {

// Element `idx` of a tensor of `shape`, from its row-major values.
double at(const std::vector<double>& v, const Shape& shape, const std::vector<int64_t>& idx) {
  int64_t flat = 0;
  for (size_t i = 0; i < shape.size(); ++i) flat = flat * shape[i] + idx[i];
  return v[size_t(flat)];
}

// Every index of `shape`, in row-major order.
template <class F>
void for_each_index(const Shape& shape, F&& f) {
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t n = numel_of(shape); n > 0; --n) {
    f(idx);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// The GPT wiring: [B, T, 3C] -> q, k, v [B, H, T, d], and [B, H, T, d] -> [B, T, C].
std::vector<Tensor> split_heads(const Tensor& qkv, int64_t H) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, d = C / H;
  std::vector<Tensor> parts = qkv.view({B, T, 3, H, d}).permute({2, 0, 3, 1, 4}).contiguous().chunk(3, 0);
  for (Tensor& p : parts) p = p.view({B, H, T, d});
  return parts;
}
Tensor merge_heads(const Tensor& y) {
  const int64_t B = y.size(0), H = y.size(1), T = y.size(2), d = y.size(3);
  return y.permute({0, 2, 1, 3}).contiguous().view({B, T, H * d});
}

}  // namespace

TEST(Views, NarrowPermuteAndSplitShareStorageAndFollowTheIndexFormulas) {
  manual_seed(1);
  const Shape shape{3, 4, 5};
  Tensor x = random_leaf(shape, -2, 2, false);
  const std::vector<double> xv = x.to_vector();

  Tensor n = x.narrow(-1, 1, 3);  // dim -1 is dim 2
  EXPECT_EQ(n.shape(), (Shape{3, 4, 3}));
  EXPECT_EQ(n.impl().storage, x.impl().storage);
  const std::vector<double> nv = n.to_vector();
  for_each_index(n.shape(), [&](const std::vector<int64_t>& i) {
    EXPECT_EQ(at(nv, n.shape(), i), at(xv, shape, {i[0], i[1], i[2] + 1}));
  });

  Tensor p = x.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{5, 3, 4}));
  EXPECT_EQ(p.impl().storage, x.impl().storage);
  const std::vector<double> pv = p.to_vector();
  for_each_index(p.shape(), [&](const std::vector<int64_t>& i) {
    EXPECT_EQ(at(pv, p.shape(), i), at(xv, shape, {i[1], i[2], i[0]}));
  });

  std::vector<Tensor> parts = x.split({1, 0, 3}, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1].shape(), (Shape{3, 0, 5}));
  const std::vector<double> p2 = parts[2].to_vector();
  for_each_index(parts[2].shape(), [&](const std::vector<int64_t>& i) {
    EXPECT_EQ(at(p2, parts[2].shape(), i), at(xv, shape, {i[0], i[1] + 1, i[2]}));
  });
  std::vector<Tensor> chunks = x.chunk(3, 0);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[2].to_vector(), x.narrow(0, 2, 1).to_vector());
}

TEST(Views, GradientCheckNarrowOnEveryDim) {
  manual_seed(2);
  for (int64_t dim : {0, 1, 2, -1})
    for (auto [start, length] : {std::pair<int64_t, int64_t>{1, 2}, {0, 3}}) {
      Tensor x = random_leaf({3, 4, 5});
      expect_gradcheck([=](auto& v) { return v[0].narrow(dim, start, length); }, {x},
                       "narrow dim " + std::to_string(dim) + " start " + std::to_string(start));
    }
}

TEST(Views, GradientCheckPermute) {
  manual_seed(3);
  for (const Shape& dims : {Shape{0, 2, 1, 3}, Shape{3, 1, 0, 2}, Shape{-1, 0, 1, 2}}) {
    Tensor x = random_leaf({2, 3, 4, 5});
    expect_gradcheck([&](auto& v) { return v[0].permute(dims); }, {x}, "permute " + shape_str(dims));
  }
  // A permute whose gradient reaches a kernel: mul reads the strided view through contiguous().
  Tensor x = random_leaf({2, 3, 4}), w = random_leaf({4, 2, 3});
  expect_gradcheck([](auto& v) { return mul(v[0].permute({2, 0, 1}), v[1]); }, {x, w},
                   "mul of a permuted x");
}

TEST(Views, GradientCheckSplitAndChunkIncludingAnUnusedPart) {
  manual_seed(4);
  Tensor x = random_leaf({2, 6, 3});
  expect_gradcheck([](auto& v) {
    std::vector<Tensor> p = v[0].chunk(3, 1);
    return add(mul(p[0], p[1]), scale(p[2], 3.0));
  }, {x}, "chunk(3, 1), every part used");
  // The middle part gets no gradient: its slice of dx must be zero, the others dy.
  expect_gradcheck([](auto& v) {
    std::vector<Tensor> p = v[0].split({2, 1, 2, 1}, 1);
    return mul(p[0], p[2]);
  }, {x}, "split({2, 1, 2, 1}, 1), two parts unused");
}

// The q/k/v split and head merge of a GPT: each element lands where the index formula says, the
// merge inverts the split's permutation, and the whole wiring passes the gradient check.
TEST(Views, QkvSplitAndHeadMergeFollowTheIndexFormulasAndPassTheGradientCheck) {
  manual_seed(5);
  const int64_t B = 2, T = 3, H = 2, d = 4, C = H * d;
  Tensor qkv = random_leaf({B, T, 3 * C});
  const std::vector<double> src = qkv.to_vector();
  std::vector<Tensor> qkv_parts = split_heads(qkv, H);
  for (int64_t which = 0; which < 3; ++which) {
    const Tensor& part = qkv_parts[size_t(which)];
    ASSERT_EQ(part.shape(), (Shape{B, H, T, d}));
    EXPECT_TRUE(part.is_contiguous());
    const std::vector<double> v = part.to_vector();
    for_each_index(part.shape(), [&](const std::vector<int64_t>& i) {
      EXPECT_EQ(at(v, part.shape(), i), at(src, qkv.shape(), {i[0], i[2], which * C + i[1] * d + i[3]}));
    });
  }
  Tensor y = random_leaf({B, H, T, d});
  Tensor merged = merge_heads(y);
  ASSERT_EQ(merged.shape(), (Shape{B, T, C}));
  const std::vector<double> yv = y.to_vector(), mv = merged.to_vector();
  for_each_index(y.shape(), [&](const std::vector<int64_t>& i) {
    EXPECT_EQ(at(mv, merged.shape(), {i[0], i[2], i[1] * d + i[3]}), at(yv, y.shape(), i));
  });
  expect_gradcheck([&](auto& v) {
    std::vector<Tensor> p = split_heads(v[0], H);
    return merge_heads(add(mul(p[0], p[1]), scale(p[2], -0.5)));
  }, {qkv}, "split heads, q*k - v/2, merge heads");
}

// The engine adds what a view's backward returns into .grad: two backward passes leave twice one.
TEST(ViewsAccumulation, BackwardTwiceIsTwiceOneBackward) {
  manual_seed(6);
  const std::vector<std::function<Tensor(const Tensor&)>> uses = {
      [](const Tensor& x) { return x.narrow(1, 1, 2); },
      [](const Tensor& x) { return x.permute({1, 2, 0}); },
      [](const Tensor& x) { return x.split({1, 3}, 1)[1]; },  // the other part unused
      [](const Tensor& x) {
        std::vector<Tensor> p = x.chunk(2, 1);
        return add(p[0], p[1]);
      },
  };
  for (size_t u = 0; u < uses.size(); ++u) {
    Tensor x = random_leaf({3, 4, 2});
    Tensor y = uses[u](x);
    Tensor up = random_leaf(y.shape(), -2, 2, false);
    y.backward(up);
    const std::vector<double> once = x.grad().to_vector();
    uses[u](x).backward(up);
    const std::vector<double> twice = x.grad().to_vector();
    double largest = 0;
    for (size_t i = 0; i < once.size(); ++i) {
      EXPECT_EQ(twice[i], 2 * once[i]) << "use " << u << " element " << i;
      largest = std::max(largest, std::abs(once[i]));
    }
    EXPECT_GT(largest, 0.0) << "use " << u;
  }
}

// split writes every element of dx once when all parts have a gradient (it starts from an
// uninitialized buffer then), and zeros the slices of parts without one: with allocations
// poisoned (NaN), none may be left.
TEST(Views, SplitBackwardWritesEveryElementAndZerosThePartsWithoutAGradient) {
  manual_seed(7);
  Tensor x = random_leaf({4, 5});
  set_poison_allocations(true);
  std::vector<Tensor> p = x.split({2, 1, 2}, 1);
  mt::backward({p[0], p[1], p[2]}, {ones({4, 2}, DType::f64), full({4, 1}, 2.0, DType::f64),
                                    full({4, 2}, 3.0, DType::f64)});
  x.zero_grad();
  p = x.split({2, 1, 2}, 1);
  mt::backward({p[1]}, {full({4, 1}, 2.0, DType::f64)});
  const std::vector<double> some = x.grad().to_vector();
  set_poison_allocations(false);
  x.zero_grad();
  p = x.split({2, 1, 2}, 1);
  mt::backward({p[0], p[1], p[2]}, {ones({4, 2}, DType::f64), full({4, 1}, 2.0, DType::f64),
                                    full({4, 2}, 3.0, DType::f64)});
  const std::vector<double> all = x.grad().to_vector();
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i], i % 5 < 2 ? 1.0 : i % 5 < 3 ? 2.0 : 3.0) << i;
    EXPECT_EQ(some[i], i % 5 == 2 ? 2.0 : 0.0) << i;
  }
}

TEST(Views, BadArgumentsAreClearErrors) {
  Tensor x = randn({2, 3, 4});
  expect_error([&] { x.narrow(3, 0, 1); }, {"narrow", "dim 3 out of range", "[2, 3, 4]"});
  expect_error([&] { x.narrow(1, 2, 2); }, {"narrow", "[2, 2 + 2) out of range for dim 1"});
  expect_error([&] { x.narrow(1, -1, 1); }, {"narrow", "out of range"});
  expect_error([&] { x.permute({0, 1}); }, {"permute", "has 2 dims", "[2, 3, 4]"});
  expect_error([&] { x.permute({0, 2, -1}); }, {"permute", "dim -1 appears twice"});
  expect_error([&] { x.permute({0, 1, 3}); }, {"permute", "dim 3 out of range"});
  expect_error([&] { x.split({1, 1}, 1); }, {"split", "add up to 2", "has 3"});
  expect_error([&] { x.split({4, -1}, 1); }, {"split", "negative size -1"});
  const int64_t huge = std::numeric_limits<int64_t>::max();  // sizes whose sum wraps around to 3
  expect_error([&] { x.split({huge, huge, 5}, 1); }, {"split", "add up to more than dim 1"});
  expect_error([&] { x.chunk(3, 2); }, {"chunk", "3 chunks do not divide dim 2", "[2, 3, 4]"});
}

#ifdef MT_WITH_CUDA
// On the GPU the views' copies are the strided gather (contiguous) and scatter (copy_ into a
// view): every dtype moves the same bits as on the CPU, forward and backward.
TEST(CudaViews, ForwardAndBackwardEqualTheCpuBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  manual_seed(8);
  const int64_t H = 3;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor qkv_values = randn({2, 5, 3 * 12}, dt), up_values = randn({2, 3, 12}, dt);
    std::vector<double> grads[2], outs[2];
    for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
      const Device where = on_gpu ? cuda_device(0) : kCPU;
      Tensor qkv = qkv_values.to(where).detach().set_requires_grad();  // a leaf of its own
      std::vector<Tensor> p = split_heads(qkv, H);
      // k gets no gradient (its slice of dx stays zero); q goes through a permute round trip,
      // and only rows 1..3 of T reach the output (narrow's zero-filled backward).
      Tensor q = p[0].permute({0, 1, 3, 2}).contiguous().permute({0, 1, 3, 2});
      Tensor y = merge_heads(add(q, p[2]).narrow(2, 1, 3));
      y.backward(up_values.to(where));
      outs[on_gpu] = y.to_vector();
      grads[on_gpu] = qkv.grad().to_vector();
    }
    EXPECT_EQ(outs[1], outs[0]) << dtype_name(dt);
    EXPECT_EQ(grads[1], grads[0]) << dtype_name(dt);
  }
}

TEST(CudaViews, CopyIntoAStridedDestinationWritesOnlyItsElements) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  manual_seed(9);
  for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::i64}) {
    const Tensor base = randn({4, 6, 5}).to(dt);
    const Tensor a = randn({4, 3, 5}).to(dt), b = randn({5, 4, 6}).to(dt);
    Tensor cpu = base.clone(), gpu = base.to(cuda_device(0));
    cpu.narrow(1, 2, 3).copy_(a);
    gpu.narrow(1, 2, 3).copy_(a.to(cuda_device(0)));
    EXPECT_EQ(gpu.to_vector(), cpu.to_vector()) << dtype_name(dt) << " narrow";
    cpu.permute({2, 0, 1}).copy_(b);
    gpu.permute({2, 0, 1}).copy_(b.to(cuda_device(0)));
    EXPECT_EQ(gpu.to_vector(), cpu.to_vector()) << dtype_name(dt) << " permute";
  }
}
#endif
