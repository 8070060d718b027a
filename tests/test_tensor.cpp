// Tensor basics: creation, views, contiguous copies, dtype round trips, versions, misuse errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/arena.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "data/array_source.h"
#include "data/data.h"
#include "tests/expect_error.h"

using namespace mt;
using mt::test::expect_error;


TEST(Tensor, FactoriesShapesAndValues) {
  Tensor z = zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.strides(), (Shape{3, 1}));
  EXPECT_EQ(z.numel(), 6);
  for (double v : z.to_vector()) EXPECT_EQ(v, 0.0);
  for (double v : ones({4}, DType::bf16).to_vector()) EXPECT_EQ(v, 1.0);
  EXPECT_EQ(full({2}, 2.5, DType::f16).to_vector(), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(arange(4, DType::i64).to_vector(), (std::vector<double>{0, 1, 2, 3}));
  Tensor v = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64);
  EXPECT_EQ(v.to_vector(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(empty({0, 5}).numel(), 0);
}

TEST(Tensor, RandomFactoriesAreSeededAndInRange) {
  manual_seed(42);
  std::vector<double> a = rand({1000}).to_vector();
  manual_seed(42);
  std::vector<double> b = rand({1000}).to_vector();
  EXPECT_EQ(a, b);
  double mn = 1, mx = 0;
  for (double x : a) mn = std::min(mn, x), mx = std::max(mx, x);
  EXPECT_GE(mn, 0.0);
  EXPECT_LT(mx, 1.0);
  EXPECT_LT(mn, 0.01);
  EXPECT_GT(mx, 0.99);
  manual_seed(7);
  std::vector<double> n = randn({20000}, DType::f64).to_vector();
  double mean = 0, var = 0;
  for (double x : n) mean += x;
  mean /= double(n.size());
  for (double x : n) var += (x - mean) * (x - mean);
  var /= double(n.size());
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(var, 1.0, 0.05);
}

TEST(Tensor, TransposeIsAStridedViewAndContiguousCopies) {
  Tensor a = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor t = a.t();
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 3}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.data_ptr(), a.data_ptr());  // a view: same memory
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.data_ptr(), a.data_ptr());
  EXPECT_EQ(c.to_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(t.to_vector(), c.to_vector());
  // Writing through a view is seen by the base.
  a.t().slice_rows(1, 2).fill_(9);  // column 1 of a
  EXPECT_EQ(a.to_vector(), (std::vector<double>{1, 9, 3, 4, 9, 6}));
}

TEST(Tensor, ViewReshapeAndSlice) {
  Tensor a = arange(12).view({3, 4});
  EXPECT_EQ(a.view({-1}).shape(), (Shape{12}));
  EXPECT_EQ(a.view({2, -1}).shape(), (Shape{2, 6}));
  Tensor r = a.t().reshape({12});  // needs a copy
  EXPECT_EQ(r.to_vector()[1], 4.0);
  Tensor s = a.slice_rows(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 4}));
  EXPECT_EQ(s.to_vector()[0], 4.0);
  EXPECT_TRUE(s.is_contiguous());
}

TEST(Tensor, CloneCopyAndItem) {
  Tensor a = from_vector(std::vector<double>{1.5, -2}, {2});
  Tensor b = a.clone();
  b.fill_(0);
  EXPECT_EQ(a.to_vector(), (std::vector<double>{1.5, -2}));
  Tensor c = zeros({2}, DType::f64);
  c.copy_(a);
  EXPECT_EQ(c.to_vector(), (std::vector<double>{1.5, -2}));
  EXPECT_EQ(full({1, 1}, 3.25).item(), 3.25);
  // From a view of its own storage: read whole before anything is written (it gave 1 3 3 4).
  Tensor m = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2});
  m.copy_(m.t());
  EXPECT_EQ(m.to_vector(), (std::vector<double>{1, 3, 2, 4}));
  Tensor row = from_vector(std::vector<double>{1, 2, 3, 4, 5}, {5});
  row.slice_rows(1, 5).copy_(row.slice_rows(0, 4));  // overlapping, contiguous: was memcpy's UB
  EXPECT_EQ(row.to_vector(), (std::vector<double>{1, 1, 2, 3, 4}));
}

