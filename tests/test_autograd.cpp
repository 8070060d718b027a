// The engine and the Function contract: graph shapes, retain_graph, no-grad, detach, and the
// contract's errors (wrong count, mismatched gradient, modified saved tensor). Traps 1 and 2 of
// the lesson are built here on purpose, as Functions with the bug.
#include <gtest/gtest.h>

#include <pthread.h>

#include <cmath>
#include <functional>

#include "core/autograd.h"
#include "core/registry.h"
#include "ops/elementwise/elementwise.h"
#include "ops/scaled_silu/scaled_silu.h"
#include "tests/gradcheck.h"

using namespace mt;
using mt::test::random_leaf;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A Function whose backward returns one gradient too few: the lesson's first trap.
struct ForgetsASlot : Function<ForgetsASlot> {
  static constexpr const char* name = "forgets_a_slot";
  static Tensor forward(Context&, const Tensor& x, bool) { return x.clone(); }
  static GradList backward(Context&, const GradList& dy) { return {dy[0]}; }  // 1, not 2
};

// A Function whose backward returns a gradient of the wrong shape.
struct WrongShape : Function<WrongShape> {
  static constexpr const char* name = "wrong_shape";
  static Tensor forward(Context&, const Tensor& x) { return x.clone(); }
  static GradList backward(Context&, const GradList& dy) { return {dy[0].view({-1})}; }
};

// scaled_silu with the lesson's second trap: the same forward and the same backward kernel, but
// its w gradient goes into w's grad sink with '=' (a store) instead of '+=' (an add).
struct StoresIntoSink : Function<StoresIntoSink> {
  static constexpr const char* name = "scaled_silu_that_stores";
  static Tensor forward(Context& ctx, const Tensor& x, const Tensor& w) {
    ctx.save_for_backward({x, w});
    return scaled_silu(x, w);
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    auto saved = ctx.saved_tensors();
    const Tensor &x = saved[0], &w = saved[1];
    Tensor dx = ctx.needs_input_grad(0) ? empty(x.shape(), x.dtype()) : Tensor();
    Tensor this_call = zeros(w.shape(), w.dtype());  // this backward's dw alone
    kernel<ScaledSiLUBackwardFn>("scaled_silu", Phase::Backward, x.device())(
        x, w, dy[0].contiguous(), dx, this_call);
    Tensor sink = ctx.grad_sink(1);  // w's .grad: what earlier microbatches left there
    sink.copy_(this_call);           // THE BUG: '=' overwrites them; scaled_silu does '+='
    return {dx, Tensor()};
  }
};

}  // namespace

TEST(Autograd, LeafFlagsAndRequiresGradPropagation) {
  Tensor x = random_leaf({3});
  Tensor c = random_leaf({3}, -1, 1, /*grad=*/false);
  EXPECT_TRUE(x.is_leaf());
  Tensor y = mul(x, c);
  EXPECT_FALSE(y.is_leaf());
  EXPECT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn()->name(), "mul");
  Tensor z = mul(c, c);
  EXPECT_FALSE(z.requires_grad());
  EXPECT_TRUE(z.is_leaf());
}

TEST(Autograd, FanOutSumsGradientsOfATensorUsedTwice) {
  // y = x * x: the engine must sum both uses (micrograd's lesson): dy/dx = 2x.
  Tensor x = random_leaf({5});
  sum(mul(x, x)).backward();
  auto xv = x.to_vector(), g = x.grad().to_vector();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_DOUBLE_EQ(g[i], 2 * xv[i]);
}

TEST(Autograd, DiamondGraph) {
  // a -> (b = 3a, c = a*a) -> d = b + c: dd/da = 3 + 2a.
  Tensor a = random_leaf({4});
  Tensor d = add(scale(a, 3.0), mul(a, a));
  sum(d).backward();
  auto av = a.to_vector(), g = a.grad().to_vector();
  for (size_t i = 0; i < av.size(); ++i) EXPECT_NEAR(g[i], 3 + 2 * av[i], 1e-12);
}

TEST(Autograd, LongChainNeedsNoRecursion) {
  Tensor x = random_leaf({2});
  Tensor y = x;
  for (int i = 0; i < 10000; ++i) y = scale(y, 1.0001);
  sum(y).backward();
  double expect = std::pow(1.0001, 10000);
  for (double g : x.grad().to_vector()) EXPECT_NEAR(g, expect, 1e-9 * expect);
}

