// embedding on the CPU: gradient checks for W, with one id repeated 1000 times in a batch; the
// scatter-add's += contract; bad ids named by position and value; on a GPU, the CUDA backward
// against the CPU with heavy repeats, bitwise run to run, and the bad-id error on the device.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/rng.h"
#include "ops/elementwise/elementwise.h"
#include "ops/embedding/embedding.h"
#include "tests/expect_error.h"
#include "tests/gradcheck.h"
#include "tests/poison_scope.h"

using namespace mt;
using mt::test::expect_error;
using mt::test::expect_gradcheck;
using mt::test::PoisonScope;
using mt::test::random_leaf;

#define MT_REQUIRE_CUDA() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped"

namespace {
Tensor ids_of(const std::vector<int64_t>& v, const Shape& shape) {
  return from_vector(v, shape, DType::i64);
}

// n ids in [0, V), with id `hot` at `repeats` positions spread through the batch.
Tensor repeated_ids(int64_t n, int64_t V, int64_t hot, int64_t repeats, uint64_t seed) {
  Generator g(seed);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = int64_t(g.below(uint64_t(V)));
  for (int64_t k = 0; k < repeats; ++k) v[size_t(k * n / repeats)] = hot;
  return ids_of(v, {n});
}
}  // namespace

TEST(Embedding, ForwardGathersRows) {
  Tensor W = random_leaf({5, 3}, -2, 2, false);
  Tensor ids = ids_of({4, 0, 4, 2, 1, 1}, {2, 3});
  Tensor y = embedding(ids, W);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 3}));
  const auto wv = W.to_vector(), yv = y.to_vector();
  const int64_t id[] = {4, 0, 4, 2, 1, 1};
  for (size_t p = 0; p < 6; ++p)
    for (size_t c = 0; c < 3; ++c) EXPECT_EQ(yv[p * 3 + c], wv[size_t(id[p]) * 3 + c]);
}

TEST(Embedding, GradientCheckForW) {
  manual_seed(1);
  Tensor W = random_leaf({6, 4});
  Tensor ids = ids_of({5, 0, 5, 3, 5, 1, 0}, {7});  // repeats, and rows never used (2, 4)
  expect_gradcheck([&](auto& in) { return embedding(ids, in[0]); }, {W}, "embedding");
}

// The += trap at its sharpest: one row receives 1000 contributions in one batch.
TEST(Embedding, GradientCheckWithOneIdRepeated1000Times) {
  manual_seed(2);
  Tensor W = random_leaf({5, 3});
  Tensor ids = repeated_ids(1200, 5, 3, 1000, 7).view({40, 30});
  expect_gradcheck([&](auto& in) { return embedding(ids, in[0]); }, {W}, "embedding x1000");
  // And the value: dW[3] = Σ over the 1000 positions (and any random 3s) of the upstream rows.
  W.zero_grad();
  Tensor up = rand({40, 30, 3}, DType::f64);
  embedding(ids, W).backward(up);
  const auto iv = ids.to_vector(), uv = up.to_vector(), gv = W.grad().to_vector();
  for (int64_t row = 0; row < 5; ++row)
    for (size_t c = 0; c < 3; ++c) {
      double s = 0;
      for (size_t p = 0; p < iv.size(); ++p)
        if (int64_t(iv[p]) == row) s += uv[p * 3 + c];
      EXPECT_NEAR(gv[size_t(row) * 3 + c], s, 1e-12) << row;
    }
}

TEST(EmbeddingAccumulation, BackwardTwiceIsTwiceAndAddsIntoAnExistingGrad) {
  manual_seed(3);
  Tensor W = random_leaf({4, 5});
  Tensor ids = ids_of({1, 3, 1, 1}, {4});
  Tensor up = rand({4, 5}, DType::f64);
  W.set_grad(full({4, 5}, 0.5, DType::f64));  // an earlier microbatch's gradient
  embedding(ids, W).backward(up);
  const auto g1 = W.grad().to_vector();
  embedding(ids, W).backward(up);
  const auto g2 = W.grad().to_vector();
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_DOUBLE_EQ(g2[i] - 0.5, 2 * (g1[i] - 0.5)) << i;
  EXPECT_EQ(g1[0], 0.5);  // row 0 is never looked up: only the earlier gradient
}

