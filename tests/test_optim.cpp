// optim: SGD and AdamW against independent f64 references, parameter groups and weight decay,
// skipped parameters, state_dict round trips, clip_grad_norm_ and the LR schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/autograd.h"
#include "core/rng.h"
#include "nn/modules.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "optim/sgd.h"
#include "tests/expect_error.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/graph.h"
#endif

using namespace mt;
using mt::test::expect_error;

namespace {

// ---- reference optimizers -----------------------------------------------------------------
// Written from the algorithm boxes in PyTorch's documentation of torch.optim.SGD and
// torch.optim.AdamW (dampening 0, maximize off, amsgrad off), in f64, one element at a time, and
// deliberately not from optim/*.cpp: they are where every expected value below comes from, apart
// from the hand-computed constants, which are worked out in the comments beside them.

struct RefSGD {
  double lr, momentum, weight_decay;
  bool nesterov;
  std::vector<double> b;
  int t = 0;
  void step(std::vector<double>& theta, const std::vector<double>& grad) {
    ++t;
    b.resize(theta.size());
    for (size_t i = 0; i < theta.size(); ++i) {
      double g = grad[i];
      if (weight_decay != 0) g = g + weight_decay * theta[i];
      if (momentum != 0) {
        b[i] = t > 1 ? momentum * b[i] + g : g;
        g = nesterov ? g + momentum * b[i] : b[i];
      }
      theta[i] = theta[i] - lr * g;
    }
  }
};

struct RefAdamW {
  double lr, beta1, beta2, eps, lambda;
  std::vector<double> m, v;
  int t = 0;
  void step(std::vector<double>& theta, const std::vector<double>& grad) {
    ++t;
    m.resize(theta.size());
    v.resize(theta.size());
    for (size_t i = 0; i < theta.size(); ++i) {
      theta[i] = theta[i] - lr * lambda * theta[i];
      m[i] = beta1 * m[i] + (1 - beta1) * grad[i];
      v[i] = beta2 * v[i] + (1 - beta2) * grad[i] * grad[i];
      const double m_hat = m[i] / (1 - std::pow(beta1, t));
      const double v_hat = v[i] / (1 - std::pow(beta2, t));
      theta[i] = theta[i] - lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

// Runs `steps` steps of `opt` over params (one gradient per step per parameter, drawn from a
// fixed generator) and of `ref_step` over plain copies; compares after every step.
template <class Ref>
void expect_matches_reference(optim::Optimizer& opt, const std::vector<Tensor>& params,
                              std::vector<Ref>& refs, int steps, double rtol) {
  Generator gen(42);
  std::vector<std::vector<double>> theta;
  for (const Tensor& p : params) theta.push_back(p.to_vector());
  for (int s = 0; s < steps; ++s) {
    for (size_t k = 0; k < params.size(); ++k) {
      std::vector<double> g(theta[k].size());
      for (double& x : g) x = gen.normal();
      Tensor p = params[k];
      p.set_grad(from_vector(g, p.shape(), p.dtype()));
      refs[k].step(theta[k], p.grad().to_vector());  // the reference sees the same (rounded) grad
    }
    opt.step();
    for (size_t k = 0; k < params.size(); ++k) {
      const std::vector<double> got = params[k].to_vector();
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], theta[k][i], rtol * std::max(1.0, std::abs(theta[k][i])))
            << "step " << s + 1 << " param " << k << " element " << i;
    }
  }
}

std::vector<Tensor> two_params(DType dtype) {
  manual_seed(11);
  Tensor a = randn({2, 3}, dtype), b = randn({4}, dtype);
  a.set_requires_grad();
  b.set_requires_grad();
  return {a, b};
}

}  // namespace

// ---- SGD ----------------------------------------------------------------------------------

TEST(SGD, MatchesTheReferenceForEveryOptionInF64AndF32) {
  struct Case { double momentum; bool nesterov; double wd; };
  for (Case c : {Case{0, false, 0}, Case{0.9, false, 0}, Case{0.9, true, 0}, Case{0, false, 0.1},
                 Case{0.8, true, 0.05}}) {
    for (DType dtype : {DType::f64, DType::f32}) {
      std::vector<Tensor> params = two_params(dtype);
      optim::SGD opt(params, {.lr = 0.1, .momentum = c.momentum, .nesterov = c.nesterov,
                              .weight_decay = c.wd});
      std::vector<RefSGD> refs(2, RefSGD{0.1, c.momentum, c.wd, c.nesterov, {}});
      SCOPED_TRACE(testing::Message() << "momentum " << c.momentum << " nesterov " << c.nesterov
                                      << " wd " << c.wd << " " << dtype_name(dtype));
      expect_matches_reference(opt, params, refs, 5, dtype == DType::f64 ? 1e-14 : 1e-6);
    }
  }
}

TEST(SGD, HandComputedMomentumAndNesterov) {
  // p = 1, g = 0.5 every step, lr = 0.1, momentum 0.9:
  //   plain:    b = 0.5, p = 0.95;  b = 0.9·0.5 + 0.5 = 0.95, p = 0.95 − 0.095 = 0.855
  //   nesterov: b = 0.5, d = 0.5 + 0.45 = 0.95, p = 0.905;  b = 0.95, d = 0.5 + 0.855 = 1.355,
  //             p = 0.905 − 0.1355 = 0.7695
  for (auto [nesterov, expected] : {std::pair{false, 0.855}, std::pair{true, 0.7695}}) {
    Tensor p = full({1}, 1.0, DType::f64);
    p.set_requires_grad();
    optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9, .nesterov = nesterov});
    for (int s = 0; s < 2; ++s) {
      p.set_grad(full({1}, 0.5, DType::f64));
      opt.step();
    }
    EXPECT_NEAR(p.item(), expected, 1e-15) << "nesterov " << nesterov;
  }
  expect_error([] { optim::SGD(std::vector<Tensor>{}, {.lr = 0.1, .nesterov = true}); }, {"nesterov", "momentum"});
}

