// Mixed precision on the CPU: the loss scaler's rule (overflow, growth, floor, exact unscaling),
// f16 training runs that overflow and recover and resume bitwise, 16-bit ops that compute in fp32
// and round once, and trap 4: a bf16 running sum that stops growing.
#include <gtest/gtest.h>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "app/config.h"
#include "app/config_trainer.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "nn/modules.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/elementwise/elementwise.h"
#include "ops/linear/linear.h"
#include "ops/rms_norm/rms_norm.h"
#include "ops/rms_norm/rms_norm_scaled_silu.h"
#include "ops/scaled_silu/scaled_silu.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "tests/expect_error.h"
#include "tests/f64_reference.h"
#include "tests/log_capture.h"
#include "tests/temp_dir.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

using namespace mt;
using mt::test::TempDir;
using mt::test::expect_error;
using mt::test::expect_near_reference;
using mt::test::unit_roundoff;
using optim::LossScaleMode;
using optim::LossScaler;
namespace fs = std::filesystem;

namespace {

std::vector<std::vector<double>> values_of(const std::vector<Tensor>& ts) {
  std::vector<std::vector<double>> out;
  for (const Tensor& t : ts) out.push_back(t.to_vector());
  return out;
}

bool all_finite(const std::vector<std::vector<double>>& vs) {
  for (const auto& v : vs)
    for (double x : v)
      if (!std::isfinite(x)) return false;
  return true;
}

// A small classifier and one microbatch for it, in `dt` compute (f32 parameters).
struct Problem {
  std::shared_ptr<nn::MLP> model;
  Tensor x, y;
  Problem(DType dt, uint64_t seed) {
    manual_seed(seed);
    model = std::make_shared<nn::MLP>(std::vector<int64_t>{12, 16, 16, 4});
    model->set_compute_dtype(dt);
    x = randn({24, 12}).to(dt);
    y = from_vector(std::vector<int64_t>(24, 0), {24});
    for (int64_t i = 0; i < 24; ++i) y.data<int64_t>()[i] = i % 4;
  }
  Tensor loss() { return cross_entropy((*model)(x), y); }
};

// A small f16 run (the sizes of tests/test_trainer.cpp) whose dynamic scale starts at 2^30, far
// above what its f16 activation gradients survive, so the first steps overflow; growth_interval 5
// so the scale also grows back within the run.
Config f16_config(const TempDir& dir, int64_t steps = 24) {
  return load_config("", {"model.input=12", "model.hidden=[16]", "model.classes=4",
                          "data.samples=600", "optim.steps=" + std::to_string(steps),
                          "optim.batch_size=48", "optim.warmup_steps=4", "optim.microbatches=2",
                          "eval.every=12", "logging.every=6", "checkpoint.every=12",
                          "checkpoint.keep_last=5", "checkpoint.dir=" + (dir / "ckpt"),
                          "precision.compute_dtype=f16", "precision.initial_scale=1073741824",
                          "precision.growth_interval=5", "device=cpu"});
}

}  // namespace

// ---- the scaler ---------------------------------------------------------------------------

TEST(LossScaler, SeedIsTheScaleShapedLikeTheLoss) {
  LossScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0);
  Problem p(DType::f16, 1);
  Tensor loss = p.loss();
  Tensor seed = scaler.seed_for(loss);
  EXPECT_EQ(seed.shape(), Shape{});
  EXPECT_EQ(seed.dtype(), loss.dtype());
  EXPECT_EQ(seed.device(), loss.device());
  EXPECT_EQ(seed.item(), 65536.0);
  EXPECT_FALSE(LossScaler({LossScaleMode::none}).seed_for(loss).defined());  // backward's ones
}