// A real value into an integer dtype: toward zero, clamped to the type's range, NaN to 0 (the GPU's
// conversion; a plain C++ cast would be undefined past the range). The i64 values are read as
// integers: a double cannot hold INT64_MAX. The edges: 2^63 (the first double past INT64_MAX)
// and the double below it, -2^63 (INT64_MIN itself), and i32's limits and just past them. (The
// GPU's and AArch64's conversions saturate by themselves, so there only the CPU test on x86
// fails without saturate_to.)
namespace {
std::vector<double> saturation_inputs() {
  const double inf = std::numeric_limits<double>::infinity();
  return {std::nan(""), inf, -inf, 3e9, -3e9, 2.7, -2.7, 1e19, -1e19, 2147483647.5,
          0x1p63, std::nextafter(0x1p63, 0.0), -0x1p63, -2147483648.5, -2147483649.0, -0.0};
}
template <class I>
std::vector<I> integers_of(const Tensor& t) {
  const Tensor c = t.to(kCPU);
  return std::vector<I>(c.data<I>(), c.data<I>() + c.numel());
}
void expect_saturated(const Tensor& i32, const Tensor& i64) {
  using L32 = std::numeric_limits<int32_t>;
  using L64 = std::numeric_limits<int64_t>;
  constexpr int32_t lo32 = L32::min(), hi32 = L32::max();
  constexpr int64_t lo64 = L64::min(), hi64 = L64::max();
  EXPECT_EQ(integers_of<int32_t>(i32),
            (std::vector<int32_t>{0, hi32, lo32, hi32, lo32, 2, -2, hi32, lo32, hi32, hi32, hi32,
                                  lo32, lo32, lo32, 0}));
  EXPECT_EQ(integers_of<int64_t>(i64),
            (std::vector<int64_t>{0, hi64, lo64, 3000000000, -3000000000, 2, -2, hi64, lo64,
                                  2147483647, hi64, hi64 - 1023, lo64, -2147483648, -2147483649,
                                  0}));
}
}  // namespace

TEST(Tensor, RealToIntegerSaturatesAndTakesNaNToZero) {
  const Tensor x = from_vector(saturation_inputs(), {16}, DType::f64);
  expect_saturated(x.to(DType::i32), x.to(DType::i64));
  const Tensor nan_fill = full({3}, 1.0, DType::i32);
  nan_fill.fill_(std::nan(""));
  EXPECT_EQ(integers_of<int32_t>(nan_fill), (std::vector<int32_t>{0, 0, 0}));
}

#ifdef MT_WITH_CUDA
TEST(CudaTensor, RealToIntegerSaturatesAsOnTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  const Tensor x = from_vector(saturation_inputs(), {16}, DType::f64, cuda_device(0));
  expect_saturated(x.to(DType::i32), x.to(DType::i64));
  const Tensor nan_fill = full({3}, 1.0, DType::i64, cuda_device(0));
  nan_fill.fill_(std::nan(""));
  EXPECT_EQ(integers_of<int64_t>(nan_fill), (std::vector<int64_t>{0, 0, 0}));
}
#endif

TEST(Tensor, VersionCounterIsSharedByViewsAndBumpedByInPlaceWrites) {
  Tensor a = zeros({4});
  Tensor v = a.view({2, 2});
  uint64_t v0 = a.version();
  v.fill_(1);
  EXPECT_EQ(a.version(), v0 + 1);
  a.copy_(ones({4}));
  EXPECT_EQ(v.version(), v0 + 2);
  Tensor b = a.clone();
  EXPECT_EQ(b.version(), 0u);
}

TEST(DType, Bf16KnownBitPatternsAndRounding) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f).bits, 0xc000);
  // 1 + 2^-8 lies exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f).bits, 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f).bits, 0x3f82);
  // Just above the tie rounds up.
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808001u)).bits, 0x3f81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  // A NaN whose payload lives only in the low bits must stay NaN, not become inf.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(bits_float(0x7f800001u)))));
  // bf16 has float's exponent range; the largest float still rounds up past the top to inf.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);
  // Subnormal floats keep their (truncated-and-rounded) bits.
  EXPECT_EQ(float_to_bf16(bits_float(0x00010000u)).bits, 0x0001);
  EXPECT_EQ(bf16_to_float(bf16{0x0001}), bits_float(0x00010000u));
  EXPECT_EQ(bf16_to_float(bf16{0x4049}), 3.140625f);
}