// ---- AdamW --------------------------------------------------------------------------------

TEST(AdamW, MatchesTheReferenceInF64AndF32) {
  for (double wd : {0.0, 0.1}) {
    for (DType dtype : {DType::f64, DType::f32}) {
      std::vector<Tensor> params = two_params(dtype);
      optim::AdamW opt(params, {.lr = 0.01, .betas = {0.8, 0.95}, .eps = 1e-6, .weight_decay = wd});
      std::vector<RefAdamW> refs(2, RefAdamW{0.01, 0.8, 0.95, 1e-6, wd, {}, {}});
      SCOPED_TRACE(testing::Message() << "wd " << wd << " " << dtype_name(dtype));
      expect_matches_reference(opt, params, refs, 6, dtype == DType::f64 ? 1e-14 : 1e-6);
    }
  }
}

TEST(AdamW, HandComputedFirstStep) {
  // The first step's bias corrections cancel: m̂ = g, v̂ = g², so with p = 1, g = 0.5, lr = 0.1,
  // weight_decay = 0.1, eps = 1e-8:  p = 1·(1 − 0.01) − 0.1 · 0.5 / (0.5 + 1e-8) = 0.890000002.
  Tensor p = full({1}, 1.0, DType::f64);
  p.set_requires_grad();
  optim::AdamW opt({p}, {.lr = 0.1, .weight_decay = 0.1});
  p.set_grad(full({1}, 0.5, DType::f64));
  opt.step();
  EXPECT_NEAR(p.item(), 0.890000002, 1e-15);
  EXPECT_EQ(opt.steps_taken(), 1);
}

// The halves a CUDA graph needs (core/cuda/graph.h): prepare_step() on the host, apply_step()
// the update; together they are step(), bit for bit.
TEST(AdamW, PrepareThenApplyIsStep) {
  std::vector<Tensor> a = two_params(DType::f32), b = two_params(DType::f32);
  optim::AdamW opt_a(a, {.lr = 0.01, .weight_decay = 0.1}), opt_b(b, {.lr = 0.01, .weight_decay = 0.1});
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      const Tensor g = randn(a[i].shape());
      a[i].set_grad(g.clone());
      b[i].set_grad(g.clone());
    }
    opt_a.step();
    opt_b.prepare_step();
    opt_b.apply_step();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].to_vector(), b[i].to_vector()) << step;
  }
  EXPECT_EQ(opt_b.steps_taken(), 3);
  EXPECT_EQ(opt_a.state_dict().size(), opt_b.state_dict().size());
  EXPECT_TRUE(opt_b.capturable());
}