TEST(Autograd, RetainGraphTwiceAccumulatesAndWithoutItIsAClearError) {
  Tensor x = random_leaf({3});
  Tensor w = random_leaf({1}, 0.5, 1.5);
  Tensor loss = sum(scaled_silu(x, w));
  loss.backward(Tensor(), /*retain_graph=*/true);
  auto once = x.grad().to_vector();
  loss.backward();  // second pass through the retained graph: gradients add
  auto twice = x.grad().to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * once[i]);
  std::string msg = error_of([&] { loss.backward(); });
  EXPECT_NE(msg.find("retain_graph=true"), std::string::npos) << msg;
  EXPECT_NE(msg.find("second time"), std::string::npos) << msg;
}

// Without retain_graph only the nodes that saved tensors refuse a second backward: h = x + x
// saved nothing, so a second loss built on it backpropagates through it again, as in PyTorch
// (it used to fail at add, "its saved tensors were freed").
TEST(Autograd, ASecondBackwardThroughNodesThatSavedNothingRuns) {
  Tensor x = random_leaf({3});
  Tensor h = add(x, x);
  sum(scale(h, 1.0)).backward();
  sum(scale(h, 2.0)).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{6, 6, 6}));
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = random_leaf({3});
  {
    NoGradGuard g;
    Tensor y = mul(x, x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
  }
  EXPECT_TRUE(mul(x, x).requires_grad());
}

TEST(Autograd, DetachCutsTheGraphButSharesMemory) {
  Tensor x = random_leaf({3});
  Tensor y = scale(x, 2.0);
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_EQ(d.data_ptr(), y.data_ptr());
  // Only the non-detached path contributes: d/dx sum(2x + detached) = 2.
  sum(add(y, d)).backward();
  for (double g : x.grad().to_vector()) EXPECT_DOUBLE_EQ(g, 2.0);
}

TEST(Autograd, BackwardNeedsAScalarOrAnExplicitGradient) {
  Tensor x = random_leaf({3});
  std::string msg = error_of([&] { scale(x, 2.0).backward(); });
  EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
  msg = error_of([&] { scale(x, 2.0).backward(ones({4}, DType::f64)); });
  EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  msg = error_of([&] { random_leaf({1}, 0, 1, false).backward(); });
  EXPECT_NE(msg.find("does not require grad"), std::string::npos) << msg;
}

TEST(AutogradTrap1, WrongNumberOfGradientsIsAClearError) {
  Tensor x = random_leaf({2});
  Tensor y = ForgetsASlot::apply(x, true);
  std::string msg = error_of([&] { sum(y).backward(); });
  EXPECT_NE(msg.find("forgets_a_slot"), std::string::npos) << msg;
  EXPECT_NE(msg.find("returned 1 gradient(s) but forward took 2"), std::string::npos) << msg;
}

// The lesson's second trap: a backward that stores into the grad sink where it should add. The
// first backward after zero_grad cannot tell the two apart (the sink starts at zero), so a test
// with one backward passes; the second microbatch shows it: only its own gradient is left.
TEST(AccumulationTrap2, StoreInsteadOfAddLosesMicrobatches) {
  manual_seed(12);
  Tensor w = random_leaf({1}, 0.5, 1.5);
  Tensor a = random_leaf({20}, -2, 2, /*grad=*/false), b = random_leaf({13}, -2, 2, false);
  auto real = [&](const Tensor& x) { return sum(scaled_silu(x, w)); };
  auto buggy = [&](const Tensor& x) { return sum(StoresIntoSink::apply(x, w)); };
  auto alone = [&](const Tensor& x) {
    w.zero_grad();
    real(x).backward();
    return w.grad().item();
  };
  const double ga = alone(a), gb = alone(b);
  ASSERT_GT(std::abs(ga), 0.1);  // a lost microbatch must be visible

  // Microbatch a, then b, into the same .grad.
  w.zero_grad();
  real(a).backward();
  real(b).backward();
  EXPECT_NEAR(w.grad().item(), ga + gb, 1e-12);  // the real op: the sum

  w.zero_grad();
  buggy(a).backward();
  EXPECT_NEAR(w.grad().item(), ga, 1e-12);  // one backward: no difference yet
  buggy(b).backward();
  EXPECT_NEAR(w.grad().item(), gb, 1e-12);  // the store: a is gone
  EXPECT_GT(std::abs(w.grad().item() - (ga + gb)), 0.1);
}

