// Gradients that add up from many places: the two traps of a GPT's first and last layer, each
// built on purpose beside the real op and shown giving the wrong answer.
//
//   EmbeddingTrap5  one id at many positions of a batch: every position's dy row must land in the
//                   same row of dW. A scatter written with '=' keeps one of them; float atomics
//                   keep them all, in an order that changes from run to run.
//   TyingTrap6      one Parameter used twice (the token embedding and the output head of a GPT):
//                   its one .grad must receive both uses' gradients, whichever backward runs
//                   first. A head holding a copy of the weight, or a backward that stores into
//                   the shared .grad, loses one of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <set>
#include <vector>

#include "core/autograd.h"
#include "core/registry.h"
#include "core/rng.h"
#include "ops/elementwise/elementwise.h"
#include "ops/embedding/embedding.h"
#include "ops/linear/linear.h"
#include "tests/gradcheck.h"

using namespace mt;
using mt::test::random_leaf;

namespace {

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

Tensor ids_of(const std::vector<int64_t>& v) {
  return from_vector(v, {int64_t(v.size())}, DType::i64);
}

// Gathers row ids[p] of W as the real op does; the backward is the real op's with its '+=' made
// a '=': each position's dy row overwrites the row of dW the previous position of the same id
// wrote. Serially the last position wins; on a GPU, whichever thread writes last.
struct EmbeddingThatOverwrites : Function<EmbeddingThatOverwrites> {
  static constexpr const char* name = "embedding_that_overwrites";
  static Tensor forward(Context& ctx, const Tensor& ids, const Tensor& W) {
    ctx.save_for_backward({ids});
    ctx.set("W_shape", W.shape());
    return embedding(ids, W);
  }
  static GradList backward(Context& ctx, const GradList& dys) {
    const Tensor ids = ctx.saved_tensors()[0];
    const Shape w_shape = ctx.get<Shape>("W_shape");
    const int64_t C = w_shape[1];
    Tensor dy = dys[0].contiguous();
    Tensor dW = zeros(w_shape, DType::f64);
    double* out = dW.data<double>();
    const double* g = dy.data<double>();
    for (int64_t p = 0; p < ids.numel(); ++p) {
      const int64_t id = ids.data<int64_t>()[p];
      for (int64_t c = 0; c < C; ++c) out[id * C + c] = g[p * C + c];  // THE BUG: '=', not '+='
    }
    return {Tensor(), dW};
  }
};

// The real op with weight tying's trap: the same forward and the same backward kernel, but its
// dW goes into W's .grad with '=' (a store), wiping whatever another use of W put there first.
struct EmbeddingThatStoresIntoSink : Function<EmbeddingThatStoresIntoSink> {
  static constexpr const char* name = "embedding_that_stores";
  static Tensor forward(Context& ctx, const Tensor& ids, const Tensor& W) {
    ctx.save_for_backward({ids});
    ctx.set("W_shape", W.shape());
    return embedding(ids, W);
  }
  static GradList backward(Context& ctx, const GradList& dys) {
    const Tensor ids = ctx.saved_tensors()[0];
    const Shape w_shape = ctx.get<Shape>("W_shape");
    Tensor this_use = zeros(w_shape, DType::f64);  // this use's dW alone
    kernel<EmbeddingBackwardFn>("embedding", Phase::Backward, ids.device())(
        ids, dys[0].contiguous().view({ids.numel(), w_shape[1]}), this_use);
    ctx.grad_sink(1).copy_(this_use);  // THE BUG: '=' overwrites the other use's gradient
    return {Tensor(), Tensor()};
  }
};

// dL/dW by central differences in f64, every element.
std::vector<double> numeric_grad(const std::function<Tensor(const Tensor&)>& loss, const Tensor& W) {
  NoGradGuard no_grad;
  std::vector<double> g(static_cast<size_t>(W.numel()));
  double* p = W.data<double>();
  const double h = 1e-6;
  for (int64_t j = 0; j < W.numel(); ++j) {
    const double orig = p[j];
    p[j] = orig + h;
    const double fp = loss(W).item();
    p[j] = orig - h;
    const double fm = loss(W).item();
    p[j] = orig;
    g[size_t(j)] = (fp - fm) / (2 * h);
  }
  return g;
}

std::vector<double> analytic_grad(const std::function<Tensor(const Tensor&)>& loss, Tensor W) {
  W.zero_grad();
  loss(W).backward();
  return W.grad().to_vector();
}

std::vector<uint32_t> bits_of(const Tensor& t) {
  const float* p = t.data<float>();
  std::vector<uint32_t> b(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::bit_cast<uint32_t>(p[i]);
  return b;
}

// A batch of n positions over V ids, id `hot` at every 4th position (a common token).
std::vector<int64_t> batch_with_a_hot_id(int64_t n, int64_t V, int64_t hot, uint64_t seed) {
  Generator g(seed);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) ids[size_t(p)] = p % 4 == 0 ? hot : int64_t(g.below(uint64_t(V)));
  return ids;
}

// A permutation of the positions that interleaves the ids anew but keeps each id's positions in
// their order: the batch another data loader (or another thread schedule) could have produced
// with the same rows per id.
std::vector<int64_t> interleave_anew(const std::vector<int64_t>& ids, int64_t V, uint64_t seed) {
  std::vector<std::vector<int64_t>> by_id(static_cast<size_t>(V));
  for (size_t p = 0; p < ids.size(); ++p) by_id[size_t(ids[p])].push_back(int64_t(p));
  std::vector<size_t> next(static_cast<size_t>(V), 0);
  std::vector<int64_t> perm;
  Generator g(seed);
  while (perm.size() < ids.size()) {
    const size_t v = size_t(g.below(uint64_t(V)));
    if (next[v] < by_id[v].size()) perm.push_back(by_id[v][next[v]++]);
  }
  return perm;
}

// Rows perm[q] of a [n, C] tensor, as row q.
Tensor rows_in_order(const Tensor& t, const std::vector<int64_t>& perm) {
  const int64_t C = t.size(1);
  Tensor out = empty({int64_t(perm.size()), C}, t.dtype());
  for (size_t q = 0; q < perm.size(); ++q)
    for (int64_t c = 0; c < C; ++c)
      out.data<float>()[int64_t(q) * C + c] = t.data<float>()[perm[q] * C + c];
  return out;
}

}  // namespace