TEST(Optimizer, SgdHasNoCapturableHalves) {
  std::vector<Tensor> params = two_params(DType::f32);
  optim::SGD sgd(params, {.lr = 0.1});
  EXPECT_FALSE(sgd.capturable());
  expect_error([&] { sgd.prepare_step(); }, {"prepare_step", "AdamW"});
}

// ---- groups, decay, skipping ----------------------------------------------------------------

TEST(Optimizer, DecayGroupsSpareBiasesNormWeightsAndScalarGates) {
  nn::MLP mlp({4, 8, 3});
  const auto groups = optim::Optimizer::decay_groups(mlp, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].params.size(), 2u);  // layers.0.weight, layers.3.weight
  EXPECT_EQ(groups[1].params.size(), 4u);  // two biases, the RMSNorm weight, the ScaledSiLU w
  for (const Tensor& p : groups[0].params) EXPECT_EQ(p.dim(), 2);
  EXPECT_EQ(*groups[0].weight_decay, 0.1);
  EXPECT_EQ(*groups[1].weight_decay, 0.0);

  // With zero gradients AdamW's step is pure decay: (1 − lr·wd)·p on group 0, nothing on group 1.
  optim::AdamW opt(groups, {.lr = 0.5});
  EXPECT_EQ(*opt.param_groups()[1].lr, 0.5);  // an unset lr takes the options'
  std::vector<std::vector<double>> before;
  for (const Tensor& p : mlp.parameters()) {
    before.push_back(p.to_vector());
    Tensor(p).set_grad(zeros(p.shape()));
  }
  opt.step();
  const auto named = mlp.named_parameters();
  for (size_t k = 0; k < named.size(); ++k) {
    const bool decays = named[k].second.dim() >= 2;
    const std::vector<double> after = named[k].second.to_vector();
    for (size_t i = 0; i < after.size(); ++i)
      EXPECT_EQ(after[i], decays ? double(float(before[k][i]) * (1.0f - 0.5f * 0.1f)) : before[k][i])
          << named[k].first;
  }

  // A predicate chooses differently: here everything but biases decays.
  const auto custom = optim::Optimizer::decay_groups(
      mlp, 0.1, [](const std::string& name, const Tensor&) { return name.find("bias") == std::string::npos; });
  EXPECT_EQ(custom[0].params.size(), 4u);
  EXPECT_EQ(custom[1].params.size(), 2u);
}

TEST(Optimizer, GroupLearningRatesAndSetLr) {
  std::vector<Tensor> params = two_params(DType::f64);
  optim::SGD opt({{{params[0]}, 0.01, std::nullopt}, {{params[1]}, std::nullopt, std::nullopt}}, {.lr = 0.1});
  EXPECT_EQ(*opt.param_groups()[0].lr, 0.01);  // a group's own value wins
  EXPECT_EQ(*opt.param_groups()[1].lr, 0.1);
  opt.set_lr(0.3);
  for (const auto& g : opt.param_groups()) EXPECT_EQ(*g.lr, 0.3);
  expect_error([&] { optim::SGD({{params, std::nullopt, std::nullopt}, {{params[0]}, 0.1, 0.0}}, {}); },
               {"appears twice"});
}

TEST(Optimizer, ParametersWithoutGradAreSkippedAndKeepTheirOwnStepCount) {
  std::vector<Tensor> params = two_params(DType::f64);
  Tensor a = params[0], b = params[1];
  optim::AdamW opt(params, {.lr = 0.1});
  const std::vector<double> b0 = b.to_vector();
  a.set_grad(ones(a.shape(), DType::f64));
  opt.step();
  EXPECT_EQ(b.to_vector(), b0);  // untouched: not even weight decay
  for (const auto& [key, t] : opt.state_dict())  // b's count is there, 0, and it has no buffers
    if (key.starts_with("state.1.")) {
      EXPECT_EQ(key, "state.1.step");
      EXPECT_EQ(t.to_vector(), std::vector<double>{0});
    }

  // b's first update is a first step (t = 1) even though the optimizer has taken one already.
  std::vector<double> theta = b0, g(b0.size(), -2.0);
  RefAdamW ref{0.1, 0.9, 0.999, 1e-8, 1e-2, {}, {}};
  ref.step(theta, g);
  a.zero_grad();
  b.set_grad(full(b.shape(), -2.0, DType::f64));
  opt.step();
  const std::vector<double> got = b.to_vector();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], theta[i], 1e-15);

  optim::SGD sgd(params, {.lr = 0.1, .momentum = 0.9});
  const std::vector<double> a0 = a.to_vector();
  sgd.step();
  EXPECT_EQ(a.to_vector(), a0);
}