TEST(Autograd, MismatchedGradientShapeNamesOpArgumentAndShapes) {
  Tensor x = random_leaf({2, 3});
  std::string msg = error_of([&] { sum(WrongShape::apply(x)).backward(); });
  EXPECT_NE(msg.find("wrong_shape"), std::string::npos) << msg;
  EXPECT_NE(msg.find("argument 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[6]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
}

TEST(Autograd, ModifyingASavedTensorInPlaceIsAClearError) {
  Tensor x = random_leaf({3});
  Tensor w = random_leaf({1});
  Tensor h = scale(x, 1.0);  // a non-leaf we then modify
  Tensor y = scaled_silu(h, w);
  // Written directly, an op's output is refused at once: the write would not be recorded.
  EXPECT_NE(error_of([&] { h.fill_(0.5); }).find("an in-place write is not recorded"),
            std::string::npos);
  // Through a detached alias it is not (the same storage, no history), but scaled_silu saved h
  // to recompute sigmoid(h), and the storage's version counter names the change at backward.
  h.detach().fill_(0.5);
  std::string msg = error_of([&] { sum(y).backward(); });
  EXPECT_NE(msg.find("scaled_silu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("modified in place"), std::string::npos) << msg;
}

// copy_ and fill_ are not recorded: into a tensor of the graph they would leave a silently wrong
// backward (y = 2x; y.copy_(z); sum(y).backward() gave x.grad = 2, where PyTorch gives 0 and
// z.grad = 1), so while gradients are recorded they are refused there; a NoGradGuard allows
// them, and writing into a plain tensor needs neither.
TEST(Autograd, InPlaceWritesIntoTheGraphAreRefusedWhileRecording) {
  Tensor x = random_leaf({2}), z = random_leaf({2});
  Tensor y = scale(x, 2.0);
  for (const auto& write : std::vector<std::function<void()>>{
           [&] { y.copy_(z); }, [&] { x.fill_(7); }, [&] { x.copy_(z); }})
    EXPECT_NE(error_of(write).find("an in-place write is not recorded"), std::string::npos);
  Tensor plain = zeros({2}, DType::f64);
  plain.copy_(y);  // values only: plain has no history
  EXPECT_EQ(plain.to_vector(), y.to_vector());
  EXPECT_EQ(plain.grad_fn(), nullptr);
  NoGradGuard no_grad;
  x.fill_(7);
  EXPECT_EQ(x.to_vector(), (std::vector<double>{7, 7}));
}

// set_data (what Module::to does) gives a tensor other memory, with its own version counter: a
// tensor saved for backward and then moved used to read its new, smaller buffer as the old one
// (x.grad = 20 40 0 0 0 0 0 0, reading past 2 elements). Now the backward names it.
TEST(Autograd, ASavedTensorGivenOtherDataIsAClearError) {
  Tensor x = random_leaf({8});
  Tensor y = mul(x, x);  // saves x
  x.set_data(from_vector(std::vector<double>{10, 20}, {2}));
  const std::string msg = error_of([&] { sum(y).backward(); });
  EXPECT_NE(msg.find("mul: saved tensor 0 was given other data"), std::string::npos) << msg;
}

TEST(Autograd, LeafGradIsOwnedNotAnAliasOfAnOpOutput) {
  // add's backward hands dy itself to its input; the leaf must still own a separate buffer.
  Tensor a = random_leaf({3});
  Tensor seed = from_vector(std::vector<double>{1, 2, 3}, {3}, DType::f64);
  add(a, random_leaf({3}, -1, 1, false)).backward(seed);
  EXPECT_NE(a.grad().data_ptr(), seed.data_ptr());
  seed.fill_(100);
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{1, 2, 3}));
}

TEST(Autograd, ZeroGradSetsToNoneOrZeros) {
  Tensor x = random_leaf({2});
  sum(x).backward();
  EXPECT_TRUE(x.grad().defined());
  x.zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, GradReadyHookFiresOncePerBackwardAfterAllContributions) {
  Tensor x = random_leaf({2});
  std::vector<double> seen;
  x.register_grad_ready_hook([&](const Tensor& t) { seen.push_back(t.grad().to_vector()[0]); });
  sum(add(mul(x, x), scale(x, 3.0))).backward();  // three uses of x
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_NEAR(seen[0], 2 * x.to_vector()[0] + 3, 1e-12);
}

TEST(Autograd, BitwiseIdenticalFromRunToRun) {
  auto run = [] {
    manual_seed(3);
    Tensor x = random_leaf({257});
    Tensor w = random_leaf({1});
    sum(mul(scaled_silu(x, w), x)).backward();
    auto g = x.grad().to_vector();
    g.push_back(w.grad().item());
    return g;
  };
  EXPECT_EQ(run(), run());
}

TEST(ElementwiseOps, GradientChecks) {
  using mt::test::expect_gradcheck;
  manual_seed(11);
  Tensor a = random_leaf({3, 5}), b = random_leaf({3, 5});
  expect_gradcheck([](auto& in) { return add(in[0], in[1], -0.7); }, {a, b}, "add");
  expect_gradcheck([](auto& in) { return mul(in[0], in[1]); }, {a, b}, "mul");
  expect_gradcheck([](auto& in) { return scale(in[0], 1.3); }, {a}, "scale");
  expect_gradcheck([](auto& in) { return relu(in[0]); }, {a}, "relu");
  expect_gradcheck([](auto& in) { return sum(in[0]); }, {a}, "sum");
  expect_gradcheck([](auto& in) { return mean(in[0]); }, {a}, "mean");
  expect_gradcheck([](auto& in) { return mse_loss(in[0], in[1]); }, {a, b}, "mse_loss");
}

// The forwards against plain loops: a gradient check alone passes a mean that forgot to divide
// (the gradient of the wrong forward is consistent with it).
TEST(ElementwiseOps, ForwardsMatchPlainLoops) {
  manual_seed(15);
  Tensor a = rand({3, 5}, DType::f64), b = rand({3, 5}, DType::f64);
  const auto va = a.to_vector(), vb = b.to_vector();
  double s = 0, sq = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    s += va[i];
    sq += (va[i] - vb[i]) * (va[i] - vb[i]);
  }
  EXPECT_NEAR(sum(a).item(), s, 1e-14);
  EXPECT_NEAR(mean(a).item(), s / 15, 1e-15);
  EXPECT_NEAR(mse_loss(a, b).item(), sq / 15, 1e-15);
  const auto sc = scale(a, -0.5).to_vector(), ad = add(a, b, 2.0).to_vector(),
             mu = mul(a, b).to_vector();
  for (size_t i = 0; i < va.size(); ++i) {
    EXPECT_EQ(sc[i], -0.5 * va[i]);
    EXPECT_EQ(ad[i], va[i] + 2.0 * vb[i]);
    EXPECT_EQ(mu[i], va[i] * vb[i]);
  }
}

// The view ops: their backward puts each gradient back where the view took it from.
TEST(ViewOps, GradientChecksAndSliceRowsPutsItsGradientAtItsRows) {
  using mt::test::expect_gradcheck;
  manual_seed(12);
  Tensor a = random_leaf({6, 3});
  expect_gradcheck([](auto& in) { return in[0].slice_rows(2, 5); }, {a}, "slice_rows(2, 5)");
  expect_gradcheck([](auto& in) { return in[0].t(); }, {a}, "transpose");
  expect_gradcheck([](auto& in) { return in[0].t().contiguous(); }, {a}, "contiguous");
  // Rows outside [begin, end) get exactly zero, rows inside exactly the upstream gradient.
  a.zero_grad();
  Tensor seed = rand({3, 3}, DType::f64);
  a.slice_rows(2, 5).backward(seed);
  const auto g = a.grad().to_vector(), s = seed.to_vector();
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 3; ++c)
      EXPECT_EQ(g[size_t(r * 3 + c)], r >= 2 && r < 5 ? s[size_t((r - 2) * 3 + c)] : 0.0)
          << "row " << r << ", column " << c;
}