TEST(LossScaler, OverflowHalvesTheScaleSkipsTheStepAndLeavesParametersUntouched) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    Problem p(DType::f16, 2);
    const auto params = p.model->parameters();
    optim::AdamW opt(params, {});
    LossScaler scaler;
    Tensor loss = p.loss();
    loss.backward(scaler.seed_for(loss));
    params[2].grad().data<float>()[0] = bad;  // one overflowed element anywhere is enough
    const auto before = values_of(params);

    ASSERT_TRUE(scaler.unscale_and_check(params)) << bad;
    ASSERT_TRUE(scaler.update(true));  // the trainer's pattern: skip, but zero the gradients
    opt.zero_grad();
    EXPECT_EQ(scaler.scale(), 32768.0);
    EXPECT_EQ(scaler.skipped_steps(), 1);
    EXPECT_EQ(opt.steps_taken(), 0);
    EXPECT_EQ(values_of(params), before);
    EXPECT_TRUE(all_finite(values_of(params)));
    for (const Tensor& q : params) EXPECT_FALSE(q.grad().defined());
  }
}

TEST(LossScaler, GrowsAfterGrowthIntervalCleanStepsAndAnOverflowRestartsTheCount) {
  LossScaler scaler({LossScaleMode::dynamic, 1024, 3});
  EXPECT_FALSE(scaler.update(false));
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.growth_tracker(), 2);
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_TRUE(scaler.update(true));  // the third step overflows: no growth, halve instead
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
}

TEST(LossScaler, ScaleNeverDropsBelowOneAndEveryOverflowIsSkipped) {
  LossScaler scaler({LossScaleMode::dynamic, 4, 100});
  std::vector<double> scales;
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(scaler.update(true));
    scales.push_back(scaler.scale());
  }
  EXPECT_EQ(scales, (std::vector<double>{2, 1, 1, 1}));
  EXPECT_EQ(scaler.skipped_steps(), 4);
}

TEST(LossScaler, FixedNeverMovesAndNoneDoesNothing) {
  LossScaler fixed({LossScaleMode::fixed, 128, 2});
  EXPECT_TRUE(fixed.update(true));  // an overflow is still skipped...
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(fixed.update(false));
  EXPECT_EQ(fixed.scale(), 128.0);  // ...but the scale stays
  EXPECT_EQ(fixed.skipped_steps(), 1);

  LossScaler none({LossScaleMode::none});
  EXPECT_EQ(none.scale(), 1.0);
  Tensor w = ones({3}).set_requires_grad();
  w.set_grad(from_vector(std::vector<double>{1, INFINITY, 3}, {3}));
  EXPECT_FALSE(none.unscale_and_check({w}));  // not looked at: bf16 and f32 need no check
  EXPECT_FALSE(none.update(true));
  EXPECT_EQ(w.grad().to_vector()[0], 1.0);
  EXPECT_TRUE(none.state_dict().empty());
}

// A power-of-two scale changes only exponents: seeding backward with 2^16 and unscaling gives
// the unscaled backward's gradients bit for bit (f32, where nothing overflows or underflows).
TEST(LossScaler, UnscalingAPowerOfTwoIsExact) {
  Problem plain(DType::f32, 3), scaled(DType::f32, 3);
  plain.loss().backward();
  LossScaler scaler;
  Tensor loss = scaled.loss();
  loss.backward(scaler.seed_for(loss));
  const auto params = scaled.model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_NE(params[i].grad().to_vector(), plain.model->parameters()[i].grad().to_vector());
  EXPECT_FALSE(scaler.unscale_and_check(params));
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(params[i].grad().to_vector(), plain.model->parameters()[i].grad().to_vector()) << i;
}