TEST(Optimizer, StepRefreshesComputeCopies) {
  manual_seed(12);
  for (bool adamw : {true, false}) {
    nn::Linear fc(4, 3);
    fc.set_compute_dtype(DType::bf16);
    std::unique_ptr<optim::Optimizer> opt;
    if (adamw) opt = std::make_unique<optim::AdamW>(fc.parameters(), optim::AdamWOptions{.lr = 0.1});
    else opt = std::make_unique<optim::SGD>(fc.parameters(), optim::SGDOptions{.lr = 0.1});
    fc.weight.set_grad(ones(fc.weight.shape()));
    const std::vector<double> stale = fc.weight.compute_copy().to_vector();
    opt->step();
    EXPECT_NE(fc.weight.compute_copy().to_vector(), stale);
    EXPECT_EQ(fc.weight.compute_copy().to_vector(), fc.weight.to(DType::bf16).to_vector());
  }
}

// ---- checkpoints ---------------------------------------------------------------------------

namespace {

nn::StateDict cloned(const nn::StateDict& sd) {
  nn::StateDict out;
  for (const auto& [k, t] : sd) out.emplace_back(k, t.clone());
  return out;
}

// A few training steps of a small model on fixed data; returns every parameter value after.
std::vector<std::vector<double>> train(nn::Module& model, optim::Optimizer& opt, int steps) {
  Generator gen(5);
  std::vector<double> xs(8 * 3);
  for (double& v : xs) v = gen.normal();
  const Tensor x = from_vector(xs, {8, 3});
  const Tensor y = from_vector(std::vector<int64_t>{0, 1, 1, 0, 1, 0, 0, 1}, {8});
  for (int s = 0; s < steps; ++s) {
    cross_entropy(model(x), y).backward();
    opt.step();
    opt.zero_grad();
  }
  std::vector<std::vector<double>> out;
  for (const Tensor& p : model.parameters()) out.push_back(p.to_vector());
  return out;
}

nn::Sequential tiny(uint64_t seed) {
  manual_seed(seed);
  return nn::Sequential{nn::Linear(3, 4), nn::ScaledSiLU(), nn::Linear(4, 2)};
}

}  // namespace

TEST(Optimizer, StateDictRoundTripContinuesIdentically) {
  for (bool adamw : {true, false}) {
    auto make = [&](nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
      if (adamw) return std::make_unique<optim::AdamW>(optim::Optimizer::decay_groups(m, 0.1),
                                                       optim::AdamWOptions{.lr = 0.05});
      return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    };
    nn::Sequential a = tiny(1);
    auto opt_a = make(a);
    train(a, *opt_a, 3);
    const nn::StateDict model_sd = cloned(a.state_dict()), opt_sd = cloned(opt_a->state_dict());
    const auto expected = train(a, *opt_a, 2);

    nn::Sequential b = tiny(2);  // different initial values, overwritten by the load
    auto opt_b = make(b);
    b.load_state_dict(model_sd);
    opt_b->load_state_dict(opt_sd);
    EXPECT_EQ(opt_b->steps_taken(), 3);
    EXPECT_EQ(train(b, *opt_b, 2), expected) << (adamw ? "AdamW" : "SGD");  // bit for bit
  }
}

