// A model the config cannot express, trained through the whole trainer: a user's nn::Module with
// a forward of its own signature and a Task with its own loss. Its gradients after one step equal
// the full batch's with any number of microbatches and data-parallel ranks; it checkpoints and
// resumes bitwise; it gets metrics and a curve; forensics names its modules; and its checkpoint
// serves inference from the program (docs/library.md), while `train eval` refuses it, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "app/config.h"
#include "app/config_trainer.h"
#include "app/inference.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "nn/modules.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/elementwise/elementwise.h"
#include "tests/expect_error.h"
#include "tests/max_rel_diff.h"
#include "tests/run_train.h"
#include "tests/temp_dir.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace mt {
namespace {

using test::TempDir;

// y = x + down(scaled_silu(up(x))): a residual block, which nn::MLP has no way to say.
struct Residual : nn::Module {
  Residual(int64_t dim, int64_t hidden) {
    up = register_module("up", nn::Linear(dim, hidden));
    act = register_module("act", nn::ScaledSiLU());
    down = register_module("down", nn::Linear(hidden, dim));
  }
  Tensor forward(const Tensor& x) override { return add(x, (*down)((*act)((*up)(x)))); }
  std::string repr() const override { return "Residual"; }
  std::shared_ptr<nn::Linear> up, down;
  std::shared_ptr<nn::ScaledSiLU> act;
};

// Logits of a residual block and a linear head, divided by a temperature: a forward of two
// arguments, which only its task calls.
struct ResidualNet : nn::Module {
  ResidualNet(int64_t dim, int64_t hidden, int64_t classes) {
    block = register_module("block", Residual(dim, hidden));
    head = register_module("head", nn::Linear(dim, classes));
  }
  Tensor forward(const Tensor& x, double temperature) {
    return scale((*head)((*block)(x)), 1.0 / temperature);
  }
  std::string repr() const override { return "ResidualNet"; }
  std::shared_ptr<Residual> block;
  std::shared_ptr<nn::Linear> head;
};

constexpr double kTemperature = 1.5, kL2 = 0.05;

// Cross-entropy plus kL2·‖head.weight‖². The penalty belongs to the batch, not to a sample: each
// microbatch adds its share n / normalizer of it, so the shares of a step add up to one penalty.
struct PenalizedClassification : train::Task {
  Tensor loss(nn::Module& model, const train::Batch& b, double normalizer,
              train::Metrics* metrics) override {
    auto& net = dynamic_cast<ResidualNet&>(model);
    Tensor logits = net.forward(b.x, kTemperature);
    const Tensor& w = net.head->weight;
    const double n = double(b.x.size(0));
    if (metrics != nullptr) (*metrics)["penalty"] += n * kL2 * sum(mul(w, w)).item();
    return add(cross_entropy(logits, b.y, -100, normalizer), scale(sum(mul(w, w)), kL2 * n / normalizer));
  }
};

constexpr int64_t kDim = 6, kHidden = 10, kClasses = 4, kBatch = 12;

std::shared_ptr<ResidualNet> make_net(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<ResidualNet>(kDim, kHidden, kClasses);
}

app::Datasets make_data() {
  return {data::make_synthetic(96, kDim, kClasses, 0.5, 3, 0),
          data::make_synthetic(24, kDim, kClasses, 0.5, 3, 1)};
}

Config user_config(const TempDir& dir, DType dt, int64_t k, int64_t steps,
                   const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {
      "optim.steps=" + std::to_string(steps), "optim.batch_size=" + std::to_string(kBatch),
      "optim.microbatches=" + std::to_string(k), "optim.warmup_steps=" + std::to_string(steps / 4), "data.val_fraction=0.25",
      "eval.every=4", "logging.every=2", "checkpoint.every=4", "checkpoint.keep_last=5",
      "checkpoint.dir=" + (dir / "ckpt"), std::string("precision.compute_dtype=") + dtype_name(dt),
      "device=cpu"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

std::unique_ptr<train::Trainer> make_trainer(const Config& cfg, uint64_t seed,
                                             std::shared_ptr<parallel::Communicator> comm = nullptr) {
  return std::make_unique<app::ConfigTrainer>(cfg, make_net(seed),
                                          std::make_shared<PenalizedClassification>(), kCPU,
                                          std::move(comm), make_data());
}

using Grads = std::vector<std::vector<double>>;

// Records the gradients of step 1, after the microbatches (and the all-reduce), before the update.
void record_first_grads(train::Trainer& t, Grads& out) {
  t.set_step_callback([&out](int64_t step, train::Trainer& tr) {
    if (step != 1) return;
    for (const Tensor& p : tr.model().parameters()) out.push_back(p.grad().to_vector());
  });
}

// The gradient of step 1 computed independently: one backward of the whole batch's mean
// cross-entropy plus the penalty, written out here rather than through the task.
Grads full_batch_grads(const Config& cfg, uint64_t seed) {
  auto net = make_net(seed);
  net->to(DType::f64);
  const app::Datasets d = make_data();
  const data::Split split = data::split_indices(d.train.size, cfg.data.val_fraction, cfg.data.seed);
  data::Loader whole(d.train, split.train, kBatch, 1, cfg.data.shuffle, cfg.data.seed);
  const auto batch = whole.step_batches(0, kCPU).at(0);
  const Tensor& w = net->head->weight;
  Tensor loss = add(cross_entropy(net->forward(batch.x.to(DType::f64), kTemperature), batch.y),
                    scale(sum(mul(w, w)), kL2));
  loss.backward();
  Grads out;
  for (const Tensor& p : net->parameters()) out.push_back(p.grad().to_vector());
  return out;
}

using test::max_rel_diff;

TEST(UserModel, MicrobatchGradientsEqualTheFullBatch) {
  for (int64_t k : {1, 3}) {
    TempDir dir;
    const Config cfg = user_config(dir, DType::f64, k, 1);
    auto t = make_trainer(cfg, 7);
    Grads grads;
    record_first_grads(*t, grads);
    t->run();
    ASSERT_EQ(grads.size(), 7u);  // block.up (2), block.act (1), block.down (2), head (2)
    EXPECT_LE(max_rel_diff(grads, full_batch_grads(cfg, 7)), 1e-12) << k << " microbatches";
  }
}

TEST(UserModel, DataParallelGradientsEqualTheFullBatch) {
  for (int nproc : {2, 3}) {
    TempDir dir;
    const Config cfg = user_config(dir, DType::f64, 2, 1);
    std::vector<Grads> grads(static_cast<size_t>(nproc));
    train::run_local_ranks(nproc, [&](std::shared_ptr<parallel::Communicator> comm) {
      Grads& mine = grads[size_t(comm->rank())];
      auto t = make_trainer(cfg, 7, std::move(comm));
      record_first_grads(*t, mine);
      return t;
    });
    const Grads expected = full_batch_grads(cfg, 7);
    for (int r = 0; r < nproc; ++r)
      EXPECT_LE(max_rel_diff(grads[size_t(r)], expected), 1e-12) << "rank " << r << " of " << nproc;
  }
}

std::vector<std::vector<double>> params_of(train::Trainer& t) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : t.model().parameters()) out.push_back(p.to_vector());
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(UserModel, ResumesBitwiseAndWritesMetricsAndCurve) {
  TempDir dir;
  auto full = make_trainer(user_config(dir, DType::f32, 3, 8), 11);
  const train::RunSummary s = full->run();
  EXPECT_GT(s.val_metrics.at("penalty"), 0);
  EXPECT_GT(s.test_metrics.at("penalty"), 0);

  const std::string metrics = read_text(dir / "ckpt/metrics.jsonl");
  for (const char* key : {"\"loss\"", "\"penalty\"", "\"val_penalty\"", "\"test_penalty\""})
    EXPECT_NE(metrics.find(key), std::string::npos) << key << " missing from " << metrics;
  const std::string curve = read_text(dir / "ckpt/curve.svg");
  EXPECT_NE(curve.find("ResidualNet"), std::string::npos);
  EXPECT_EQ(curve.find("MLP"), std::string::npos);
  // The checkpoint carries the run's config.
  EXPECT_EQ(parse_config(train::load_checkpoint(dir / "ckpt").metadata.at("config"), "checkpoint"),
            user_config(dir, DType::f32, 3, 8));

  // A fresh model (another initialization) resumed from step 4 ends where the full run did.
  TempDir dir2;
  auto resumed = make_trainer(user_config(dir2, DType::f32, 3, 8), 12);
  resumed->resume(dir / "ckpt/step-000004.safetensors");
  EXPECT_EQ(resumed->step(), 4);
  resumed->run();
  EXPECT_EQ(params_of(*resumed), params_of(*full));
}

// Inference as docs/library.md writes it: the newest checkpoint's weights into a fresh model, the
// run's standardization from its metadata applied to raw features, then the forward pass. On the
// run's test set that gives the test loss the run logged. `train eval` cannot build this model
// from the config: it refuses the checkpoint naming the model and where inference is written up.
TEST(UserModel, InferenceFromTheProgramAndARefusalFromTrainEval) {
  TempDir dir;
  auto t = make_trainer(user_config(dir, DType::f32, 2, 8, {"data.standardize=true"}), 3);
  const train::RunSummary s = t->run();

  auto net = make_net(99);  // another initialization: every weight must come from the file
  const train::Checkpoint ckpt = train::load_checkpoint(dir / "ckpt");
  net->load_state_dict(ckpt.model);
  data::Standardization st;
  if (auto it = ckpt.metadata.find("standardization"); it != ckpt.metadata.end())
    st = data::standardization_from_text(it->second, ckpt.path);
  ASSERT_FALSE(st.empty());
  data::Dataset test = make_data().test;  // raw features, as a new file would hold them
  data::standardize(test.features, st);
  net->eval();
  NoGradGuard no_grad;
  const Tensor logits = net->forward(from_vector(test.features, {test.size, test.dim}), kTemperature);
  // The run's test loss is the cross-entropy plus the penalty (the task's loss).
  const Tensor& w = net->head->weight;
  const double loss = cross_entropy(logits, from_vector(test.labels, {test.size})).item() +
                      kL2 * sum(mul(w, w)).item();
  EXPECT_NEAR(loss, s.test_loss, 1e-5 * s.test_loss);

  const std::string why = "holds ResidualNet, a model of the program that trained it";
  test::expect_error([&] { app::evaluate_checkpoint(dir / "ckpt"); },
                     {why, "docs/library.md, \"Inference for your own model\""});
  std::string log;
  EXPECT_EQ(test::run_train("eval --checkpoint " + (dir / "ckpt"), &log), 2) << log;
  EXPECT_NE(log.find(why), std::string::npos) << log;
}

// data.test_fraction splits the data the config names; arrays handed in bring their own test set.
TEST(UserModel, TestFractionIsRefusedForDataHandedIn) {
  TempDir dir;
  const std::string csv = dir.write("d.csv", "1,2,0\n3,4,1\n");
  test::expect_error(
      [&] { make_trainer(user_config(dir, DType::f32, 1, 2, {"data.kind=csv", "data.path=" + csv,
                                                            "data.test_fraction=0.2"}), 1); },
      {"data.test_fraction: holds a test set out of the config's data, but this data is handed in"});
}

TEST(UserModel, ForensicsNamesTheUserModule) {
  TempDir dir;
  auto t = make_trainer(user_config(dir, DType::f32, 2, 8, {"logging.every=1"}), 5);
  // A huge but finite weight: the block's first Linear overflows float to inf.
  t->set_step_callback([](int64_t step, train::Trainer& tr) {
    if (step == 3) dynamic_cast<ResidualNet&>(tr.model()).block->up->weight.detach().fill_(3e38);
  });
  try {
    t->run();
    ADD_FAILURE() << "the run finished without a NonFiniteError";
  } catch (const train::NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "step 4: non-finite activation: the output of block.up Linear(in_features=6"),
              std::string::npos)
        << e.what();
  }
}

TEST(UserModel, AModuleWithoutAOneTensorForwardSaysSo) {
  TempDir dir;
  // The classification task calls model(x), which this model does not have.
  app::ConfigTrainer t(user_config(dir, DType::f32, 1, 2), make_net(1), train::classification(), kCPU,
                   nullptr, make_data());
  try {
    t.run();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ResidualNet: this module has no one-tensor forward"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mt
