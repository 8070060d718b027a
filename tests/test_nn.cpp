// nn: registration and dotted names, state_dict round trips and every load error, train/eval
// leaving gradients alone and an evaluation handing the mode back, Linear's init, in-place dtype
// moves, Sequential and MLP.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "core/autograd.h"
#include "core/rng.h"
#include "nn/modules.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/elementwise/elementwise.h"
#include "ops/rms_norm/rms_norm.h"
#include "ops/rms_norm/rms_norm_scaled_silu.h"
#include "ops/scaled_silu/scaled_silu.h"
#include "optim/sgd.h"
#include "tests/gradcheck.h"
#include "tests/expect_error.h"
#include "tests/max_rel_diff.h"
#include "train/evaluate.h"

using namespace mt;
using mt::test::expect_error;

namespace {

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& entry : named) out.push_back(entry.first);
  return out;
}

// A hand-written module: own parameter and buffer, two children, one of them nested.
struct Net : nn::Module {
  Net() {
    scale = register_parameter("scale", ones({3}));
    count = register_buffer("count", zeros({1}, DType::i64));
    fc = register_module("fc", nn::Linear(4, 3));
    body = register_module("body", nn::Sequential{nn::Linear(3, 3), nn::RMSNorm(3)});
  }
  Tensor forward(const Tensor& x) override { return body->forward(fc->forward(x)); }
  std::string repr() const override { return "Net"; }
  Tensor scale, count;
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::Sequential> body;
};

nn::Sequential small_model() {
  return nn::Sequential{nn::Linear(5, 6), nn::RMSNorm(6), nn::ScaledSiLU(), nn::Linear(6, 3)};
}

}  // namespace

TEST(Module, NamesAreDottedAndInRegistrationOrder) {
  Net net;
  EXPECT_EQ(names_of(net.named_parameters()),
            (std::vector<std::string>{"scale", "fc.weight", "fc.bias", "body.0.weight", "body.0.bias",
                                      "body.1.weight"}));
  EXPECT_EQ(names_of(net.named_parameters(/*recurse=*/false)), (std::vector<std::string>{"scale"}));
  EXPECT_EQ(names_of(net.named_buffers()), (std::vector<std::string>{"count"}));
  EXPECT_EQ(net.parameters().size(), 6u);
  ASSERT_EQ(net.children().size(), 2u);
  EXPECT_EQ(net.children()[0], net.fc);  // register_module returned the registered pointer
  EXPECT_EQ(net.named_children()[1].first, "body");
  for (const Tensor& p : net.parameters()) EXPECT_TRUE(p.requires_grad());
  EXPECT_FALSE(net.count.requires_grad());
  EXPECT_TRUE(net.parameters()[1].is_same(net.fc->weight));  // handles, not copies
}

TEST(Module, BadOrDuplicateNamesAreErrors) {
  Net net;
  expect_error([&] { net.register_parameter("scale", zeros({1})); }, {"Net", "'scale'", "already taken"});
  expect_error([&] { net.register_module("fc", nn::ReLU()); }, {"'fc'", "already taken"});
  expect_error([&] { net.register_buffer("a.b", zeros({1})); }, {"'a.b'", "no '.'"});
  expect_error([&] { net.register_parameter("", zeros({1})); }, {"non-empty"});
}

TEST(Module, PrintsTheTreeLikePyTorch) {
  std::ostringstream os;
  os << Net();
  EXPECT_EQ(os.str(),
            "Net(\n"
            "  (fc): Linear(in_features=4, out_features=3, bias=true)\n"
            "  (body): Sequential(\n"
            "    (0): Linear(in_features=3, out_features=3, bias=true)\n"
            "    (1): RMSNorm(3, eps=1e-05)\n"
            "  )\n"
            ")");
}