TEST(DType, F16KnownBitPatternsRoundingAndSubnormals) {
  EXPECT_EQ(float_to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f).bits, 0xc000);
  EXPECT_EQ(float_to_f16(65504.0f).bits, 0x7bff);                     // largest finite
  EXPECT_EQ(float_to_f16(65519.99f).bits, 0x7bff);                    // still rounds down
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7c00);                     // the tie goes to inf
  EXPECT_EQ(float_to_f16(1e6f).bits, 0x7c00);
  EXPECT_EQ(float_to_f16(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::nanf("")))));
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0); 1 + 3*2^-11 rounds up.
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f).bits, 0x3c00);
  EXPECT_EQ(float_to_f16(1.0f + 3 * 0x1p-11f).bits, 0x3c02);
  // Subnormals: the smallest is 2^-24; 2^-14 is the smallest normal.
  EXPECT_EQ(float_to_f16(0x1p-24f).bits, 0x0001);
  EXPECT_EQ(float_to_f16(0x1p-14f).bits, 0x0400);
  EXPECT_EQ(float_to_f16(0x1p-15f).bits, 0x0200);
  EXPECT_EQ(float_to_f16(3 * 0x1p-25f).bits, 0x0002);  // 1.5 units: tie, rounds to even (2)
  EXPECT_EQ(float_to_f16(0x1p-25f).bits, 0x0000);      // half a unit: tie, rounds to even (0)
  EXPECT_EQ(float_to_f16(0x1.8p-25f).bits, 0x0001);    // 0.75 units rounds up to 1
  EXPECT_EQ(f16_to_float(f16{0x0001}), 0x1p-24f);
  EXPECT_EQ(f16_to_float(f16{0x03ff}), 1023 * 0x1p-24f);
  EXPECT_EQ(f16_to_float(f16{0x7c00}), std::numeric_limits<float>::infinity());
  // Every f16 bit pattern survives f16 -> float -> f16 (NaNs stay NaN).
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = f16_to_float(f16{uint16_t(b)});
    if (std::isnan(f)) EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
    else EXPECT_EQ(float_to_f16(f).bits, b) << "pattern " << b;
  }
}

TEST(DType, TensorConversionsRoundTrip) {
  Tensor a = from_vector(std::vector<double>{0.1, -3.5, 1e-6, 70000}, {4}, DType::f32);
  EXPECT_EQ(a.to(DType::bf16).to(DType::f32).to_vector()[1], -3.5);
  EXPECT_TRUE(std::isinf(a.to(DType::f16).to_vector()[3]));  // 70000 overflows f16
  EXPECT_EQ(a.to(DType::f64).to(DType::f32).to_vector(), a.to_vector());
  EXPECT_EQ(from_vector(std::vector<double>{2.9, -2.9}, {2}).to(DType::i64).to_vector(),
            (std::vector<double>{2, -2}));
}

TEST(Tensor, PrintsLikePyTorch) {
  Tensor a = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(a.str(), "tensor([[1.0000, 2.0000], [3.0000, 4.0000]], shape=[2, 2], dtype=f32, device=cpu)");
  std::string big = arange(5000, DType::i64).str();
  EXPECT_NE(big.find("0, 1, 2, ..., 4997, 4998, 4999"), std::string::npos) << big;
}

TEST(TensorErrors, MisuseNamesTheCallAndShapes) {
  expect_error([] { zeros({2, 2}).item(); }, {"item", "[2, 2]", "4 elements"});
  expect_error([] { zeros({2, 3}).view({4, 2}); }, {"view", "[4, 2]", "[2, 3]"});
  expect_error([] { zeros({2, 3}).t().view({6}); }, {"view", "not contiguous", "reshape"});
  expect_error([] { zeros({2, 3}).copy_(zeros({3, 2})); }, {"copy_", "[3, 2]", "[2, 3]"});
  expect_error([] { zeros({2, 3}).transpose(0, 2); }, {"transpose", "[2, 3]"});
  expect_error([] { zeros({2}).data<double>(); }, {"data", "f32", "f64"});
  expect_error([] { zeros({-1}); }, {"negative", "[-1]"});
  expect_error([] { from_vector(std::vector<double>{1, 2}, {3}); }, {"from_vector", "[3]"});
  expect_error([] { Device::parse("gpu0"); }, {"Device::parse", "gpu0"});
  expect_error([] { Device::parse("cuda:-1"); }, {"Device::parse", "'cuda:-1'"});
  expect_error([] { Device::parse("cuda:99999999999"); }, {"Device::parse", "out of range"});
  expect_error([] { zeros({2}, DType::i64).set_requires_grad(); }, {"requires_grad", "i64"});
  expect_error([] { Tensor().shape(); }, {"undefined"});
  if (!cuda_available())
    expect_error([] { zeros({2}, DType::f32, cuda_device(0)); }, {"cuda:0"});
}