// Why f16 needs the scaler: gradients below half f16's smallest subnormal (2^-25 ≈ 3e-8) flush to
// zero in the 16-bit dlogits. Here the loss is normalized by 2^22 (a 4M-token step of a language
// model) over 16 near-uniform classes, so dlogits = (softmax − onehot) / 2^22 is about 1.5e-8
// off the target and −2.2e-7 on it. Measured (‖g − g_f64‖ / ‖g_f64‖ for the f32 weight
// gradient): 0.30 without scaling, 2.2e-4 with a scale of 2^16 (f16's own rounding).
TEST(LossScaler, RescuesF16GradientsThatWouldUnderflow) {
  manual_seed(4);
  const Tensor x = randn({64, 32}).to(DType::f16);
  const Tensor W0 = mt::scale(randn({16, 32}), 0.1).to(DType::f16).to(DType::f32);  // f16-exact
  const Tensor y = from_vector(std::vector<int64_t>(64, 3), {64});
  const double normalizer = std::ldexp(1.0, 22);

  Tensor Wr = W0.to(DType::f64).set_requires_grad();  // the reference: f64 throughout
  cross_entropy(linear(x.to(DType::f64), Wr), y, -100, normalizer).backward();
  const std::vector<double> ref = Wr.grad().to_vector();

  auto rel_error = [&](double scale) {
    Tensor W = W0.clone().set_requires_grad();
    LossScaler scaler({LossScaleMode::fixed, scale, 1});
    Tensor loss = cross_entropy(linear(x, W), y, -100, normalizer);
    loss.backward(scaler.seed_for(loss));
    EXPECT_FALSE(scaler.unscale_and_check({W}));
    const std::vector<double> g = W.grad().to_vector();
    double err = 0, norm = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      err += (g[i] - ref[i]) * (g[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
    return std::sqrt(err / norm);
  };
  const double unscaled = rel_error(1), scaled = rel_error(65536);
  std::printf("f16 weight gradient, relative error: unscaled %.3g, loss scale 2^16 %.3g\n",
              unscaled, scaled);
  EXPECT_GT(unscaled, 0.1);
  EXPECT_LT(scaled, 1e-3);
}

TEST(LossScaler, StateDictRoundTripsAndBadStateIsAClearError) {
  LossScaler a({LossScaleMode::dynamic, 1024, 4});
  a.update(true);
  a.update(false);
  LossScaler b({LossScaleMode::dynamic, 65536, 4});
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.scale(), 512.0);
  EXPECT_EQ(b.growth_tracker(), 1);
  EXPECT_EQ(b.skipped_steps(), 1);

  LossScaler fixed({LossScaleMode::fixed, 8, 4});
  fixed.load_state_dict(a.state_dict());
  EXPECT_EQ(fixed.scale(), 8.0);  // a fixed scale comes from the configuration
  EXPECT_EQ(fixed.skipped_steps(), 1);

  expect_error([&] { b.load_state_dict({}); }, {"LossScaler", "'scale'"});
  nn::StateDict bad = a.state_dict();
  bad[1].second = full({}, 1.0, DType::f32);
  expect_error([&] { b.load_state_dict(bad); }, {"growth_tracker", "i64", "f32"});
  bad = a.state_dict();
  bad[0].second = full({}, 0.5, DType::f64);
  expect_error([&] { b.load_state_dict(bad); }, {"impossible", "scale 0.5"});
  EXPECT_EQ(b.scale(), 512.0);  // nothing changed
  expect_error([] { LossScaler({LossScaleMode::dynamic, 0.5, 4}); }, {"at least 1", "0.5"});
}

// ---- the trainer --------------------------------------------------------------------------

TEST(MixedPrecisionTrainer, F16RunRecoversFromAnOverflowingScale) {
  TempDir dir;
  LogCapture log;
  app::ConfigTrainer t(f16_config(dir, 36), kCPU);
  ASSERT_TRUE(t.loss_scaler().enabled());
  const train::RunSummary s = t.run();

  const LossScaler& scaler = t.loss_scaler();
  // 2^30 halves until the scaled gradients fit in f16; then the steps go through.
  EXPECT_GT(scaler.skipped_steps(), 5);
  EXPECT_LT(scaler.skipped_steps(), 30);
  EXPECT_LT(scaler.scale(), std::ldexp(1.0, 30));
  EXPECT_EQ(t.optimizer().steps_taken(), 36 - scaler.skipped_steps());
  EXPECT_TRUE(all_finite(values_of(t.model().parameters())));
  EXPECT_GT(s.val_metrics.at("accuracy"), 0.5);  // four classes: it learned
  EXPECT_TRUE(log.contains("step 1: gradient overflow, loss scale 1073741824 -> 536870912, "
                           "step skipped"));

  // Every logged step carries the scale and the running count of skipped steps.
  std::ifstream metrics(dir / "ckpt/metrics.jsonl");
  int64_t logged = 0, last_skipped = -1;
  for (std::string line; std::getline(metrics, line);) {
    const auto record = nlohmann::json::parse(line);
    if (!record.contains("loss")) continue;
    ++logged;
    ASSERT_TRUE(record.contains("loss_scale") && record.contains("skipped_steps")) << line;
    EXPECT_GE(record["skipped_steps"].get<int64_t>(), last_skipped);
    last_skipped = record["skipped_steps"].get<int64_t>();
  }
  EXPECT_EQ(logged, 6);
  EXPECT_EQ(last_skipped, scaler.skipped_steps());
}

TEST(MixedPrecisionTrainer, ResumeRestoresTheLossScalerAndEndsBitwiseEqual) {
  TempDir dir;
  app::ConfigTrainer full(f16_config(dir), kCPU);
  full.run();
  const LossScaler& expected = full.loss_scaler();

  const train::Checkpoint c = train::load_checkpoint(dir / "ckpt/step-000012.safetensors");
  std::vector<std::string> names;
  for (const auto& [name, t] : c.optimizer)
    if (name.starts_with("loss_scaler.")) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"loss_scaler.scale", "loss_scaler.growth_tracker",
                                             "loss_scaler.skipped_steps"}));

  // Without the restored scale the resumed run would start again at 2^30 and skip steps.
  TempDir dir2;
  app::ConfigTrainer resumed(f16_config(dir2), kCPU);
  resumed.resume(dir / "ckpt/step-000012.safetensors");
  resumed.run();
  EXPECT_EQ(values_of(resumed.model().parameters()), values_of(full.model().parameters()));
  EXPECT_EQ(resumed.loss_scaler().scale(), expected.scale());
  EXPECT_EQ(resumed.loss_scaler().growth_tracker(), expected.growth_tracker());
  EXPECT_EQ(resumed.loss_scaler().skipped_steps(), expected.skipped_steps());
  EXPECT_EQ(resumed.optimizer().steps_taken(), full.optimizer().steps_taken());
}

