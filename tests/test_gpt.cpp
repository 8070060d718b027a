// The GPT model (nn/gpt.h) and its loss (train/lm_task.h): names, initialization, gradients by
// finite differences through the whole model (the tied weight included), and microbatches adding
// up to the full batch; dropout in training, the attention probabilities' included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>

#include "core/autograd.h"
#include "core/rng.h"
#include "nn/gpt.h"
#include "tests/expect_error.h"
#include "tests/gradcheck.h"
#include "train/lm_task.h"

using namespace mt;

namespace {

nn::GPTConfig tiny() {
  return {.n_layer = 2, .n_head = 2, .n_embd = 8, .block_size = 6, .vocab_size = 11,
          .padded_vocab_size = 16};
}

Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator g(seed);
  std::vector<int64_t> ids(size_t(B * T));
  for (auto& v : ids) v = int64_t(g.below(uint64_t(V)));
  return from_vector(ids, {B, T});
}

// GPT-2's init leaves every LayerNorm at gain 1 and bias 0 and the weights at std 0.02: attention
// nearly uniform, GELU nearly linear, the LayerNorms' parameters interchangeable, where a wrong
// term can hide. Every parameter drawn anew, of order one: std 0.3, LayerNorm gains about 1.
void randomize(nn::Module& model, uint64_t seed) {
  Generator g(seed);
  NoGradGuard no_grad;
  for (const auto& [name, p] : model.named_parameters()) {
    const bool gain = p.dim() == 1 && name.ends_with(".weight");
    std::vector<double> v(size_t(p.numel()));
    for (double& x : v) x = (gain ? 1.0 : 0.0) + 0.3 * g.normal();
    p.copy_(from_vector(v, p.shape(), DType::f64));
  }
}

TEST(Gpt, ParameterNamesAreNanoGptStateDictKeys) {
  manual_seed(0);
  nn::GPT model(tiny());
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
  std::vector<std::string> want = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    for (const char* n : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                          "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
                          "mlp.c_proj.bias"})
      want.push_back(h + n);
  }
  want.push_back("transformer.ln_f.weight");
  want.push_back("transformer.ln_f.bias");
  EXPECT_EQ(names, want);
  // 12·C² + 13·C per block, wte and wpe, the final LayerNorm: the count GPT-2's papers give.
  const int64_t C = 8;
  EXPECT_EQ(model.num_parameters(), 16 * C + 6 * C + 2 * (12 * C * C + 13 * C) + 2 * C);
  EXPECT_EQ(model.num_parameters(/*non_embedding=*/true), model.num_parameters() - 6 * C);
}

TEST(Gpt, InitializationIsGpt2s) {
  manual_seed(0);
  nn::GPTConfig c{.n_layer = 4, .n_head = 4, .n_embd = 64, .block_size = 32, .vocab_size = 100};
  nn::GPT model(c);
  EXPECT_EQ(c.padded_vocab(), 128);
  auto std_of = [](const Tensor& t) {
    double s = 0, s2 = 0;
    for (double v : t.to_vector()) s += v, s2 += v * v;
    const double n = double(t.numel());
    return std::sqrt(s2 / n - (s / n) * (s / n));
  };
  auto sd = model.state_dict();
  auto at = [&](const std::string& k) {
    for (auto& [n, t] : sd)
      if (n == k) return t;
    ADD_FAILURE() << "no " << k;
    return Tensor();
  };
  Tensor wte = at("transformer.wte.weight");
  EXPECT_NEAR(std_of(wte.slice_rows(0, 100)), 0.02, 0.002);
  for (double v : wte.slice_rows(100, 128).to_vector()) ASSERT_EQ(v, 0.0) << "a padded row";
  EXPECT_NEAR(std_of(at("transformer.h.0.attn.c_attn.weight")), 0.02, 0.001);
  const double residual = 0.02 / std::sqrt(8.0);
  EXPECT_NEAR(std_of(at("transformer.h.3.attn.c_proj.weight")), residual, 0.1 * residual);
  EXPECT_NEAR(std_of(at("transformer.h.1.mlp.c_proj.weight")), residual, 0.1 * residual);
  for (double v : at("transformer.h.2.mlp.c_fc.bias").to_vector()) ASSERT_EQ(v, 0.0);
  for (double v : at("transformer.ln_f.weight").to_vector()) ASSERT_EQ(v, 1.0);
}

TEST(Gpt, ForwardShapeAndBlockSize) {
  manual_seed(0);
  nn::GPT model(tiny());
  Tensor logits = model(random_ids(3, 6, 11, 1));
  EXPECT_EQ(logits.shape(), (Shape{3, 6, 16}));
  test::expect_error([&] { model(random_ids(1, 7, 11, 1)); }, {"block_size is 6"});
  test::expect_error([&] { model(random_ids(1, 3, 11, 1).to(DType::f32)); }, {"int64"});
  test::expect_error([&] { nn::GPT(nn::GPTConfig{.n_head = 5}); }, {"not divisible by n_head"});
}