// A gradient that reaches a leaf as a strided view (transpose's backward hands one on) is added
// into an existing .grad element by element, not in its memory order.
TEST(AccumulationTrap2, AStridedGradientAddsIntoAnExistingGrad) {
  manual_seed(14);
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor a = rand({4, 3}, dt).set_requires_grad();
    Tensor w = rand({3, 4}, dt);
    auto loss = [&] { return sum(mul(a.t(), w)); };  // d/da = w.t(), arriving as a view
    loss().backward();
    ASSERT_TRUE(a.grad().defined());
    EXPECT_EQ(a.grad().to_vector(), w.t().to(grad_dtype_for(dt)).to_vector()) << dtype_name(dt);
    loss().backward();  // into the existing .grad
    const auto w2 = w.t().to(DType::f64).to_vector();
    const auto g = a.grad().to_vector();
    for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i], 2 * w2[i]) << dtype_name(dt) << " " << i;
  }
}

// The lesson's third trap for the small ops: strided inputs and a strided upstream gradient give
// the gradients their contiguous copies give.
TEST(ElementwiseTrap3, StridedInputsAndUpstreamGradientMatchContiguous) {
  manual_seed(13);
  Tensor at = random_leaf({5, 3}), bt = random_leaf({5, 3});
  Tensor seed = rand({5, 3}, DType::f64);
  add(relu(mul(at.t(), bt.t())), at.t()).backward(seed.t());  // [3, 5] views, dy a view too
  const std::vector strided{at.grad().to_vector(), bt.grad().to_vector()};

  Tensor a = at.detach().t().contiguous(), b = bt.detach().t().contiguous();
  a.set_requires_grad();
  b.set_requires_grad();
  add(relu(mul(a, b)), a).backward(seed.t().contiguous());
  const std::vector contiguous{a.grad().t().to_vector(), b.grad().t().to_vector()};
  EXPECT_EQ(contiguous, strided);
}

