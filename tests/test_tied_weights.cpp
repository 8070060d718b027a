// Tied weights: one parameter used by two ops, as a GPT's token embedding and output head share
// W [V, C], receives the sum of both uses' gradients, whichever backward runs first, in eager
// and CUDA-graph runs. The two uses here are linear layers, so both of the engine's paths into
// .grad meet on one leaf:
//
//   head       logits = linear(h, W)          W is a leaf argument: dW is added into W.grad
//                                             through the grad sink while the node runs
//   embedding  e = linear(A, W.t())           the transpose is not a leaf: linear returns its
//              (A one-hot rows select rows    gradient, the transpose node passes it on, and
//              of W; A dense covers that)     AccumulateGrad adds it (+=) after every use ran
//
// The engine's one AccumulateGrad per leaf waits until every edge into it has delivered, so the
// sink's += and the returned gradient's += both land, in either order of the two nodes.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "ops/elementwise/elementwise.h"
#include "ops/linear/linear.h"
#include "tests/gradcheck.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/graph.h"
#endif

using namespace mt;
using mt::test::expect_gradcheck;
using mt::test::random_leaf;

namespace {

constexpr int64_t M = 5, V = 7, C = 4;

// A GPT in miniature: embed, add a residual input, project back onto the vocabulary with the
// same W.
Tensor tied_gpt(const Tensor& A, const Tensor& x, const Tensor& W) {
  return linear(add(linear(A, W.t()), x), W);
}

// The two uses as independent branches of one loss, created in the order asked: the engine runs
// the later-created node first, so the order decides which use's backward reaches W first.
enum class Use { Head, Embedding, HeadAgain, EmbeddingAgain };
Tensor use(Use u, const Tensor& W, const std::vector<Tensor>& data) {
  switch (u) {
    case Use::Head: return linear(data[0], W);                // [M, V], the sink path
    case Use::Embedding: return linear(data[1], W.t());       // [M, C], the returned path
    case Use::HeadAgain: return linear(data[2], W);           // linear twice on the same leaf
    case Use::EmbeddingAgain: return linear(data[3], W.t());  // the transpose twice
  }
  return {};
}
Tensor loss_of(const std::vector<Use>& order, const Tensor& W, const std::vector<Tensor>& data,
               const std::vector<Tensor>& weights) {
  Tensor loss;
  for (Use u : order) {
    Tensor term = sum(mul(use(u, W, data), weights[size_t(u)]));
    loss = loss.defined() ? add(loss, term) : term;
  }
  return loss;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

TEST(TiedWeights, GradientCheckOfTheTiedWeightInAMiniatureGpt) {
  manual_seed(1);
  Tensor A = random_leaf({M, V}), x = random_leaf({M, C}), W = random_leaf({V, C});
  expect_gradcheck([](auto& v) { return tied_gpt(v[0], v[1], v[2]); }, {A, x, W}, "tied W");
  // And with each use alone differentiable, the sum is what the check above saw: the tie adds.
  expect_gradcheck([](auto& v) { return add(linear(v[0], v[2]), linear(v[1], v[2])); },
                   {random_leaf({M, C}), random_leaf({M, C}), random_leaf({V, C})},
                   "linear twice on one W");
  expect_gradcheck([](auto& v) { return add(linear(v[0], v[2].t()), linear(v[1], v[2]).t()); },
                   {random_leaf({V, V}), random_leaf({C, C}), random_leaf({V, C})},
                   "a transpose use and a direct use");
}

// Every order of the two uses, and both uses through the same path, leave W.grad = the sum of
// each use's gradient alone, added on top of what .grad already held (+=).
TEST(TiedWeights, EveryOrderOfTheUsesSumsBothGradientsIntoWhatGradHeld) {
  manual_seed(2);
  const std::vector<Tensor> data = {random_leaf({M, C}, -2, 2, false), random_leaf({M, V}, -2, 2, false),
                                    random_leaf({M, C}, -2, 2, false), random_leaf({M, V}, -2, 2, false)};
  const std::vector<Tensor> weights = {random_leaf({M, V}, -2, 2, false), random_leaf({M, C}, -2, 2, false),
                                       random_leaf({M, V}, -2, 2, false), random_leaf({M, C}, -2, 2, false)};
  const Tensor W0 = random_leaf({V, C}, -2, 2, false), held = random_leaf({V, C}, -2, 2, false);
  auto grad_of = [&](const std::vector<Use>& order, bool start_from_held) {
    Tensor W = W0.clone().set_requires_grad();
    if (start_from_held) W.set_grad(held.clone());
    loss_of(order, W, data, weights).backward();
    return W.grad().to_vector();
  };
  std::vector<std::vector<double>> alone;
  for (Use u : {Use::Head, Use::Embedding, Use::HeadAgain, Use::EmbeddingAgain})
    alone.push_back(grad_of({u}, false));
  const std::vector<double> h = held.to_vector();
  struct Case {
    std::vector<Use> order;
    const char* what;
  };
  for (const Case& c : {Case{{Use::Embedding, Use::Head}, "embedding then head (a GPT's order)"},
                        Case{{Use::Head, Use::Embedding}, "head then embedding"},
                        Case{{Use::Head, Use::HeadAgain}, "linear twice: two sinks"},
                        Case{{Use::Embedding, Use::EmbeddingAgain}, "transpose twice: two returns"},
                        Case{{Use::Embedding, Use::Head, Use::EmbeddingAgain, Use::HeadAgain}, "all four"}})
    for (bool from_held : {false, true}) {
      std::vector<double> expected = from_held ? h : std::vector<double>(h.size(), 0.0);
      for (Use u : c.order)
        for (size_t i = 0; i < expected.size(); ++i) expected[i] += alone[size_t(u)][i];
      const std::vector<double> got = grad_of(c.order, from_held);
      // The same sums in another order: equal up to f64 rounding, far below any one term.
      EXPECT_LT(max_abs_diff(got, expected), 1e-12) << c.what << (from_held ? ", onto a held .grad" : "");
    }
}

// Backward twice through the tied model = twice one backward, and the microbatch rule holds:
// two halves of the rows, each its own backward, add up to the full batch.
TEST(TiedWeights, BackwardTwiceIsTwiceAndHalvesAddUpToTheBatch) {
  manual_seed(3);
  const Tensor A = random_leaf({M + 1, V}, -2, 2, false), x = random_leaf({M + 1, C}, -2, 2, false);
  const Tensor up = random_leaf({M + 1, V}, -2, 2, false);
  Tensor W = random_leaf({V, C});
  tied_gpt(A, x, W).backward(up);
  const std::vector<double> once = W.grad().to_vector();
  tied_gpt(A, x, W).backward(up);
  const std::vector<double> twice = W.grad().to_vector();
  std::vector<double> doubled = once;
  for (double& g : doubled) g *= 2;
  EXPECT_LT(max_abs_diff(twice, doubled), 1e-12);  // (a + b) + (a + b), summed in another order

  W.zero_grad();
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 2}, {2, M + 1}})
    tied_gpt(A.slice_rows(begin, end), x.slice_rows(begin, end), W).backward(up.slice_rows(begin, end).contiguous());
  EXPECT_LT(max_abs_diff(W.grad().to_vector(), once), 1e-12);
}