TEST(Optimizer, StateDictKeysAndLoadErrors) {
  nn::Sequential model = tiny(3);
  optim::AdamW opt(model.parameters(), {});
  train(model, opt, 1);
  const nn::StateDict sd = opt.state_dict();
  std::vector<std::string> keys;
  for (const auto& entry : sd) keys.push_back(entry.first);
  ASSERT_GE(keys.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + 4),
            (std::vector<std::string>{"step", "state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq"}));
  EXPECT_EQ(sd[2].second.dtype(), DType::f32);

  auto with = [&](const std::string& key, Tensor t) {
    nn::StateDict out = sd;
    out.emplace_back(key, t);
    return out;
  };
  expect_error([&] { opt.load_state_dict(with("state.9.exp_avg", zeros({1}))); },
               {"'state.9.exp_avg'", "parameter 9", "has 5"});
  expect_error([&] { opt.load_state_dict(with("state.0.momentum_buffer", zeros({4, 3}))); },
               {"'state.0.momentum_buffer'", "no 'momentum_buffer'"});
  expect_error([&] { opt.load_state_dict(with("state.0.exp_avg", zeros({3, 4}))); },
               {"'state.0.exp_avg'", "[3, 4] f32", "[4, 3] f32"});
  expect_error([&] { opt.load_state_dict(with("lr", zeros({}))); }, {"unexpected key 'lr'"});
  expect_error([&] { opt.load_state_dict(with("state.x.exp_avg", zeros({}))); }, {"'state.x.exp_avg'"});
  expect_error([&] { opt.load_state_dict(nn::StateDict(sd.begin() + 1, sd.end())); }, {"no 'step'"});
}

// ---- clipping -------------------------------------------------------------------------------

TEST(ClipGradNorm, ThreeFourFive) {
  Tensor a = zeros({1}), b = zeros({1}), no_grad = zeros({2});
  for (Tensor* t : {&a, &b, &no_grad}) t->set_requires_grad();
  a.set_grad(full({1}, 3.0));
  b.set_grad(full({1}, 4.0));
  Tensor norm = optim::clip_grad_norm_({a, b, no_grad}, 1.0);
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_EQ(norm.dtype(), DType::f32);
  EXPECT_FLOAT_EQ(norm.item(), 5.0f);
  // PyTorch's factor: max_norm / (norm + 1e-6).
  EXPECT_FLOAT_EQ(a.grad().item(), float(3.0 / (5.0 + 1e-6)));
  EXPECT_FLOAT_EQ(b.grad().item(), float(4.0 / (5.0 + 1e-6)));
  EXPECT_NEAR(a.grad().item(), 0.6, 1e-6);
  EXPECT_NEAR(b.grad().item(), 0.8, 1e-6);
  EXPECT_FALSE(no_grad.grad().defined());

  // Below the limit nothing changes; f64 gradients give an f64 norm.
  Tensor c = zeros({2}, DType::f64);
  c.set_requires_grad();
  c.set_grad(from_vector(std::vector<double>{0.3, 0.4}, {2}, DType::f64));
  Tensor n = optim::clip_grad_norm_({c}, 1.0);
  EXPECT_EQ(n.dtype(), DType::f64);
  EXPECT_DOUBLE_EQ(n.item(), 0.5);
  EXPECT_EQ(c.grad().to_vector(), (std::vector<double>{0.3, 0.4}));
  EXPECT_EQ(optim::clip_grad_norm_({no_grad}, 1.0).item(), 0);
}