// A causal model: the logits at position t depend on tokens 0..t only.
TEST(Gpt, IsCausal) {
  manual_seed(0);
  nn::GPT model(tiny());
  NoGradGuard no_grad;
  Tensor a = random_ids(1, 6, 11, 2);
  std::vector<double> ids = a.to_vector();
  ids[4] = double((int64_t(ids[4]) + 1) % 11);
  std::vector<int64_t> changed(ids.begin(), ids.end());
  std::vector<double> la = model(a).to_vector(), lb = model(from_vector(changed, {1, 6})).to_vector();
  for (size_t i = 0; i < la.size(); ++i) {
    const size_t t = i / 16;
    if (t < 4) EXPECT_EQ(la[i], lb[i]) << "position " << t << " saw a later token";
  }
  EXPECT_NE(la[4 * 16], lb[4 * 16]);
}

// Every parameter's gradient of the next-token loss, by central differences in f64, through the
// embeddings, both blocks, the final LayerNorm and the tied head, at random parameters.
TEST(Gpt, GradientsMatchFiniteDifferences) {
  manual_seed(3);
  nn::GPTConfig c = tiny();
  c.n_layer = 1;
  nn::GPT model(c);
  model.to(DType::f64);
  randomize(model, 7);
  Tensor ids = random_ids(2, 5, 11, 4), targets = random_ids(2, 5, 11, 5);
  std::vector<Tensor> params = model.parameters();
  test::expect_gradcheck(
      [&](const std::vector<Tensor>&) {
        return train::next_token_loss(model(ids), targets, c.vocab_size, 10.0).reshape({1});
      },
      params, "GPT", {.h = 1e-6, .atol = 1e-8, .rtol = 1e-6});
  // The padded rows of the tied table get no gradient: their logits are outside the loss.
  for (double v : params[0].grad().slice_rows(11, 16).to_vector()) ASSERT_EQ(v, 0.0);
}

// A step's microbatches run again, as the trainer's forensics replays a step that went non-finite,
// draw the masks they drew the first time: the task numbers a step's microbatches modulo their
// count. (The replay used to go on counting, drawing other masks than the failed step's.)
TEST(Gpt, AStepRunAgainDrawsItsMasksAgain) {
  manual_seed(2);
  nn::GPTConfig c = tiny();
  c.dropout = 0.3;
  nn::GPT model(c);
  int64_t step = 4;
  const auto task = train::language_modeling(
      c.vocab_size, 0, {.seed = 9, .step = [&] { return step; }, .first_microbatch = {},
                        .microbatches = [] { return int64_t(2); }});
  const data::Batch a{random_ids(2, 6, 11, 1), random_ids(2, 6, 11, 2)},
      b{random_ids(2, 6, 11, 3), random_ids(2, 6, 11, 4)};
  NoGradGuard no_grad;
  auto loss = [&](const data::Batch& x) { return task->loss(model, x, 1.0, nullptr).item(); };
  const double la = loss(a), lb = loss(b);
  EXPECT_EQ(loss(a), la);
  EXPECT_EQ(loss(b), lb);
  step = 5;  // another step's masks
  EXPECT_NE(loss(a), la);
}

// The trunk fuses each residual add into the LayerNorm after it (add_layer_norm) and runs each MLP
// as one gelu_mlp node; with a forward hook set it runs module by module instead, so the hook sees
// every output. In f32 on the CPU, at random parameters, the two give the same bits: the logits
// and every parameter's gradient.
TEST(Gpt, TheFusedResidualStreamEqualsTheModuleByModuleForward) {
  manual_seed(6);
  nn::GPT model(tiny());
  randomize(model, 8);
  Tensor ids = random_ids(2, 6, 11, 4), targets = random_ids(2, 6, 11, 5);
  // Counts the fused ops' forwards, to know which path ran.
  struct Counter : OpObserver {
    int fused = 0, mlp = 0;
    void begin(const char* op, bool backward) override {
      fused += !backward && std::string(op) == "add_layer_norm";
      mlp += !backward && std::string(op) == "gelu_mlp";
    }
    void end(const char*, bool) override {}
  } counter;
  auto run = [&](bool hooked) {
    model.zero_grad();
    int calls = 0;
    counter.fused = counter.mlp = 0;
    std::optional<nn::ForwardHookGuard> hook;
    if (hooked) hook.emplace([&](const nn::Module&, const Tensor&) { ++calls; });
    set_op_observer(&counter);
    Tensor logits = model(ids);
    set_op_observer(nullptr);
    train::next_token_loss(logits, targets, tiny().vocab_size, 12.0).backward();
    if (hooked) EXPECT_GT(calls, 0);
    // Fused: ln_2 of each block and the LayerNorm after each block (the next ln_1, or ln_f).
    EXPECT_EQ(counter.fused, hooked ? 0 : int(2 * tiny().n_layer));
    EXPECT_EQ(counter.mlp, hooked ? 0 : int(tiny().n_layer)) << "each block's MLP as one gelu_mlp";
    std::vector<std::vector<double>> out{logits.to_vector()};
    for (const Tensor& p : model.parameters()) out.push_back(p.grad().to_vector());
    return out;
  };
  const auto fused = run(false), plain = run(true);
  ASSERT_EQ(fused.size(), plain.size());
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_EQ(fused[i], plain[i]) << "tensor " << i;
}