TEST(Module, StateDictRoundTripGivesTheSameModel) {
  manual_seed(1);
  Net a;
  manual_seed(2);
  Net b;
  a.count.fill_(7);
  Tensor x = randn({2, 4});
  EXPECT_NE(a(x).to_vector(), b(x).to_vector());

  nn::StateDict sd = a.state_dict();
  EXPECT_EQ(names_of(sd), (std::vector<std::string>{"scale", "count", "fc.weight", "fc.bias",
                                                    "body.0.weight", "body.0.bias", "body.1.weight"}));
  for (const auto& [name, t] : sd) EXPECT_FALSE(t.requires_grad()) << name;
  b.load_state_dict(sd);
  EXPECT_EQ(a(x).to_vector(), b(x).to_vector());
  EXPECT_EQ(b.count.item(), 7);
  EXPECT_FALSE(b.fc->weight.is_same(a.fc->weight));  // values copied in, not handles swapped

  // The state dict shares storage with the module (as PyTorch's does): clone to snapshot.
  sd[0].second.fill_(3);
  EXPECT_EQ(a.scale.to_vector(), (std::vector<double>{3, 3, 3}));
}

TEST(Module, LoadStateDictErrorsNameTheKeyAndBothSides) {
  Net net;
  auto sd_with = [&](const std::string& key, Tensor value) {
    nn::StateDict sd = net.state_dict();
    for (auto& [name, t] : sd)
      if (name == key) t = value;
    return sd;
  };
  expect_error([&] { net.load_state_dict(sd_with("fc.weight", zeros({4, 3}))); },
               {"'fc.weight'", "shape [4, 3] in the state dict", "[3, 4] in the module"});
  expect_error([&] { net.load_state_dict(sd_with("fc.bias", zeros({3}, DType::f64))); },
               {"'fc.bias'", "dtype f64 in the state dict", "f32 in the module"});

  nn::StateDict missing = net.state_dict();
  missing.erase(missing.begin() + 2);  // fc.weight
  expect_error([&] { net.load_state_dict(missing); }, {"missing keys", "'fc.weight'"});

  nn::StateDict extra = net.state_dict();
  extra.emplace_back("fc.gain", zeros({3}));
  expect_error([&] { net.load_state_dict(extra); }, {"unexpected keys", "'fc.gain'"});

  nn::StateDict twice = net.state_dict();
  twice.push_back(twice[0]);
  expect_error([&] { net.load_state_dict(twice); }, {"'scale'", "appears twice"});

  // strict = false ignores missing and unexpected keys (PyTorch's rule) but never a bad shape.
  extra.erase(extra.begin() + 2);
  EXPECT_NO_THROW(net.load_state_dict(extra, /*strict=*/false));
  expect_error([&] { net.load_state_dict(sd_with("scale", zeros({2})), false); }, {"'scale'", "[2]"});
}

TEST(Module, AFailedLoadChangesNothing) {
  manual_seed(3);
  Net net;
  const std::vector<double> before = net.fc->bias.to_vector();
  nn::StateDict sd;
  for (const auto& [name, t] : net.state_dict()) sd.emplace_back(name, zeros(t.shape(), t.dtype()));
  sd.back().second = zeros({5});  // body.1.weight, the last key: checked after fc.bias
  EXPECT_THROW(net.load_state_dict(sd), Error);
  EXPECT_EQ(net.fc->bias.to_vector(), before);
}

TEST(Module, TrainEvalFlipsAFlagEverywhereAndNothingElse) {
  Net net;
  EXPECT_TRUE(net.is_training());
  sum(net(randn({2, 4}))).backward();
  const std::vector<double> g = net.fc->weight.grad().to_vector();
  net.eval();
  EXPECT_FALSE(net.is_training());
  EXPECT_FALSE(net.body->is_training());
  EXPECT_FALSE((*net.body)[1]->is_training());
  ASSERT_TRUE(net.fc->weight.grad().defined());  // flashlight's eval() clears them: we must not
  EXPECT_EQ(net.fc->weight.grad().to_vector(), g);
  net.train();
  EXPECT_TRUE((*net.body)[0]->is_training());
}

