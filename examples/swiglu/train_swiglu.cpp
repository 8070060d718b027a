// A model built on the user's own op, trained by minitrain's trainer:
//
//   train_swiglu [--device cpu|cuda] [--dtype f32|bf16|f16] [--graph]
//
// Two gated MLP blocks, x + down(swiglu(gate(x), up(x))), then a linear head, on generated
// classification data, 120 steps of 128 samples in 2 microbatches. Exits non-zero if the test
// loss does not fall below kMaxTestLoss.
#include <cstdio>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "minitrain.h"
#include "swiglu.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kDim = 16, kHidden = 64, kClasses = 4;
constexpr double kMaxTestLoss = 0.5;

struct GatedBlock : nn::Module {
  GatedBlock() {
    norm = register_module("norm", nn::RMSNorm(kDim));
    gate = register_module("gate", nn::Linear(kDim, kHidden));
    up = register_module("up", nn::Linear(kDim, kHidden));
    down = register_module("down", nn::Linear(kHidden, kDim));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = (*norm)(x);
    return add(x, (*down)(swiglu_example::swiglu((*gate)(h), (*up)(h))));
  }
  std::string repr() const override { return "GatedBlock"; }
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> gate, up, down;
};

struct GatedNet : nn::Module {
  GatedNet() {
    block1 = register_module("block1", GatedBlock());
    block2 = register_module("block2", GatedBlock());
    head = register_module("head", nn::Linear(kDim, kClasses));
  }
  Tensor forward(const Tensor& x) override { return (*head)((*block2)((*block1)(x))); }
  std::string repr() const override { return "GatedNet"; }
  std::shared_ptr<GatedBlock> block1, block2;
  std::shared_ptr<nn::Linear> head;
};

int fail(const std::string& what) {
  std::fprintf(stderr, "train_swiglu: FAILED: %s\n", what.c_str());
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
    else return fail("usage: train_swiglu [--device cpu|cuda] [--dtype f32|bf16|f16] [--graph]");
  }
  const fs::path dir = fs::temp_directory_path() / ("train_swiglu." + std::to_string(::getpid()));
  train::Options o;  // every field not set here keeps its default (train/options.h)
  o.steps = 120;
  o.schedule.warmup_steps = 10;
  o.optimizer.lr = 3e-3;
  o.logging.every = 40;
  o.eval.every = 120;
  o.checkpoint.every = 120;
  o.checkpoint.dir = dir.string();
  o.precision.compute_dtype = dtype_from_name(dtype);
  o.cuda_graph = graph;
  manual_seed(1);
  auto net = std::make_shared<GatedNet>();
  auto data = std::make_shared<data::ArraySource>(
      data::make_synthetic(4000, kDim, kClasses, 1.5, 7, 0),
      data::make_synthetic(800, kDim, kClasses, 1.5, 7, 1),
      data::ArrayOptions{.batch_size = 128, .microbatches = 2});
  train::Trainer trainer(o, net, train::classification(), data, train::resolve_device(device));
  const train::RunSummary run = trainer.run();
  std::printf("train_swiglu: %s %s%s: train loss %.4f, test loss %.4f, test accuracy %.4f\n",
              device.c_str(), dtype.c_str(), graph ? " cuda_graph" : "", run.train_loss,
              run.test_loss, run.test_metrics.at("accuracy"));
  fs::remove_all(dir);
  if (!(run.test_loss < kMaxTestLoss))
    return fail("test loss " + std::to_string(run.test_loss) + " is not below " +
                std::to_string(kMaxTestLoss));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "train_swiglu: %s\n", e.what());
  return 1;
}