// k microbatches, each divided by the step's whole target count, add up (+=) to the full batch's
// gradient, in f64 to within rounding.
TEST(Gpt, MicrobatchesAddUpToTheFullBatch) {
  manual_seed(5);
  nn::GPT model(tiny());
  model.to(DType::f64);
  const int64_t B = 7, T = 6;
  Tensor ids = random_ids(B, T, 11, 6), targets = random_ids(B, T, 11, 7);
  auto grads = [&](const std::vector<int64_t>& sizes) {
    model.zero_grad();
    int64_t begin = 0;
    for (int64_t n : sizes) {
      train::next_token_loss(model(ids.slice_rows(begin, begin + n)),
                             targets.slice_rows(begin, begin + n), 11, double(B * T))
          .backward();
      begin += n;
    }
    std::vector<std::vector<double>> g;
    for (const Tensor& p : model.parameters()) g.push_back(p.grad().to_vector());
    return g;
  };
  const auto full = grads({7});
  for (const auto& sizes : std::vector<std::vector<int64_t>>{{4, 3}, {1, 2, 4}, {1, 1, 1, 1, 1, 1, 1}}) {
    const auto split = grads(sizes);
    for (size_t p = 0; p < full.size(); ++p)
      for (size_t i = 0; i < full[p].size(); ++i)
        ASSERT_NEAR(split[p][i], full[p][i], 1e-13 + 1e-11 * std::abs(full[p][i]))
            << "parameter " << p << " element " << i << " with " << sizes.size() << " microbatches";
  }
}

// nanoGPT's `dropout` in all three places: in training each block's attention also drops
// probabilities (attn.attn_dropout's p and key, inside the fused op), every dropout has an offset
// of its own, the step repeats itself bitwise, and evaluation drops nothing. The model whose
// attention dropout alone is off (p = 0, same keys elsewhere) computes other logits and gradients.
TEST(Gpt, TrainingDropsAttentionProbabilitiesWithTheirOwnKey) {
  nn::GPTConfig c = tiny();
  c.dropout = 0.3;
  manual_seed(8);
  nn::GPT model(c);
  manual_seed(8);
  nn::GPT no_attn_dropout(c);
  for (const auto& [name, m] : no_attn_dropout.named_modules())
    if (name.ends_with("attn_dropout")) dynamic_cast<nn::Dropout&>(*m).p = 0;
  ASSERT_EQ(model.num_dropouts(), size_t(1 + 3 * c.n_layer));
  model.set_dropout_key(11, 3);
  no_attn_dropout.set_dropout_key(11, 3);
  std::set<uint64_t> offsets;
  int attn = 0;
  for (const auto& [name, m] : model.named_modules())
    if (auto* d = dynamic_cast<nn::Dropout*>(m.get())) {
      offsets.insert(d->offset);
      attn += name.ends_with("attn.attn_dropout");
      EXPECT_EQ(d->p, 0.3) << name;
    }
  EXPECT_EQ(offsets.size(), model.num_dropouts());
  EXPECT_EQ(attn, c.n_layer);

  const Tensor ids = random_ids(3, 6, 11, 9), targets = random_ids(3, 6, 11, 10);
  auto step = [&](nn::GPT& m) {
    m.zero_grad();
    Tensor loss = train::next_token_loss(m(ids), targets, c.vocab_size, 18.0);
    loss.backward();
    std::vector<std::vector<double>> out{loss.to_vector()};
    for (const Tensor& p : m.parameters()) out.push_back(p.grad().to_vector());
    return out;
  };
  model.train();
  no_attn_dropout.train();
  const auto a = step(model), b = step(no_attn_dropout);
  EXPECT_NE(a[0], b[0]) << "the loss does not see the attention's dropout";
  EXPECT_EQ(step(model), a) << "the same key must draw the same masks";
  model.set_dropout_key(11, 4);  // another call: other masks
  EXPECT_NE(step(model)[0], a[0]);
  model.eval();
  no_attn_dropout.eval();
  EXPECT_EQ(model(ids).to_vector(), no_attn_dropout(ids).to_vector());
}

// The gradient of the loss with every dropout on (fixed keys: fixed masks), by central
// differences in f64: the attention's dropout included.
TEST(Gpt, GradientsWithDropoutMatchFiniteDifferences) {
  manual_seed(12);
  nn::GPTConfig c = tiny();
  c.n_layer = 1;
  c.dropout = 0.3;
  nn::GPT model(c);
  model.to(DType::f64);
  model.set_dropout_key(2, 7);
  Tensor ids = random_ids(2, 5, 11, 13), targets = random_ids(2, 5, 11, 14);
  std::vector<Tensor> params = model.parameters();
  test::expect_gradcheck(
      [&](const std::vector<Tensor>&) {
        return train::next_token_loss(model(ids), targets, c.vocab_size, 10.0).reshape({1});
      },
      params, "GPT with dropout", {.h = 1e-6, .atol = 1e-8, .rtol = 1e-6});
}

}  // namespace