// An evaluation (or sampling) pass hands the model back in the mode it found it in: a model in
// eval mode, as `train eval` loads it, stays there, and an error on the way out restores the mode
// too. evaluate() used to switch every model to training mode at its end.
TEST(Module, AnEvaluationHandsTheModelBackInTheModeItFound) {
  Net net;
  try {
    nn::EvalModeGuard eval_mode(net);
    EXPECT_FALSE((*net.body)[1]->is_training());
    throw Error("a failed pass");
  } catch (const Error&) {
  }
  EXPECT_TRUE((*net.body)[1]->is_training());

  manual_seed(4);
  nn::Sequential model = small_model();
  const Tensor x = randn({4, 5}), y = from_vector(std::vector<int64_t>{0, 1, 2, 1}, {4});
  auto one_batch = [&](const train::BatchVisitor& visit) { visit({x, y}); };
  for (bool training : {false, true}) {
    model.train(training);
    train::evaluate(model, *train::classification(), one_batch, 4, DType::f32);
    EXPECT_EQ(model.is_training(), training);
    EXPECT_EQ(model[0]->is_training(), training);
  }
}

// Microbatch A, an evaluation pass, microbatch B: .grad holds exactly A + B.
TEST(Module, EvalBetweenMicrobatchesLeavesAccumulatedGradientsUntouched) {
  manual_seed(4);
  nn::Sequential model = small_model();
  model.to(DType::f64);
  Tensor xa = randn({4, 5}, DType::f64), xb = randn({3, 5}, DType::f64);
  Tensor ya = from_vector(std::vector<int64_t>{0, 1, 2, 1}, {4});
  Tensor yb = from_vector(std::vector<int64_t>{2, 0, 0}, {3});
  auto microbatch = [&](const Tensor& x, const Tensor& y) {
    cross_entropy(model(x), y, -100, /*normalizer=*/7).backward();
  };
  auto grads = [&] {
    std::vector<std::vector<double>> out;
    for (const Tensor& p : model.parameters()) out.push_back(p.grad().to_vector());
    return out;
  };

  microbatch(xa, ya);
  microbatch(xb, yb);
  const auto expected = grads();

  model.zero_grad();
  microbatch(xa, ya);
  model.eval();
  {
    NoGradGuard no_grad;
    model(randn({8, 5}, DType::f64));
  }
  model.train();
  microbatch(xb, yb);
  EXPECT_EQ(grads(), expected);
}

TEST(Module, ZeroGradSetsToNoneOrFillsZeros) {
  nn::Sequential model = small_model();
  sum(model(randn({2, 5}))).backward();
  model.zero_grad(/*set_to_none=*/false);
  for (const Tensor& p : model.parameters()) {
    ASSERT_TRUE(p.grad().defined());
    for (double v : p.grad().to_vector()) EXPECT_EQ(v, 0);
  }
  model.zero_grad();
  for (const Tensor& p : model.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Linear, PyTorchDefaultInitWithinBoundsAndSeeded) {
  manual_seed(5);
  nn::Linear a(100, 50);
  manual_seed(5);
  nn::Linear b(100, 50);
  EXPECT_EQ(a.weight.to_vector(), b.weight.to_vector());
  EXPECT_EQ(a.bias.to_vector(), b.bias.to_vector());
  EXPECT_EQ(a.weight.shape(), (Shape{50, 100}));
  EXPECT_EQ(a.weight.dtype(), DType::f32);

  const double bound = 1 / std::sqrt(100.0);  // kaiming_uniform(a = √5): 1/√in, same for the bias
  for (const Tensor& t : {a.weight, a.bias}) {
    const std::vector<double> v = t.to_vector();
    double lo = 1, hi = -1, sq = 0;
    for (double x : v) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      sq += x * x;
    }
    EXPECT_GE(lo, -bound);
    EXPECT_LE(hi, bound);
    // Spread over the whole range: U(-b, b) has std b/√3.
    EXPECT_LT(lo, -0.9 * bound);
    EXPECT_GT(hi, 0.9 * bound);
    if (v.size() > 1000) EXPECT_NEAR(std::sqrt(sq / double(v.size())), bound / std::sqrt(3.0), 0.05 * bound);
  }
  nn::Linear no_bias(3, 2, /*bias=*/false);
  EXPECT_FALSE(no_bias.bias.defined());
  EXPECT_EQ(names_of(no_bias.named_parameters()), (std::vector<std::string>{"weight"}));
}