// '=' in a scatter: right on a batch whose ids are all different, wrong as soon as one repeats.
TEST(EmbeddingTrap5, OverwritingScatterLosesEveryRepeatButTheLast) {
  manual_seed(5);
  constexpr int64_t V = 6, C = 4;
  const std::vector<int64_t> distinct = {4, 0, 2, 5}, repeats = {2, 0, 2, 5, 2, 3, 0, 2};
  for (const auto& v : {distinct, repeats}) {
    const Tensor ids = ids_of(v);
    const Tensor up = random_leaf({int64_t(v.size()), C}, -2, 2, false);
    const Tensor W = random_leaf({V, C});
    auto real = [&](const Tensor& w) { return sum(mul(embedding(ids, w), up)); };
    auto buggy = [&](const Tensor& w) { return sum(mul(EmbeddingThatOverwrites::apply(ids, w), up)); };
    const std::vector<double> numeric = numeric_grad(real, W);
    EXPECT_LT(max_abs_diff(analytic_grad(real, W), numeric), 1e-7);  // the real op: every position

    const double miss = max_abs_diff(analytic_grad(buggy, W), numeric);
    if (v == distinct) {
      EXPECT_LT(miss, 1e-7) << "one position per id: nothing to lose, the bug is invisible";
    } else {
      EXPECT_GT(miss, 0.1) << "id 2 at 4 positions, id 0 at 2: all but the last are lost";
      // Exactly: the overwritten rows hold the last position's dy, the others the real sum.
      const std::vector<double> g = W.grad().to_vector(), u = up.to_vector();
      for (int64_t c = 0; c < C; ++c) {
        EXPECT_DOUBLE_EQ(g[size_t(2 * C + c)], u[size_t(7 * C + c)]);
        EXPECT_DOUBLE_EQ(g[size_t(0 * C + c)], u[size_t(6 * C + c)]);
        EXPECT_NEAR(g[size_t(5 * C + c)], numeric[size_t(5 * C + c)], 1e-7);
      }
    }
  }
}

