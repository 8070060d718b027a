// A model of the user's own, trained by minitrain's trainer, from a project that uses the
// installed package (find_package(minitrain)):
//
//   consumer_residual [--device cpu|cuda] [--dtype f32|bf16] [--graph]
//
//   1. a residual network nn::MLP cannot express, trained on generated data in 3 microbatches
//      per step; its test loss must fall below kMaxTestLoss;
//   2. a second run resumed from the first one's middle checkpoint must end with bitwise the
//      same weights;
//   3. nn::save, then nn::load into a freshly initialized model: the same logits, bit for bit.
// Exits non-zero, saying which, when any of them fails.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "minitrain.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kDim = 16, kHidden = 64, kClasses = 4;
constexpr double kMaxTestLoss = 0.5;

// x + down(scaled_silu(rms_norm(up(x)))): the skip connection is what the config MLP lacks.
struct ResidualBlock : nn::Module {
  explicit ResidualBlock(int64_t dim) {
    up = register_module("up", nn::Linear(dim, kHidden));
    norm = register_module("norm", nn::RMSNorm(kHidden));
    act = register_module("act", nn::ScaledSiLU());
    down = register_module("down", nn::Linear(kHidden, dim));
  }
  Tensor forward(const Tensor& x) override { return add(x, (*down)((*act)((*norm)((*up)(x))))); }
  std::string repr() const override { return "ResidualBlock"; }
  std::shared_ptr<nn::Linear> up, down;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::ScaledSiLU> act;
};

struct ResidualNet : nn::Module {
  ResidualNet() {
    block1 = register_module("block1", ResidualBlock(kDim));
    block2 = register_module("block2", ResidualBlock(kDim));
    head = register_module("head", nn::Linear(kDim, kClasses));
  }
  Tensor forward(const Tensor& x) override { return (*head)((*block2)((*block1)(x))); }
  std::string repr() const override { return "ResidualNet"; }
  std::shared_ptr<ResidualBlock> block1, block2;
  std::shared_ptr<nn::Linear> head;
};

std::shared_ptr<ResidualNet> make_net(uint64_t seed) {
  manual_seed(seed);  // the initialization
  return std::make_shared<ResidualNet>();
}

// 3000 generated samples (a tenth held out for validation) and 600 for the test, served 96 a
// step in 3 microbatches.
data::Dataset test_set() { return data::make_synthetic(600, kDim, kClasses, 1.5, 11, 1); }

std::shared_ptr<data::Source> make_data() {
  return std::make_shared<data::ArraySource>(data::make_synthetic(3000, kDim, kClasses, 1.5, 11, 0),
                                             test_set(),
                                             data::ArrayOptions{.batch_size = 96, .microbatches = 3});
}

// 60 steps, a checkpoint every 20; every other option keeps its default (train/options.h).
train::Options make_options(const std::string& dir, const std::string& dtype, bool graph) {
  train::Options o;
  o.steps = 60;
  o.schedule.warmup_steps = 5;
  o.optimizer.lr = 3e-3;
  o.logging.every = 20;
  o.eval.every = 60;
  o.checkpoint.every = 20;
  o.checkpoint.keep_last = 3;
  o.checkpoint.dir = dir;
  o.precision.compute_dtype = dtype_from_name(dtype);
  o.cuda_graph = graph;
  return o;
}

std::vector<std::vector<double>> weights(nn::Module& m) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to_vector());
  return out;
}

int fail(const std::string& what) {
  std::fprintf(stderr, "consumer_residual: FAILED: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string device = "cpu", dtype = "f32";
  bool graph = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) device = argv[++i];
    else if (a == "--dtype" && i + 1 < argc) dtype = argv[++i];
    else if (a == "--graph") graph = true;
    else return fail("usage: consumer_residual [--device cpu|cuda] [--dtype f32|bf16] [--graph]");
  }
  const fs::path root = fs::temp_directory_path() / ("consumer_residual." + std::to_string(::getpid()));
  fs::create_directories(root);
  const Device dev = train::resolve_device(device);

  // 1. Train the user's model with the whole trainer.
  const train::Options options = make_options((root / "run").string(), dtype, graph);
  auto net = make_net(1);
  train::Trainer trainer(options, net, train::classification(), make_data(), dev);
  const train::RunSummary run = trainer.run();
  std::printf("consumer_residual: %s %s%s: train loss %.4f, test loss %.4f, test accuracy %.4f\n",
              device.c_str(), dtype.c_str(), graph ? " cuda_graph" : "", run.train_loss,
              run.test_loss, run.test_metrics.at("accuracy"));
  if (!(run.test_loss < kMaxTestLoss))
    return fail("test loss " + std::to_string(run.test_loss) + " is not below " +
                std::to_string(kMaxTestLoss));
  const auto final_weights = weights(*net);

  // 2. Resume from step 20 (a copy, so the second run owns its folder) and finish the run.
  const fs::path mid = root / "run" / "step-000020.safetensors";
  fs::create_directories(root / "resumed");
  for (const char* suffix : {".safetensors", ".optim.safetensors"})
    fs::copy_file(root / "run" / ("step-000020" + std::string(suffix)),
                  root / "resumed" / ("step-000020" + std::string(suffix)));
  {
    auto net2 = make_net(2);  // another initialization: the checkpoint must replace all of it
    train::Trainer resumed(make_options((root / "resumed").string(), dtype, graph), net2,
                           train::classification(), make_data(), dev);
    resumed.resume((root / "resumed" / "step-000020.safetensors").string());
    resumed.run();
    if (weights(*net2) != final_weights)
      return fail("the run resumed from " + mid.string() + " did not end bitwise equal");
  }
  std::printf("consumer_residual: resumed from step 20: final weights bitwise equal\n");

  // 3. Save, load into a fresh model, predict.
  const std::string saved = (root / "model.safetensors").string();
  nn::save(*net, saved, {{"note", "consumer_residual"}});
  auto loaded = make_net(3);
  loaded->to(dev);
  if (options.precision.compute_dtype != DType::f32) loaded->set_compute_dtype(options.precision.compute_dtype);
  nn::load(*loaded, saved);
  const data::Dataset test = test_set();
  std::vector<int64_t> rows(size_t(test.size));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = int64_t(i);
  auto [x, y] = test.gather(rows, dev);
  NoGradGuard no_grad;
  net->eval(), loaded->eval();
  const Tensor xc = x.to(options.precision.compute_dtype);
  if ((*net)(xc).to_vector() != (*loaded)(xc).to_vector())
    return fail("the loaded model's predictions differ from the trained model's");
  std::printf("consumer_residual: save -> load -> predict: %lld rows, logits bitwise equal\n",
              static_cast<long long>(test.size));
  fs::remove_all(root);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "consumer_residual: %s\n", e.what());
  return 1;
}