namespace {

// Gradients for `params` on `device` in their dtype: random, never zero (|g| in [0.25, ~2]).
void set_random_grads(const std::vector<Tensor>& params, Generator& gen, Device device) {
  for (const Tensor& p : params) {
    std::vector<double> g(size_t(p.numel()));
    for (double& x : g) x = (gen.normal() < 0 ? -1 : 1) * (0.25 + std::abs(gen.normal()));
    Tensor(p).set_grad(from_vector(g, p.shape(), p.dtype(), device));
  }
}

// Three parameters (two groups, one without decay) of `dtype` on `device`, seeded.
std::vector<Tensor> three_params(DType dtype, Device device) {
  manual_seed(21);
  std::vector<Tensor> out{randn({3, 5}, dtype).to(device), randn({7}, dtype).to(device),
                          randn({2, 2}, dtype).to(device)};
  for (Tensor& p : out) p.set_requires_grad();
  return out;
}

optim::AdamW adamw_of(const std::vector<Tensor>& p) {
  return optim::AdamW({{{p[0], p[1]}, std::nullopt, std::nullopt}, {{p[2]}, std::nullopt, 0.0}},
                      optim::AdamWOptions{.lr = 0.05, .weight_decay = 0.1});
}

// AdamW with the clip factor folded in (set_grad_scale, from grad_norm_and_clip_factor) against
// clip_grad_norm_ then step(), over 3 steps of the same random gradients: the norm, the
// parameters, m and v are the same bits, and the folded step leaves .grad as it was.
void expect_folded_clip_is_clip_then_step(DType dtype, Device device, double max_norm, bool clips) {
  const std::string what = std::string(dtype_name(dtype)) + " on " + device.str() + ", max_norm " +
                           std::to_string(max_norm);
  const std::vector<Tensor> pa = three_params(dtype, device), pb = three_params(dtype, device);
  optim::AdamW a = adamw_of(pa), b = adamw_of(pb);
  const DType scalar = device.is_cpu() ? DType::f64 : DType::f32;
  const Tensor norm = zeros({}, device.is_cpu() ? dtype : DType::f32, device);
  const Tensor factor = zeros({}, scalar, device);
  b.set_grad_scale(factor);
  Generator ga(7), gb(7);
  for (int s = 0; s < 3; ++s) {
    set_random_grads(pa, ga, device);
    set_random_grads(pb, gb, device);
    std::vector<std::vector<double>> grads;
    for (const Tensor& p : pb) grads.push_back(p.grad().to_vector());
    const double clipped_norm = optim::clip_grad_norm_(pa, max_norm).item();
    optim::grad_norm_and_clip_factor(pb, max_norm, norm, factor);
    EXPECT_EQ(norm.item(), clipped_norm) << what << ", step " << s;
    if (clips) EXPECT_LT(factor.item(), 1.0) << what;
    else EXPECT_EQ(factor.item(), 1.0) << what;
    a.step();
    b.step();
    for (size_t k = 0; k < pb.size(); ++k) {
      EXPECT_EQ(pb[k].to_vector(), pa[k].to_vector()) << what << ", step " << s << ", param " << k;
      EXPECT_EQ(pb[k].grad().to_vector(), grads[k]) << what << ": .grad changed, param " << k;
    }
    const nn::StateDict sa = a.state_dict(), sb = b.state_dict();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sb[i].first, sa[i].first);
      EXPECT_EQ(sb[i].second.to_vector(), sa[i].second.to_vector())
          << what << ", step " << s << ", " << sa[i].first;
    }
  }
}

}  // namespace

TEST(ClipGradNorm, FoldedIntoAdamWIsClipThenStepBitwise) {
  for (DType dt : {DType::f32, DType::f64}) {
    expect_folded_clip_is_clip_then_step(dt, kCPU, 0.5, /*clips=*/true);
    expect_folded_clip_is_clip_then_step(dt, kCPU, 1e9, /*clips=*/false);
  }
}

TEST(ClipGradNorm, NormAndFactorWithoutTouchingTheGradients) {
  Tensor a = zeros({1}), b = zeros({1}), no_grad = zeros({2});
  for (Tensor* t : {&a, &b, &no_grad}) t->set_requires_grad();
  a.set_grad(full({1}, 3.0));
  b.set_grad(full({1}, 4.0));
  const Tensor norm = zeros({}), factor = zeros({}, DType::f64);
  optim::grad_norm_and_clip_factor({a, b, no_grad}, 1.0, norm, factor);
  EXPECT_FLOAT_EQ(norm.item(), 5.0f);
  EXPECT_EQ(factor.item(), 1.0 / (5.0 + 1e-6));  // in double: what clip_grad_norm_ scales by
  EXPECT_EQ(a.grad().item(), 3.0);
  EXPECT_EQ(b.grad().item(), 4.0);
  optim::grad_norm_and_clip_factor({a, b}, INFINITY, norm, factor);  // the norm alone
  EXPECT_EQ(factor.item(), 1.0);
  optim::grad_norm_and_clip_factor({no_grad}, 1.0, norm, factor);
  EXPECT_EQ(norm.item(), 0.0);
  EXPECT_EQ(factor.item(), 1.0);
  expect_error([&] { optim::grad_norm_and_clip_factor({a}, 1.0, norm, zeros({})); },
               {"factor_out f64", "got f32 and f32"});
  expect_error([&] { optim::grad_norm_and_clip_factor({a}, 0.0, norm, factor); }, {"max_norm"});
}