TEST(Linear, ForwardIsXWtPlusB) {
  nn::Linear fc(2, 2);
  {
    NoGradGuard no_grad;  // parameters require grad: written only outside autograd, as in PyTorch
    fc.weight.copy_(from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}));
    fc.bias.copy_(from_vector(std::vector<double>{0.5, -1}, {2}));
  }
  EXPECT_EQ(fc(from_vector(std::vector<double>{1, 1}, {1, 2})).to_vector(), (std::vector<double>{3.5, 6}));
}

TEST(Module, ToDTypeIsInPlaceSoOptimizerHandlesStayValid) {
  manual_seed(6);
  nn::Sequential model = small_model();
  optim::SGD opt(model.parameters(), {.lr = 0.5});
  model.to(DType::f64);
  for (const Tensor& p : model.parameters()) EXPECT_EQ(p.dtype(), DType::f64);
  const Tensor w = model.parameters()[0];
  EXPECT_TRUE(opt.param_groups()[0].params[0].is_same(w));

  sum(model(randn({3, 5}, DType::f64))).backward();
  EXPECT_EQ(w.grad().dtype(), DType::f64);
  const std::vector<double> before = w.to_vector(), g = w.grad().to_vector();
  opt.step();
  const std::vector<double> after = w.to_vector();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_DOUBLE_EQ(after[i], before[i] - 0.5 * g[i]);

  // An existing .grad follows the parameter's dtype (f32 back from f64).
  model.to(DType::f32);
  EXPECT_EQ(w.dtype(), DType::f32);
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  expect_error([&] { model.to(DType::bf16); }, {"to(bf16)", "set_compute_dtype"});
}

TEST(Module, ToDeviceMovesParametersInPlace) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  nn::Sequential model = small_model();
  const Tensor w = model.parameters()[0];
  sum(model(randn({2, 5}))).backward();
  model.to(cuda_device(0));
  EXPECT_TRUE(model.parameters()[0].is_same(w));
  EXPECT_TRUE(w.device().is_cuda());
  EXPECT_TRUE(w.grad().device().is_cuda());
  model.to(kCPU);
  EXPECT_TRUE(w.device().is_cpu());
}

TEST(Module, ComputeDtypeGivesLinearWeightsADetachedCopy) {
  Net net;
  net.set_compute_dtype(DType::bf16);
  for (const Tensor& w : {net.fc->weight, std::dynamic_pointer_cast<nn::Linear>((*net.body)[0])->weight}) {
    const Tensor c = w.compute_copy();
    ASSERT_TRUE(c.defined());
    EXPECT_EQ(c.dtype(), DType::bf16);
    EXPECT_FALSE(c.requires_grad());
    EXPECT_EQ(c.to_vector(), w.to(DType::bf16).to_vector());
  }
  EXPECT_FALSE(net.scale.compute_copy().defined());  // only Linear weights feed GEMMs

  // Loading a checkpoint refreshes the copies from the new values.
  nn::StateDict sd;
  for (const auto& [name, t] : net.state_dict()) sd.emplace_back(name, full(t.shape(), 0.25, t.dtype()));
  net.load_state_dict(sd);
  for (double v : net.fc->weight.compute_copy().to_vector()) EXPECT_EQ(v, 0.25);

  net.set_compute_dtype(DType::f32);
  EXPECT_FALSE(net.fc->weight.compute_copy().defined());
  expect_error([&] { net.set_compute_dtype(DType::f64); }, {"set_compute_dtype(f64)", "to(DType::f64)"});
}