TEST(MixedPrecisionTrainer, Bf16AndF32NeverScale) {
  for (DType dt : {DType::bf16, DType::f32}) {
    TempDir dir;
    Config cfg = f16_config(dir, 12);
    cfg.precision.compute_dtype = dt;
    app::ConfigTrainer t(cfg, kCPU);
    t.run();
    EXPECT_FALSE(t.loss_scaler().enabled()) << dtype_name(dt);
    EXPECT_EQ(t.optimizer().steps_taken(), 12) << dtype_name(dt);
    for (const auto& [name, tensor] : train::load_checkpoint(dir / "ckpt").optimizer)
      EXPECT_FALSE(name.starts_with("loss_scaler.")) << name;
  }
}

// ---- on the GPU (skipped without one) ------------------------------------------------------

// The CUDA unscale (count_nonfinite + scale over every .grad) against the CPU loop: the same flag
// and, for a power-of-two scale, the same bits.
TEST(CudaLossScaler, UnscaleAndCheckMatchTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  for (bool overflow : {false, true}) {
    manual_seed(8);
    std::vector<Tensor> grads = {mt::scale(randn({4099}), 65536.0),
                                 mt::scale(randn({37}), 65536.0)};
    if (overflow) grads[1].data<float>()[36] = std::numeric_limits<float>::infinity();
    std::vector<Tensor> cpu, gpu;
    for (const Tensor& g : grads) {
      cpu.push_back(zeros(g.shape()).set_requires_grad());
      cpu.back().set_grad(g.clone());
      gpu.push_back(zeros(g.shape(), DType::f32, cuda_device(0)).set_requires_grad());
      gpu.back().set_grad(g.to(cuda_device(0)));
    }
    LossScaler on_cpu, on_gpu;
    EXPECT_EQ(on_cpu.unscale_and_check(cpu), overflow);
    EXPECT_EQ(on_gpu.unscale_and_check(gpu), overflow);
    for (size_t i = 0; i < grads.size(); ++i)
      EXPECT_EQ(gpu[i].grad().to_vector(), cpu[i].grad().to_vector()) << i;
  }
}