TEST(Embedding, NonLeafWGetsItsGradientInItsDtype) {
  Tensor W = random_leaf({4, 5}, -1, 1).to(DType::f32);
  Tensor leaf = W.detach();
  leaf.set_requires_grad();
  Tensor ids = ids_of({2, 2, 0}, {3});
  sum(embedding(ids, mt::scale(leaf, 1.0))).backward();
  EXPECT_EQ(leaf.grad().dtype(), DType::f32);
  const auto g = leaf.grad().to_vector();
  EXPECT_EQ(g[2 * 5], 2.0);
  EXPECT_EQ(g[0], 1.0);
  EXPECT_EQ(g[5], 0.0);
}

TEST(Embedding, BadIdsNameThePositionAndValue) {
  Tensor W = random_leaf({8, 3});
  expect_error([&] { embedding(ids_of({0, 1, 2, 3, 4, 10}, {2, 3}), W); },
               {"embedding", "position 5", "id 10", "[0, 8)"});
  expect_error([&] { embedding(ids_of({0, -1}, {2}), W); }, {"embedding", "position 1", "id -1"});
  expect_error([&] { embedding(ids_of({0}, {1}).to(DType::f32), W); }, {"embedding", "ids", "i64"});
  expect_error([&] { embedding(ids_of({0}, {1}), random_leaf({8})); }, {"embedding", "W", "[8]"});
}

namespace {
// The largest error of a row of [rows, C] values relative to that row's own largest reference
// value, over the rows; infinite where an element is not finite (the NaN poison). Against the
// whole table's largest value, a hot row's (~340 below), a bound of 1e-5 would let every other
// row (of size 0.25 to ~3) be off by 3.4e-3: an f16 rounding of its sum would pass.
double max_row_rel(const std::vector<double>& got, const std::vector<double>& ref, int64_t C) {
  if (got.size() != ref.size() || C <= 0 || ref.size() % size_t(C) != 0) return INFINITY;
  double worst = 0;
  for (size_t r0 = 0; r0 < ref.size(); r0 += size_t(C)) {
    double err = 0, scale = 0;
    for (size_t i = r0; i < r0 + size_t(C); ++i) {
      const double e = std::abs(got[i] - ref[i]);
      if (!std::isfinite(e)) return INFINITY;
      err = std::max(err, e);
      scale = std::max(scale, std::abs(ref[i]));
    }
    if (err > 0) worst = std::max(worst, scale > 0 ? err / scale : INFINITY);
  }
  return worst;
}
}  // namespace

// A batch of 65536 positions over a 50304-row table, one id 20000 times (the heavy repeat): the
// CUDA gradient against the CPU's (f64 sum, then rounded) row by row, bitwise equal run to run,
// and added into the existing .grad; allocations poisoned. The other rows get a few positions
// each, mostly summed inside one chunk: their error is a few fp32 roundings of their own size.
TEST(CudaEmbedding, HeavyRepeatsMatchTheCpuAndAreBitwiseRepeatable) {
  MT_REQUIRE_CUDA();
  const PoisonScope poison;
  const int64_t n = 65536, V = 50304, C = 64;
  Tensor ids = repeated_ids(n, V, 17, 20000, 11);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    manual_seed(4);
    Tensor W = randn({V, C}).to(dt), up = randn({n, C}).to(dt);
    Tensor Wc = W.detach(), Wg = W.to(cuda_device(0));
    Wc.set_requires_grad();
    Wg.set_requires_grad();
    Wc.set_grad(full({V, C}, 0.25));
    Wg.set_grad(full({V, C}, 0.25, DType::f32, cuda_device(0)));
    Tensor idg = ids.to(cuda_device(0));
    Tensor yg = embedding(idg, Wg);
    EXPECT_EQ(yg.to_vector(), embedding(ids, Wc).to_vector()) << dtype_name(dt);
    yg.backward(up.to(cuda_device(0)));
    embedding(ids, Wc).backward(up);
    const auto gg = Wg.grad().to_vector(), gc = Wc.grad().to_vector();
    EXPECT_LT(max_row_rel(gg, gc, C), 1e-5) << dtype_name(dt);
    Wg.set_grad(full({V, C}, 0.25, DType::f32, cuda_device(0)));
    embedding(idg, Wg).backward(up.to(cuda_device(0)));
    EXPECT_EQ(Wg.grad().to_vector(), gg) << dtype_name(dt) << ": not bitwise repeatable";
  }
}