// ---- schedules ------------------------------------------------------------------------------

TEST(Schedule, WarmupCosineAtItsBoundaries) {
  optim::WarmupCosineLR s(/*max_lr=*/1.0, /*warmup=*/10, /*total=*/110, /*min_lr=*/0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);   // (0 + 1) / 10 of max: the first step is not wasted
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);   // warmup − 1: warmup complete
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);  // warmup: cosine at its start
  EXPECT_DOUBLE_EQ(s.lr_at(60), 0.55); // halfway: min + (max − min) / 2
  EXPECT_NEAR(s.lr_at(109), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 99 / 100)), 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.1); // total
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 0.1);  // beyond: stays at the floor

  optim::WarmupCosineLR no_warmup(2.0, 0, 4);
  EXPECT_DOUBLE_EQ(no_warmup.lr_at(0), 2.0);
  EXPECT_DOUBLE_EQ(no_warmup.lr_at(2), 1.0);
  EXPECT_DOUBLE_EQ(no_warmup.lr_at(4), 0.0);

  EXPECT_EQ(optim::ConstantLR(0.3).lr_at(12345), 0.3);
  expect_error([] { optim::WarmupCosineLR(1.0, 10, 5); }, {"warmup_steps", "10", "5"});
  expect_error([] { optim::WarmupCosineLR(1.0, 0, 5, 2.0); }, {"min_lr"});
}

// ---- CUDA against the CPU reference (skipped without a GPU) ---------------------------------

// zero_grad(set_to_none = false) zeroes every fp32 CUDA gradient in one launch: each stays
// allocated (a CUDA graph adds into it), becomes all zeros, and its version moves on; a gradient
// longer than one chunk and one of 3 elements are both covered.
TEST(OptimCUDA, ZeroGradKeepingTheGradientsZeroesEveryOne) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  const Device dev = cuda_device(0);
  std::vector<Tensor> params{zeros({40000}, DType::f32, dev), zeros({3}, DType::f32, dev),
                             zeros({7, 5}, DType::f32, dev)};
  Generator gen(5);
  std::vector<uint64_t> versions;
  for (Tensor& p : params) {
    p.set_requires_grad();
    std::vector<double> g(size_t(p.numel()));
    for (double& x : g) x = 1 + gen.normal() * gen.normal();
    p.set_grad(from_vector(g, p.shape(), DType::f32, dev));
    versions.push_back(p.grad().version());
  }
  optim::SGD sgd(params, optim::SGDOptions{.lr = 0.1});
  sgd.zero_grad(/*set_to_none=*/false);
  for (size_t k = 0; k < params.size(); ++k) {
    ASSERT_TRUE(params[k].grad().defined()) << "param " << k;
    EXPECT_EQ(params[k].grad().to_vector(), std::vector<double>(size_t(params[k].numel()), 0.0))
        << "param " << k;
    EXPECT_GT(params[k].grad().version(), versions[k]) << "param " << k;
  }
}