// Float atomics add every row, in the order the threads arrive: not wrong, but not reproducible.
// The real op sums each id's rows in a fixed order, so the bits depend only on the batch.
TEST(EmbeddingTrap5, AtomicOrdersGiveOtherBitsTheFixedOrderSumDoesNot) {
  constexpr int64_t n = 4096, V = 50, C = 8, hot = 7;
  const std::vector<int64_t> ids = batch_with_a_hot_id(n, V, hot, 11);
  Generator g(12);
  Tensor dy = empty({n, C}, DType::f32);
  // Magnitudes over four decades, as real gradients have: the order of the adds then shows.
  for (int64_t i = 0; i < n * C; ++i)
    dy.data<float>()[i] = float(g.normal() * std::pow(10.0, g.uniform() * 4 - 2));
  std::vector<int64_t> hot_positions;
  for (int64_t p = 0; p < n; ++p)
    if (ids[size_t(p)] == hot) hot_positions.push_back(p);

  // What an atomicAdd per position into row `hot` leaves, for one order in which the positions'
  // threads arrive: position order; reversed; blocks of 256 positions finishing in a shuffled
  // order (each block in lane order); and fully shuffled arrivals.
  auto atomic_sum = [&](const std::vector<int64_t>& arrival) {
    std::vector<uint32_t> row(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int64_t p : arrival) acc += dy.data<float>()[p * C + c];
      row[size_t(c)] = std::bit_cast<uint32_t>(acc);
    }
    return row;
  };
  std::vector<std::vector<int64_t>> arrivals = {hot_positions,
                                                {hot_positions.rbegin(), hot_positions.rend()}};
  for (uint64_t s = 0; s < 4; ++s) {
    std::vector<int64_t> blocks(n / 256);
    for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = int64_t(b);
    Generator gs(100 + s);
    for (size_t i = blocks.size() - 1; i > 0; --i) std::swap(blocks[i], blocks[gs.below(i + 1)]);
    std::vector<int64_t> by_block;
    for (int64_t b : blocks)
      for (int64_t p : hot_positions)
        if (p / 256 == b) by_block.push_back(p);
    arrivals.push_back(by_block);
    std::vector<int64_t> shuffled = hot_positions;
    for (size_t i = shuffled.size() - 1; i > 0; --i) std::swap(shuffled[i], shuffled[gs.below(i + 1)]);
    arrivals.push_back(shuffled);
  }
  std::set<std::vector<uint32_t>> atomic_results;
  for (const auto& a : arrivals) atomic_results.insert(atomic_sum(a));
  EXPECT_GT(atomic_results.size(), size_t(1))
      << "the same " << hot_positions.size() << " rows summed in fp32 in " << arrivals.size()
      << " arrival orders all gave the same bits";

  // The real op: each row of dW is its positions' rows summed in increasing position order (in
  // double on the CPU, then rounded once; in fp32 registers on CUDA), then added into .grad.
  Tensor W = randn({V, C}).set_requires_grad();
  auto grad_bits = [&](const std::vector<int64_t>& batch, const Tensor& up) {
    W.zero_grad();
    embedding(ids_of(batch), W).backward(up);
    return bits_of(W.grad());
  };
  const std::vector<uint32_t> once = grad_bits(ids, dy);
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int64_t p : hot_positions) s += double(dy.data<float>()[p * C + c]);
    EXPECT_EQ(once[size_t(hot * C + c)], std::bit_cast<uint32_t>(float(s))) << "column " << c;
  }
  EXPECT_EQ(grad_bits(ids, dy), once) << "a second run";
  // The batch interleaved anew, each id's rows kept in their order: every row of dW keeps its
  // bits, since its terms and their order are unchanged. What is NOT invariant: moving two rows
  // of the same id past each other reorders that id's terms, which in fp32 may round differently
  // (the atomic orders above are such reorderings): the fixed order is a function of the batch.
  for (uint64_t s = 0; s < 3; ++s) {
    const std::vector<int64_t> perm = interleave_anew(ids, V, 200 + s);
    std::vector<int64_t> permuted(ids.size());
    for (size_t q = 0; q < perm.size(); ++q) permuted[q] = ids[size_t(perm[q])];
    ASSERT_NE(permuted, ids);  // a real reshuffle
    EXPECT_EQ(grad_bits(permuted, rows_in_order(dy, perm)), once) << "interleaving " << s;
  }
}