TEST(CudaMixedPrecisionTrainer, F16RunRecoversFromAnOverflowingScale) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: CUDA tests skipped";
  TempDir dir;
  Config cfg = f16_config(dir, 36);
  cfg.device = "cuda";
  app::ConfigTrainer t(cfg, cuda_device(0));
  const train::RunSummary s = t.run();
  EXPECT_GT(t.loss_scaler().skipped_steps(), 5);
  EXPECT_EQ(t.optimizer().steps_taken(), 36 - t.loss_scaler().skipped_steps());
  EXPECT_TRUE(all_finite(values_of(t.model().parameters())));
  EXPECT_GT(s.val_metrics.at("accuracy"), 0.5);
}

// ---- 16-bit ops: fp32 math on the rounded inputs, rounded once ----------------------------

// What the GPU kernels do, on the CPU: every op upcasts its bf16/f16 inputs, computes in fp32
// and rounds its output once. A whole model in 16 bits is then the f32 ops applied layer by
// layer to rounded activations, each output rounded, bit for bit.
TEST(MixedPrecision, ModelIn16BitsIsFp32MathRoundedOncePerOp) {
  for (DType dt : {DType::bf16, DType::f16}) {
    Problem p(dt, 5);
    const Tensor logits = (*p.model)(p.x);
    EXPECT_EQ(logits.dtype(), dt);

    NoGradGuard no_grad;
    auto up = [](const Tensor& t) { return t.to(DType::f32); };
    // The Sequential runs each RMSNorm → ScaledSiLU pair as one fused op: one rounding.
    Tensor h = p.x;
    for (size_t i = 0; i < p.model->layers->size(); ++i) {
      nn::Module* m = (*p.model->layers)[i].get();
      auto* next = i + 1 < p.model->layers->size() ? (*p.model->layers)[i + 1].get() : nullptr;
      // The bias as the epilogue adds it: rounded to dt (the Linear's compute copy).
      if (auto* l = dynamic_cast<nn::Linear*>(m)) h = linear(up(h), up(l->weight.to(dt)), up(l->bias.to(dt)));
      else if (auto* n = dynamic_cast<nn::RMSNorm*>(m)) {
        auto* s = dynamic_cast<nn::ScaledSiLU*>(next);
        ASSERT_NE(s, nullptr);
        h = rms_norm_scaled_silu(up(h), n->weight, s->w, n->eps);
        ++i;
      }
      h = h.to(dt);
    }
    EXPECT_EQ(logits.to_vector(), h.to_vector()) << dtype_name(dt);
    // The math: the f64 model on the same rounded input and weights. Each of the layers rounds
    // its output once, so the errors add up over them.
    Tensor h64 = p.x.to(DType::f64);
    for (size_t i = 0; i < p.model->layers->size(); ++i) {
      nn::Module* m = (*p.model->layers)[i].get();
      auto f64 = [](const Tensor& t) { return t.to(DType::f64); };
      if (auto* l = dynamic_cast<nn::Linear*>(m))
        h64 = linear(h64, f64(l->weight.to(dt)), f64(l->bias));
      else if (auto* n = dynamic_cast<nn::RMSNorm*>(m)) h64 = rms_norm(h64, f64(n->weight), n->eps);
      else if (auto* s = dynamic_cast<nn::ScaledSiLU*>(m)) h64 = scaled_silu(h64, f64(s->w));
    }
    expect_near_reference(logits, h64, 4.0 * double(p.model->layers->size()) * unit_roundoff(dt),
                          dtype_name(dt));
  }
}