TEST(TensorErrors, ShapesWhoseCountsOverflowAreErrorsNotSmallAllocations) {
  const int64_t big = int64_t(1) << 32;
  // 2^64 elements wrap to 0 in int64: without a check this "succeeds" with no memory behind it.
  expect_error([&] { zeros({big, big}); }, {"empty", "[4294967296, 4294967296]", "int64"});
  expect_error([&] { full({big, big, 3}, 1.0); }, {"empty", "[4294967296, 4294967296, 3]"});
  // 2^62 f32 elements are 2^64 bytes: the byte count wraps even though the element count fits.
  expect_error([&] { empty({int64_t(1) << 62}); }, {"empty", "[4611686018427387904]", "f32", "bytes"});
  expect_error([&] { empty({3, -2}); }, {"empty", "negative", "[3, -2]"});
  // An empty tensor viewed with huge other dimensions: numel is 0, but its strides overflow.
  expect_error([&] { zeros({0}).view({0, big, big}); }, {"view", "[0, 4294967296, 4294967296]"});
  expect_error([&] { zeros({4}).reshape({-1, big, big}); }, {"view", "[-1, 4294967296, 4294967296]"});
  expect_error([&] { zeros({4}).view({2, -3}); }, {"view", "negative", "[2, -3]"});
  expect_error([&] { from_vector(std::vector<double>{1}, {big, big}); }, {"from_vector", "int64"});
  expect_error([&] { Storage::allocate(SIZE_MAX, kCPU); }, {"Storage::allocate", "bytes"});
}

// The bookkeeping of a CUDA graph's memory block (core/arena.h), on the CPU.
TEST(Arena, BestFitReusesFreedBytesAndMergesNeighbours) {
  Arena a(4096, 256);
  const size_t x = *a.allocate(100), y = *a.allocate(300), z = *a.allocate(256);
  EXPECT_EQ(x, 0u);
  EXPECT_EQ(y, 256u);   // 100 bytes take one 256-byte unit
  EXPECT_EQ(z, 768u);   // 300 take two
  EXPECT_EQ(a.used(), 1024u);
  a.free(y);
  EXPECT_EQ(*a.allocate(200), 256u);  // the freed hole, the best fit, before the big tail
  a.free(256);
  a.free(x);
  a.free(z);  // every neighbour merged again: the whole range is one free block
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.live(), 0u);
  EXPECT_EQ(*a.allocate(4096), 0u);
  EXPECT_FALSE(a.allocate(1).has_value());  // full: the caller falls back
  EXPECT_THROW(a.free(17), Error);          // never handed out
}

// Small public functions given what they cannot use: a clear error, where each once read out of
// bounds (a .grad of another shape, read element by element by the optimizers), divided by zero
// (a draw below 0), built iterators past the end (a validation share above 1) or looped forever
// (batches of 0 rows).
TEST(SmallApis, BadArgumentsAreClearErrors) {
  Tensor p = zeros({4, 3});
  expect_error([&] { p.set_grad(zeros({3})); }, {"set_grad: a gradient of shape [3]", "[4, 3]"});
  // A .grad backward cannot add into as it is: another dtype (an f16 one lost every sum's low
  // bits) or strided.
  expect_error([&] { p.set_grad(zeros({4, 3}, DType::f16)); },
               {"set_grad", "f16", "its .grad: f32"});
  expect_error([&] { p.set_grad(zeros({3, 4}).t()); }, {"set_grad", "strided"});
  p.set_grad(ones({4, 3}));
  p.set_grad(Tensor());  // no gradient: always fine
  EXPECT_FALSE(p.grad().defined());
  Generator g(1);
  expect_error([&] { g.below(0); }, {"below", "n = 0"});
  expect_error([&] { data::split_indices(10, 1.5, 0); }, {"val_fraction must be in [0, 1]"});
  const data::Dataset set = data::make_synthetic(20, 4, 3, 0.1, 0);
  expect_error([&] { data::for_each_batch(set, {0, 1, 2}, 0, kCPU, [](const data::Batch&) {}); },
               {"batch_size must be positive, got 0"});
}
