// `train`: the command-line entry point.
//
//   train --config FILE [--set key.path=value]... [--device auto|cpu|cuda[:N]] [--resume CKPT]
//   train --list-ops | --help | --version
//
// Exit codes: 0 success; 1 a runtime error (bad data file, corrupt checkpoint, CUDA error);
// 2 a usage or configuration error (nothing is written); 3 a non-finite loss or gradient.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/registry.h"
#include "train/config.h"
#include "train/trainer.h"

namespace {

const char* kUsage =
    "usage: train --config FILE [--set key.path=value]... [--device auto|cpu|cuda[:N]]\n"
    "             [--resume CHECKPOINT]\n"
    "       train --list-ops | --help | --version\n"
    "\n"
    "  --config FILE      the run's YAML config (docs/config.md lists every key)\n"
    "  --set KEY=VALUE    override one config key, e.g. --set optim.lr=1e-3 (repeatable)\n"
    "  --device DEVICE    where to train; overrides the config's `device` (default auto:\n"
    "                     the GPU when there is one)\n"
    "  --resume PATH      continue a run from a checkpoint file or its directory\n"
    "  --list-ops         print the registered ops and their kernels\n";

struct UsageError : mt::Error {
  using mt::Error::Error;
};

}  // namespace

int main(int argc, char** argv) {
  std::string config_path, device, resume;
  std::vector<std::string> overrides;
  bool have_config = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw UsageError(a + " needs a value");
        return argv[++i];
      };
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (a == "--version") {
        std::printf("minitrain %s\n", MT_VERSION);
        return 0;
      } else if (a == "--list-ops") {
        std::fputs(mt::OpRegistry::instance().table().c_str(), stdout);
        return 0;
      } else if (a == "--config") {
        config_path = value();
        have_config = true;
      } else if (a == "--set") {
        overrides.push_back(value());
      } else if (a == "--device") {
        device = value();
      } else if (a == "--resume") {
        resume = value();
      } else {
        throw UsageError("unknown argument '" + a + "'");
      }
    }
    if (!have_config) throw UsageError("--config FILE is required");
    if (!device.empty()) overrides.push_back("device=" + device);
    mt::Config cfg = mt::load_config(config_path, overrides);
    spdlog::set_pattern("[%H:%M:%S] %v");
    mt::train::Trainer trainer(cfg, mt::train::resolve_device(cfg.device));
    if (!resume.empty()) trainer.resume(resume);
    trainer.run();
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "train: %s\n\n%s", e.what(), kUsage);
    return 2;
  } catch (const mt::ConfigError& e) {
    std::fprintf(stderr, "train: config error: %s\n", e.what());
    return 2;
  } catch (const mt::train::NonFiniteError& e) {
    std::fprintf(stderr, "\ntrain: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\ntrain: error: %s\n", e.what());
    return 1;
  }
}