// Mixed precision: bf16 activations, f32 master W and its bf16 compute copy, which the
// embedding use reads transposed like W. Both uses' gradients land in the one fp32 .grad, each
// summed in fp32 from the rounded inputs: the f64 sums of the same rounded inputs to 1e-5.
TEST(TiedWeights, MixedPrecisionSumsBothUsesIntoTheFp32MasterGrad) {
  manual_seed(5);
  const Tensor h = randn({M, C}, DType::bf16), A = randn({M, V}, DType::bf16);
  const Tensor up_head = randn({M, V}, DType::bf16), up_emb = randn({M, C}, DType::bf16);
  Tensor W = randn({V, C}).set_requires_grad();
  const Tensor Wc = W.detach().to(DType::bf16);
  mt::backward({linear(h, W, {}, Wc), linear(A, W.t(), {}, Wc.t())}, {up_head, up_emb});
  ASSERT_EQ(W.grad().dtype(), DType::f32);

  // The reference: each use alone on a leaf of its own, in f64, summed here (not by the engine).
  auto f64 = [](const Tensor& t) { return t.to(DType::f64); };
  Tensor W_head = f64(W.detach()).set_requires_grad(), W_emb = f64(W.detach()).set_requires_grad();
  linear(f64(h), W_head).backward(f64(up_head));
  linear(f64(A), W_emb.t()).backward(f64(up_emb));
  const std::vector<double> got = W.grad().to_vector(), head = W_head.grad().to_vector();
  std::vector<double> ref = W_emb.grad().to_vector();
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += head[i];
  double largest = 0;
  for (double r : ref) largest = std::max(largest, std::abs(r));
  EXPECT_LT(max_abs_diff(got, ref), 1e-5 * largest);
}

#ifdef MT_WITH_CUDA
// The same tied step captured as one CUDA graph: a replay leaves W.grad bit for bit where the
// eager step does, with new inputs copied in too.
TEST(CudaTiedWeights, GraphReplayEqualsEagerBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  manual_seed(4);
  const Device dev = cuda_device(0);
  auto on_gpu = [&](const Shape& s) { return randn(s, DType::f32, dev); };
  const Tensor A = on_gpu({64, 96}), x = on_gpu({64, 32}), up = on_gpu({64, 96});
  Tensor W = on_gpu({96, 32}).set_requires_grad();
  W.set_grad(zeros(W.shape(), DType::f32, dev));  // a graph adds into a .grad made before it
  tied_gpt(A, x, W).backward(up);
  const std::vector<double> eager = W.grad().to_vector();

  W.grad().fill_(0.0);
  cuda::Graph graph = cuda::Graph::capture(dev.index, [&] { tied_gpt(A, x, W).backward(up); });
  graph.replay();
  EXPECT_EQ(W.grad().to_vector(), eager);

  // New values in the captured inputs: the replay reads them, as an eager step would.
  const Tensor A2 = on_gpu({64, 96});
  W.grad().fill_(0.0);
  tied_gpt(A2, x, W).backward(up);
  const std::vector<double> eager2 = W.grad().to_vector();
  A.detach().copy_(A2);
  W.grad().fill_(0.0);
  graph.replay();
  EXPECT_EQ(W.grad().to_vector(), eager2);
  EXPECT_NE(eager2, eager);
}
#endif