TEST(Sequential, BraceSyntaxNamesChildrenByIndex) {
  nn::Sequential model{nn::Linear(784, 256), nn::RMSNorm(256), nn::ScaledSiLU(), nn::Linear(256, 10)};
  ASSERT_EQ(model.size(), 4u);
  EXPECT_EQ(names_of(model.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "2.w", "3.weight", "3.bias"}));
  EXPECT_EQ(model(randn({2, 784})).shape(), (Shape{2, 10}));
  EXPECT_NE(std::dynamic_pointer_cast<nn::RMSNorm>(model[1]), nullptr);

  // push_back appends "4"; a shared_ptr is shared, not copied.
  auto head = std::make_shared<nn::Linear>(10, 2);
  model.push_back(head);
  EXPECT_EQ(model.named_children()[4].first, "4");
  EXPECT_EQ(model[4], head);
  EXPECT_EQ(model(randn({3, 784})).shape(), (Shape{3, 2}));
  expect_error([&] { model[5]; }, {"index 5", "5 modules"});
}

namespace {

// The values of a model's output and of every parameter's gradient after one backward of
// sum(output * R), R fixed.
std::vector<std::vector<double>> output_and_grads(nn::Sequential& model, const Tensor& x,
                                                  const Tensor& r) {
  model.zero_grad();
  Tensor y = model(x);
  sum(mul(y, r)).backward();
  std::vector<std::vector<double>> out{y.to_vector()};
  for (const Tensor& p : model.parameters()) out.push_back(p.grad().to_vector());
  return out;
}

struct MyNorm : nn::RMSNorm {  // a subclass: Sequential must run its own forward
  using nn::RMSNorm::RMSNorm;
  Tensor forward(const Tensor& x) override { return scale(nn::RMSNorm::forward(x), 2.0); }
};

}  // namespace

// RMSNorm → ScaledSiLU runs as the fused op, with the unfused pair's values and gradients (f64:
// the two differ only in rounding), and the same parameters.
TEST(Sequential, RunsRMSNormThenScaledSiLUAsOneFusedOp) {
  manual_seed(3);
  nn::Sequential model{nn::Linear(6, 9), nn::RMSNorm(9), nn::ScaledSiLU(), nn::Linear(9, 4)};
  model.to(DType::f64);
  for (const Tensor& p : model.parameters()) {  // away from the initial ones and zeros
    NoGradGuard no_grad;
    p.copy_(add(p, scale(randn(p.shape(), DType::f64), 0.3)));
  }
  const Tensor x = randn({5, 6}, DType::f64), r = randn({5, 4}, DType::f64);
  const auto fused = output_and_grads(model, x, r);
  model.fuse = false;
  const auto unfused = output_and_grads(model, x, r);
  EXPECT_LT(test::max_rel_diff(fused, unfused), 1e-12);

  nn::Sequential pair{nn::RMSNorm(9), nn::ScaledSiLU()};
  Tensor h = randn({2, 9});
  h.set_requires_grad();
  EXPECT_EQ(pair(h).grad_fn()->name(), "rms_norm_scaled_silu");
  pair.fuse = false;
  EXPECT_EQ(pair(h).grad_fn()->name(), "scaled_silu");
}

// A forward hook must see each layer's output, and a subclass keeps its own forward: neither is
// fused.
TEST(Sequential, AHookOrASubclassRunsTheLayersOneByOne) {
  nn::Sequential model{nn::RMSNorm(4), nn::ScaledSiLU()};
  std::vector<std::string> seen;
  {
    nn::ForwardHookGuard hook([&](const nn::Module& m, const Tensor&) { seen.push_back(m.repr()); });
    model(randn({2, 4}));
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"RMSNorm(4, eps=1e-05)", "ScaledSiLU()", "Sequential"}));

  nn::Sequential mine{MyNorm(4), nn::ScaledSiLU()};
  const Tensor x = randn({3, 4});
  const Tensor& g = std::static_pointer_cast<nn::RMSNorm>(mine[0])->weight;
  const Tensor& w = std::static_pointer_cast<nn::ScaledSiLU>(mine[1])->w;
  EXPECT_EQ(mine(x).to_vector(), scaled_silu(scale(rms_norm(x, g), 2.0), w).to_vector());
}