// The backward's chunk sum and combine (embedding.h) on every kind of run: one id over the whole
// batch (a run across 125 chunks of 32, its partials split among the combine's warps), GPT-2's
// position ids (each id 64 times: runs that begin and end exactly on chunk boundaries), and
// random ids over a small table (runs that cross boundaries anywhere); widths of several column
// slabs (768), and odd ones that take the one-column path (37). Against the CPU row by row, added
// into an existing .grad, bitwise equal run to run; allocations poisoned.
TEST(CudaEmbedding, ChunkedSumsMatchTheCpuForEveryKindOfRun) {
  MT_REQUIRE_CUDA();
  const PoisonScope poison;
  struct Case {
    const char* what;
    std::vector<int64_t> ids;
    int64_t V, C;
  };
  std::vector<Case> cases;
  cases.push_back({"one id 4000 times", std::vector<int64_t>(4000, 3), 5, 768});
  std::vector<int64_t> positions(64 * 100), random(3001);
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = int64_t(i % 100);
  cases.push_back({"position ids", positions, 100, 768});
  uint64_t state = 12345;
  for (int64_t& id : random) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    id = int64_t((state >> 33) % 50);
  }
  cases.push_back({"random ids, C = 37", random, 50, 37});
  cases.push_back({"random ids, C = 768", random, 50, 768});
  for (const Case& c : cases)
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(c.what) + " " + dtype_name(dt));
      const int64_t n = int64_t(c.ids.size());
      Tensor ids = ids_of(c.ids, {n});
      manual_seed(6);
      Tensor W = randn({c.V, c.C}).to(dt), up = randn({n, c.C}).to(dt);
      Tensor Wc = W.detach(), Wg = W.to(cuda_device(0));
      Wc.set_requires_grad();
      Wg.set_requires_grad();
      Wc.set_grad(full({c.V, c.C}, 0.25));
      Wg.set_grad(full({c.V, c.C}, 0.25, DType::f32, cuda_device(0)));
      Tensor idg = ids.to(cuda_device(0));
      embedding(idg, Wg).backward(up.to(cuda_device(0)));
      embedding(ids, Wc).backward(up);
      const auto gg = Wg.grad().to_vector();
      EXPECT_LT(max_row_rel(gg, Wc.grad().to_vector(), c.C), 1e-5);
      Wg.set_grad(full({c.V, c.C}, 0.25, DType::f32, cuda_device(0)));
      embedding(idg, Wg).backward(up.to(cuda_device(0)));
      EXPECT_EQ(Wg.grad().to_vector(), gg) << "not bitwise repeatable";
    }
}

TEST(CudaEmbedding, BadIdIsAnErrorAtTheNextSynchronization) {
  MT_REQUIRE_CUDA();
  Tensor W = randn({8, 3}).to(cuda_device(0));
  Tensor ids = ids_of({0, 1, 9, 3, -2}, {5}).to(cuda_device(0));
  expect_error([&] { embedding(ids, W).to_vector(); },
               {"embedding", "position 2", "id 9", "[0, 8)"});
  // Reported once: the next call with good ids is clean.
  EXPECT_NO_THROW(embedding(ids_of({0, 7}, {2}).to(cuda_device(0)), W).to_vector());
}