// ---- graph teardown, saved outputs, Context values ------------------------------------------

namespace {

// exp(x), keeping its output for backward (dx = dy · y), as sigmoid and tanh do.
struct ExpSavesOutput : Function<ExpSavesOutput> {
  static constexpr const char* name = "exp_saves_output";
  static Tensor forward(Context& ctx, const Tensor& x) {
    Tensor y = x.clone();
    double* p = y.data<double>();
    for (int64_t i = 0; i < y.numel(); ++i) p[i] = std::exp(p[i]);
    ctx.save_for_backward({y});
    return y;
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    return {mul(dy[0], ctx.saved_tensors()[0])};
  }
};

// Sets one value in forward and reads it back in backward as the type T.
template <class T>
struct ReadsValueAs : Function<ReadsValueAs<T>> {
  static constexpr const char* name = "reads_value";
  static Tensor forward(Context& ctx, const Tensor& x) {
    ctx.set("k", int64_t(3));
    return x.clone();
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    (void)ctx.get<T>("k");
    (void)ctx.get<T>("missing");
    return {dy[0]};
  }
};

constexpr int kDeepChain = 100000;

// Runs f on a thread with a 512 KiB stack. A teardown that recursed once per node needs far more
// for kDeepChain nodes, while an 8 MiB main stack may just hold them in an optimized build; the
// iterative one needs the same few frames for any depth.
void run_on_small_stack(std::function<void()> f) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 512 * 1024), 0);
  pthread_t thread;
  auto body = [](void* arg) -> void* {
    (*static_cast<std::function<void()>*>(arg))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attr, body, &f), 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
}

}  // namespace

TEST(AutogradTeardown, DroppingA100000OpChainWithoutBackwardDoesNotOverflowTheStack) {
  // Each mul saves its input, whose grad_fn is the previous mul: the ownership chain a recursive
  // teardown would follow one stack frame group per node.
  Tensor x = random_leaf({4});
  Tensor w = random_leaf({4});
  Tensor y = mul(x, w);
  std::weak_ptr<Node> first = y.grad_fn();
  for (int i = 1; i < kDeepChain; ++i) y = mul(y, w);
  run_on_small_stack([&] { y = Tensor(); });  // y, and with it the whole graph, dropped there
  EXPECT_TRUE(first.expired());
}