// What the fusion changes in bf16: h is not rounded between the two ops. Both paths against the
// f64 reference on the same rounded inputs: the fused one is at least as close (it rounds fewer
// times), and the two differ by about one bf16 rounding (2^-8 relative).
TEST(Sequential, FusedRoundingInBf16IsMeasuredAgainstF64) {
  manual_seed(11);
  const int64_t rows = 64, d = 256;
  Tensor x = randn({rows, d}).to(DType::bf16).set_requires_grad();
  const Tensor dy = randn({rows, d}).to(DType::bf16);
  Tensor g = add(randn({d}), full({d}, 1.0)).set_requires_grad();
  Tensor w = full({1}, 1.3).set_requires_grad();
  auto run = [&](bool fused, Tensor xi, Tensor gi, Tensor wi, const Tensor& dyi) {
    xi.zero_grad(), gi.zero_grad(), wi.zero_grad();
    Tensor y = fused ? rms_norm_scaled_silu(xi, gi, wi) : scaled_silu(rms_norm(xi, gi), wi);
    y.backward(dyi);
    return std::vector<std::vector<double>>{y.to_vector(), xi.grad().to_vector(),
                                            gi.grad().to_vector(), wi.grad().to_vector()};
  };
  Tensor x64 = x.detach().to(DType::f64).set_requires_grad();
  Tensor g64 = g.detach().to(DType::f64).set_requires_grad();
  Tensor w64 = w.detach().to(DType::f64).set_requires_grad();
  const auto ref = run(true, x64, g64, w64, dy.to(DType::f64));
  const auto fused = run(true, x, g, w, dy), unfused = run(false, x, g, w, dy);
  const double fused_err = test::max_rel_diff(fused, ref), unfused_err = test::max_rel_diff(unfused, ref);
  const double between = test::max_rel_diff(fused, unfused);
  std::printf("bf16 [%lld, %lld]: against f64, fused %.2e, unfused %.2e; fused vs unfused %.2e\n",
              (long long)rows, (long long)d, fused_err, unfused_err, between);
  EXPECT_LE(fused_err, unfused_err);
  EXPECT_LT(between, 2.0 / 256);
}

TEST(MLP, StructureNamesAndOptions) {
  nn::MLP mlp({8, 16, 16, 4});
  EXPECT_EQ(names_of(mlp.named_parameters()),
            (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.2.w",
                                      "layers.3.weight", "layers.3.bias", "layers.4.weight",
                                      "layers.5.w", "layers.6.weight", "layers.6.bias"}));
  EXPECT_EQ(mlp(randn({5, 8})).shape(), (Shape{5, 4}));

  nn::MLP plain({8, 16, 4}, "none", "relu", /*bias=*/false);
  ASSERT_EQ(plain.layers->size(), 3u);
  EXPECT_NE(std::dynamic_pointer_cast<nn::ReLU>((*plain.layers)[1]), nullptr);
  EXPECT_EQ(names_of(plain.named_parameters()),
            (std::vector<std::string>{"layers.0.weight", "layers.2.weight"}));

  expect_error([] { nn::MLP({8}); }, {"MLP", "at least"});
  expect_error([] { nn::MLP({8, 4}, "layer_norm"); }, {"'layer_norm'"});
  expect_error([] { nn::MLP({8, 4}, "none", "gelu"); }, {"'gelu'"});
}

// The whole MLP's gradient in f64 against finite differences: every module wires its op right.
TEST(MLP, GradientCheckInF64) {
  manual_seed(7);
  nn::MLP mlp({3, 4, 2});
  mlp.to(DType::f64);
  std::vector<Tensor> inputs = mlp.parameters();
  inputs.push_back(test::random_leaf({2, 3}));
  test::expect_gradcheck([&](const std::vector<Tensor>&) { return mlp(inputs.back()); }, inputs, "MLP");
}