// The same on the GPU, where the threads do race: the sorted, segmented backward gives the same
// bits on every run and for every interleaving of the ids that keeps each id's rows in order.
TEST(CudaEmbeddingTrap5, SortedSegmentedSumIsTheSameBitsForEveryRunAndInterleaving) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  constexpr int64_t n = 1 << 16, V = 512, C = 64, hot = 3;
  const std::vector<int64_t> ids = batch_with_a_hot_id(n, V, hot, 21);
  manual_seed(22);
  const Tensor dy = randn({n, C});
  const Device dev = cuda_device(0);
  Tensor W = randn({V, C}, DType::f32, dev).set_requires_grad();
  auto grad_bits = [&](const std::vector<int64_t>& batch, const Tensor& up) {
    W.zero_grad();
    embedding(ids_of(batch).to(dev), W).backward(up.to(dev));
    return bits_of(W.grad().to(kCPU));
  };
  const std::vector<uint32_t> once = grad_bits(ids, dy);
  for (int run = 0; run < 3; ++run) EXPECT_EQ(grad_bits(ids, dy), once) << "run " << run;
  for (uint64_t s = 0; s < 2; ++s) {
    const std::vector<int64_t> perm = interleave_anew(ids, V, 300 + s);
    std::vector<int64_t> permuted(ids.size());
    for (size_t q = 0; q < perm.size(); ++q) permuted[q] = ids[size_t(perm[q])];
    EXPECT_EQ(grad_bits(permuted, rows_in_order(dy, perm)), once) << "interleaving " << s;
  }
}

namespace {

// A GPT's two ends on one W [V, C]: embed the ids, mix in the positions' other input x, project
// back onto the vocabulary with the same W. The head's backward runs first (it is nearer the
// loss), the embedding's second.
constexpr int64_t kV = 7, kC = 4;
const std::vector<int64_t> kIds = {3, 1, 3, 6, 0, 3};

struct TiedData {
  Tensor ids = ids_of(kIds);
  Tensor x = random_leaf({int64_t(kIds.size()), kC}, -2, 2, false);
  Tensor up = random_leaf({int64_t(kIds.size()), kV}, -2, 2, false);     // dL/dlogits
  Tensor head_in = random_leaf({5, kC}, -2, 2, false);                   // the branches' inputs
  Tensor head_up = random_leaf({5, kV}, -2, 2, false);
  Tensor emb_up = random_leaf({int64_t(kIds.size()), kC}, -2, 2, false);
};

}  // namespace