TEST(AutogradTeardown, BackwardThroughA100000OpChainThenDropping) {
  Tensor x = random_leaf({3});
  Tensor w = random_leaf({3}, 0.5, 1.5, false);
  Tensor sign = w.clone();  // ±1: the product of 100,000 of them stays finite and exact
  for (int64_t i = 0; i < 3; ++i) sign.data<double>()[i] = i == 1 ? -1.0 : 1.0;
  sign.set_requires_grad();
  Tensor y = x;
  for (int i = 0; i < kDeepChain; ++i) y = mul(y, sign);
  y.backward(ones({3}, DType::f64));
  run_on_small_stack([&] { y = Tensor(); });
  // y = x · sign^N with N even: dy/dx = sign^N = 1, dy/dsign = N · x · sign^(N−1) = N · x · sign.
  const auto gx = x.grad().to_vector(), gs = sign.grad().to_vector(), xv = x.to_vector();
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(gx[i], 1.0);
    const double s = i == 1 ? -1.0 : 1.0;
    EXPECT_NEAR(gs[i], kDeepChain * xv[i] * s, 1e-9 * kDeepChain);
  }
}

TEST(AutogradSavedOutput, ForwardOnlyThenDroppingFreesTheNode) {
  Tensor x = random_leaf({5});
  std::weak_ptr<Node> node;
  {
    Tensor y = ExpSavesOutput::apply(x);
    node = y.grad_fn();
    ASSERT_FALSE(node.expired());
  }
  EXPECT_TRUE(node.expired()) << "the saved output keeps its own node alive (a reference cycle)";
}

TEST(AutogradSavedOutput, BackwardUsesTheSavedOutputAndThenFrees) {
  Tensor x = random_leaf({5});
  std::weak_ptr<Node> node;
  {
    Tensor y = ExpSavesOutput::apply(x);
    node = y.grad_fn();
    Tensor keep = y;  // the output outlives the backward, as a logged activation would
    sum(y).backward();
  }
  EXPECT_TRUE(node.expired());
  const auto g = x.grad().to_vector(), xv = x.to_vector();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], std::exp(xv[i]), 1e-12 * std::exp(xv[i]));
}

TEST(AutogradSavedOutput, ModifyingTheSavedOutputInPlaceIsStillAClearError) {
  Tensor x = random_leaf({5});
  Tensor y = ExpSavesOutput::apply(x);
  y.detach().fill_(0.25);  // y itself would be refused at once (an op's output)
  std::string msg = error_of([&] { y.backward(ones({5}, DType::f64)); });
  EXPECT_NE(msg.find("exp_saves_output"), std::string::npos) << msg;
  EXPECT_NE(msg.find("modified in place"), std::string::npos) << msg;
}

TEST(AutogradContext, MistypedOrMissingValueNamesTheOpTheKeyAndTheTypes) {
  Tensor x = random_leaf({2});
  std::string msg = error_of([&] { sum(ReadsValueAs<double>::apply(x)).backward(); });
  for (const char* part : {"reads_value", "'k'", "double", "long"})
    EXPECT_NE(msg.find(part), std::string::npos) << msg << " lacks " << part;
  msg = error_of([&] { sum(ReadsValueAs<int64_t>::apply(x)).backward(); });
  for (const char* part : {"reads_value", "'missing'", "never set"})
    EXPECT_NE(msg.find(part), std::string::npos) << msg << " lacks " << part;
}

TEST(Autograd, AnOpObserverHearsEachForwardAndEachBackwardNodeInOrder) {
  struct Log : OpObserver {
    std::vector<std::string> events;
    void begin(const char* op, bool backward) override {
      events.push_back(std::string(backward ? "backward " : "forward ") + op + " {");
    }
    void end(const char* op, bool backward) override {
      events.push_back(std::string(backward ? "backward " : "forward ") + op + " }");
    }
  } log;
  Tensor x = random_leaf({4});
  set_op_observer(&log);
  Tensor s = sum(mul(x, x));
  s.backward();
  set_op_observer(nullptr);
  sum(x).backward();  // after it is removed, nothing more is heard
  const std::vector<std::string> expected = {
      "forward mul {", "forward mul }", "forward sum {", "forward sum }",
      "backward sum {", "backward sum }", "backward mul {", "backward mul }",
      "backward AccumulateGrad {", "backward AccumulateGrad }"};
  EXPECT_EQ(log.events, expected);
}