TEST(MixedPrecision, ScaledSiLUBackwardIn16BitsIsFp32MathRoundedOnce) {
  manual_seed(6);
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor x = randn({257}).to(dt).set_requires_grad(), w = full({1}, 1.25).set_requires_grad();
    const Tensor dy = randn({257}).to(dt);
    scaled_silu(x, w).backward(dy);
    Tensor xr = x.detach().to(DType::f32).set_requires_grad();
    Tensor wr = w.detach().clone().set_requires_grad();
    scaled_silu(xr, wr).backward(dy.to(DType::f32));
    // The leaf's .grad is fp32, holding the dx the kernel rounded once to dt.
    EXPECT_EQ(x.grad().dtype(), DType::f32);
    EXPECT_EQ(x.grad().to_vector(), xr.grad().to(dt).to_vector()) << dtype_name(dt);
    EXPECT_EQ(w.grad().to_vector(), wr.grad().to_vector()) << dtype_name(dt);  // fp32 reduction
    // The math: f64 on the same rounded x and dy.
    Tensor x64 = x.detach().to(DType::f64).set_requires_grad();
    Tensor w64 = w.detach().to(DType::f64).set_requires_grad();
    scaled_silu(x64, w64).backward(dy.to(DType::f64));
    expect_near_reference(x.grad(), x64.grad(), 2 * unit_roundoff(dt), dtype_name(dt));
    expect_near_reference(w.grad(), w64.grad(), 1e-5, dtype_name(dt));
  }
}

// ---- trap 4 -------------------------------------------------------------------------------

// 32,768 contributions of about 1e-3 summed three ways. A bf16 running sum has 8 significant
// bits: once it reaches 0.5 its spacing is 2^-8 ≈ 3.9e-3, more than twice any contribution, so
// every further addition rounds back to the same value and the sum stops growing. Measured: the
// bf16 sum ends at 0.5 (relative error 0.985), fp32's relative error is 3e-7; the framework's own
// sum() of the bf16-rounded values accumulates in fp32 or wider and rounds once (error < 2^-8).
TEST(PrecisionTrap4, Bf16AccumulationLosesPrecision) {
  manual_seed(44);
  const int64_t n = 32768;
  const std::vector<double> u = rand({n}).to_vector();
  double exact = 0;
  float fp32 = 0;
  bf16 running = float_to_bf16(0);
  std::vector<double> rounded;
  for (double ui : u) {
    const float c = float(0.5e-3 + 1e-3 * ui);  // in [0.5e-3, 1.5e-3]
    exact += c;
    fp32 += c;
    running = float_to_bf16(bf16_to_float(running) + c);
    rounded.push_back(bf16_to_float(float_to_bf16(c)));
  }
  const double bf16_err = std::abs(bf16_to_float(running) - exact) / exact;
  const double fp32_err = std::abs(fp32 - exact) / exact;
  std::printf("sum of %lld values: exact %.6f, bf16 running sum %.6f (relative error %.3g), fp32 "
              "running sum %.6f (relative error %.3g)\n", static_cast<long long>(n), exact,
              double(bf16_to_float(running)), bf16_err, double(fp32), fp32_err);
  EXPECT_GT(bf16_err, 0.9);
  EXPECT_LT(fp32_err, 1e-4);

  double exact_rounded = 0;
  for (double r : rounded) exact_rounded += r;
  const double framework = sum(from_vector(rounded, {n}, DType::bf16)).item();
  EXPECT_LT(std::abs(framework - exact_rounded) / exact_rounded, std::ldexp(1.0, -8));
}