TEST(OptimCUDA, FusedAdamWSGDAndClippingMatchTheCPU) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  for (int which = 0; which < 2; ++which) {
    nn::Sequential cpu = tiny(8), gpu = tiny(8);
    gpu.to(cuda_device(0));
    gpu.set_compute_dtype(DType::bf16);
    auto make = [&](nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
      if (which == 0) return std::make_unique<optim::AdamW>(optim::Optimizer::decay_groups(m, 0.1),
                                                            optim::AdamWOptions{.lr = 0.05});
      return std::make_unique<optim::SGD>(m.parameters(),
                                          optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true,
                                                            .weight_decay = 0.01});
    };
    auto opt_cpu = make(cpu), opt_gpu = make(gpu);
    Generator gen(9);
    for (int s = 0; s < 3; ++s) {
      const auto pc = cpu.parameters(), pg = gpu.parameters();
      for (size_t k = 0; k < pc.size(); ++k) {
        std::vector<double> g(size_t(pc[k].numel()));
        for (double& x : g) x = 3 * gen.normal();
        Tensor(pc[k]).set_grad(from_vector(g, pc[k].shape()));
        Tensor(pg[k]).set_grad(from_vector(g, pc[k].shape(), DType::f32, cuda_device(0)));
      }
      const double norm_cpu = optim::clip_grad_norm_(pc, 1.0).item();
      const double norm_gpu = optim::clip_grad_norm_(pg, 1.0).item();
      EXPECT_NEAR(norm_gpu, norm_cpu, 1e-5 * norm_cpu);
      ASSERT_GT(norm_cpu, 1.0);  // so every gradient was scaled (one launch for all of them)
      for (size_t k = 0; k < pc.size(); ++k) {
        const std::vector<double> want = pc[k].grad().to_vector(), got = pg[k].grad().to_vector();
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i])))
              << "clipped grad, step " << s << " param " << k;
      }
      opt_cpu->step();
      opt_gpu->step();
      for (size_t k = 0; k < pc.size(); ++k) {
        const std::vector<double> want = pc[k].to_vector(), got = pg[k].to_vector();
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i])))
              << (which == 0 ? "AdamW" : "SGD") << " step " << s << " param " << k;
        if (pg[k].compute_copy().defined())  // rewritten in the same pass as the fp32 update
          EXPECT_EQ(pg[k].compute_copy().to_vector(), pg[k].to(DType::bf16).to_vector());
      }
    }
  }
}

TEST(OptimCUDA, FoldedClipIsClipThenStepBitwise) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  expect_folded_clip_is_clip_then_step(DType::f32, cuda_device(0), 0.5, /*clips=*/true);
  expect_folded_clip_is_clip_then_step(DType::f32, cuda_device(0), 1e9, /*clips=*/false);
}

// Parameters with and without a bf16 compute copy, updated by one launch (counted as the nodes of
// a CUDA graph of apply_step), with the clip factor folded in: the fp32 update matches the CPU's
// and each copy is its parameter rounded to bf16.
TEST(OptimCUDA, AdamWWithAndWithoutComputeCopiesIsOneLaunch) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
#ifdef MT_WITH_CUDA
  const Device dev = cuda_device(0);
  const std::vector<Tensor> pc = three_params(DType::f32, kCPU), pg = three_params(DType::f32, dev);
  pg[0].set_compute_copy(pg[0].to(DType::bf16));
  pg[2].set_compute_copy(pg[2].to(DType::bf16));
  optim::AdamW cpu = adamw_of(pc), gpu = adamw_of(pg);
  const Tensor norm_c = zeros({}), factor_c = zeros({}, DType::f64);
  const Tensor norm_g = zeros({}, DType::f32, dev), factor_g = zeros({}, DType::f32, dev);
  cpu.set_grad_scale(factor_c);
  gpu.set_grad_scale(factor_g);
  Generator gc(3), gg(3);
  for (int s = 0; s < 3; ++s) {
    set_random_grads(pc, gc, kCPU);
    set_random_grads(pg, gg, dev);
    optim::grad_norm_and_clip_factor(pc, 0.5, norm_c, factor_c);
    optim::grad_norm_and_clip_factor(pg, 0.5, norm_g, factor_g);
    ASSERT_LT(factor_c.item(), 1.0);
    cpu.step();
    if (s == 0) {
      gpu.step();
    } else {
      gpu.prepare_step();
      const cuda::Graph graph = cuda::Graph::capture(dev.index, [&] { gpu.apply_step(); });
      EXPECT_EQ(graph.num_nodes(), 1u) << graph.node_kinds();
      graph.replay();
    }
    for (size_t k = 0; k < pc.size(); ++k) {
      const std::vector<double> want = pc[k].to_vector(), got = pg[k].to_vector();
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-6 * std::max(1.0, std::abs(want[i])))
            << "step " << s << " param " << k << " element " << i;
      if (k != 1) EXPECT_EQ(pg[k].compute_copy().to_vector(), pg[k].to(DType::bf16).to_vector());
    }
    EXPECT_FALSE(pg[1].compute_copy().defined());
  }
#endif
}