// The head holding its own copy of the weight: same values at the start, so the loss is the
// same, but W.grad receives only the embedding's share, and a step unties them.
TEST(TyingTrap6, HeadWithACopyOfTheWeightLosesTheHeadsGradient) {
  manual_seed(6);
  const TiedData d;
  auto tied = [&](const Tensor& W) { return sum(mul(linear(mul(embedding(d.ids, W), d.x), W), d.up)); };
  const Tensor W = random_leaf({kV, kC});
  const std::vector<double> numeric = numeric_grad(tied, W);  // d/dW through both uses
  EXPECT_LT(max_abs_diff(analytic_grad(tied, W), numeric), 1e-7) << "one W, two uses";

  const Tensor head_copy = W.detach().clone().set_requires_grad();  // THE BUG: a second Parameter
  auto untied = [&](const Tensor& w) { return sum(mul(linear(mul(embedding(d.ids, w), d.x), head_copy), d.up)); };
  EXPECT_NEAR(untied(W).item(), tied(W).item(), 1e-12) << "the copy starts equal: same loss";
  const std::vector<double> got = analytic_grad(untied, W);
  EXPECT_GT(max_abs_diff(got, numeric), 0.1) << "W.grad lacks the head's gradient";
  // What it holds is the embedding's share alone; the head's share went to the copy.
  std::vector<double> sum_of_both = got;
  const std::vector<double> head_share = head_copy.grad().to_vector();
  for (size_t i = 0; i < sum_of_both.size(); ++i) sum_of_both[i] += head_share[i];
  EXPECT_LT(max_abs_diff(sum_of_both, numeric), 1e-7);
  // One SGD step on each: the embedding and the head no longer share a weight.
  NoGradGuard no_grad;
  const Tensor stepped_W = sub(W, scale(W.grad(), 0.1)), stepped_copy = sub(head_copy, scale(head_copy.grad(), 0.1));
  EXPECT_GT(max_abs_diff(stepped_W.to_vector(), stepped_copy.to_vector()), 0.01);
}

// A backward that stores into the shared .grad: right when it runs first (the .grad is zero, the
// other use adds after it), wrong when it runs second. The real op adds, and is right in every
// order; in a GPT the embedding's backward runs last, the losing order.
TEST(TyingTrap6, StoreIntoTheSharedGradIsRightInOneOrderOnly) {
  manual_seed(7);
  const TiedData d;
  using Embed = std::function<Tensor(const Tensor&, const Tensor&)>;
  const Embed real = [](const Tensor& ids, const Tensor& W) { return embedding(ids, W); };
  const Embed storing = [](const Tensor& ids, const Tensor& W) {
    return EmbeddingThatStoresIntoSink::apply(ids, W);
  };
  // The GPT: the head consumes the embedding, so the head's backward runs first.
  auto gpt = [&](const Embed& embed) {
    return [&, embed](const Tensor& W) { return sum(mul(linear(mul(embed(d.ids, W), d.x), W), d.up)); };
  };
  // Two independent uses: the engine runs the later-created branch's backward first.
  auto branches = [&](const Embed& embed, bool embedding_first) {
    return [&, embed, embedding_first](const Tensor& W) {
      auto head = [&] { return sum(mul(linear(d.head_in, W), d.head_up)); };
      auto emb = [&] { return sum(mul(embed(d.ids, W), d.emb_up)); };
      if (embedding_first) {
        Tensor h = head();  // created first, runs second
        return add(h, emb());
      }
      Tensor e = emb();
      return add(head(), e);
    };
  };
  const Tensor W = random_leaf({kV, kC});
  struct Case {
    std::function<Tensor(const Tensor&)> real, storing;
    bool storing_is_right;
    const char* what;
  };
  const Case cases[] = {
      {gpt(real), gpt(storing), false, "the GPT: head, then embedding"},
      {branches(real, false), branches(storing, false), false, "branches: head first"},
      {branches(real, true), branches(storing, true), true, "branches: embedding first"}};
  for (const Case& c : cases) {
    const std::vector<double> numeric = numeric_grad(c.real, W);
    EXPECT_LT(max_abs_diff(analytic_grad(c.real, W), numeric), 1e-7) << c.what << ": the real op";
    const double miss = max_abs_diff(analytic_grad(c.storing, W), numeric);
    if (c.storing_is_right)
      EXPECT_LT(miss, 1e-7) << c.what << ": the store lands on a zero .grad, the head adds after";
    else
      EXPECT_GT(miss, 0.1) << c.what << ": the store wipes the head's gradient";
  }
}
