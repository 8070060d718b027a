// The `train` program (app/cli.h).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <set>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "app/cli.h"
#include "app/config.h"
#include "app/config_trainer.h"
#include "app/inference.h"
#include "app/lm_commands.h"
#include "app/memory.h"
#include "core/registry.h"
#include "data/data.h"
#include "parallel/communicator.h"
#include "parallel/launch.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#ifdef MT_WITH_NCCL
#include "parallel/nccl.h"
#endif
#ifdef MT_WITH_GLOO
#include "parallel/gloo.h"
#endif

namespace {

const char* kUsage =
    "usage: train --config FILE [--set key.path=value]... [--device auto|cpu|cuda[:N]]\n"
    "             [--resume CHECKPOINT] [--nproc N] [--print-config]\n"
    "       train eval --checkpoint CKPT [--split test|val] [--set data.KEY=VALUE]...\n"
    "                  [--device DEVICE]\n"
    "       train predict --checkpoint CKPT --input X.csv --output P.csv [--set ...]...\n"
    "                     [--device DEVICE]\n"
    "       train sample --checkpoint CKPT [--prompt TEXT] [--tokens N] [--temperature T]\n"
    "                    [--top-k K] [--seed S] [--device DEVICE] [--tokenizer bytes|gpt2]\n"
    "                    [--gpt2-dir DIR]\n"
    "       train tokenize --input TEXT --output SHARD.bin [--tokenizer bytes|gpt2]\n"
    "                      [--gpt2-dir DIR] [--special as-text|allow]\n"
    "       train --list-ops | --config-reference | --help | --version\n"
    "\n"
    "  --config FILE      the run's YAML config (docs/config.md lists every key)\n"
    "  --set KEY=VALUE    override one config key, e.g. --set optim.lr=1e-3 (repeatable); a\n"
    "                     mapping merges into its section: --set 'optim={lr: 0.01, steps: 50}'\n"
    "  --device DEVICE    where to train; overrides the config's `device` (default auto:\n"
    "                     the GPU when there is one)\n"
    "  --resume PATH      continue a run from a checkpoint file or its directory\n"
    "  --nproc N          data parallel over N ranks: N GPUs (one process each, NCCL), or on\n"
    "                     the CPU N processes (Gloo); optim.batch_size stays the global batch\n"
    "  --print-config     print the resolved config (file, --set, --device) as YAML and exit\n"
    "  --list-ops         print the registered ops and their kernels\n"
    "  --config-reference print every config key (type, default, meaning) as a table\n"
    "  --version          the version, git commit, build type and CUDA architectures\n"
    "\n"
    "  eval               print a saved model's test loss and accuracy as its run printed them\n"
    "                     (--split val: on the run's validation split); a GPT's validation\n"
    "                     loss, bits per byte and perplexity\n"
    "  predict            write the predicted class and class probabilities of each row of a\n"
    "                     CSV of features (no label column) as a CSV: class,p0,p1,...\n"
    "                     (a classifier's; a GPT generates text with `sample`)\n"
    "  sample             print a GPT's text: the prompt and N tokens drawn at temperature T\n"
    "                     among the K likeliest (0: all), on --device (default cpu); the\n"
    "                     tokenizer the run's text went through, or --tokenizer (token data\n"
    "                     is taken to be GPT-2's)\n"
    "  tokenize           write a text file's tokens as an llm.c shard (GPT-2's BPE unless\n"
    "                     --tokenizer bytes); --special allow makes each <|endoftext|> in the\n"
    "                     text the end-of-text token, as llm.c puts between documents\n"
    "  --checkpoint CKPT  a model file (step-N.safetensors) or a checkpoint directory (its\n"
    "                     newest intact checkpoint); --set may change data.*, eval.*, device\n"
    "\n"
    "A run writes into checkpoint.dir (default runs/mlp): step-NNNNNN.safetensors (the model)\n"
    "and step-NNNNNN.optim.safetensors (optimizer state) every checkpoint.every steps, the last\n"
    "checkpoint.keep_last of them kept; metrics.jsonl (one JSON record per log line, evaluation\n"
    "and test); curve.svg (the loss and accuracy curves); a lock file while it runs.\n"
    "\n"
    "Exit codes: 0 success; 1 runtime error (a failed write, a CUDA error); 2 usage or config\n"
    "error (also a device that is not there, a checkpoint that cannot be used, data that does\n"
    "not fit the model; nothing is written); 3 a non-finite loss, gradient or sampled logits;\n"
    "4 a data file that cannot be read or parsed. docs/guide.md explains each.\n";

struct UsageError : mt::Error {
  using mt::Error::Error;
};

// Where stdout and stderr share a terminal, the live progress line may still hold the cursor:
// an error starts on a line of its own there. Elsewhere there is no such line, so no blank line.
const char* fresh_line() { return mt::app::errors_share_the_terminal() ? "\n" : ""; }

// --device is checked here, so that its error names --device rather than the --set it becomes.
void check_device_flag(const std::string& d) {
  if (mt::valid_device(d)) return;
  const bool gpu = d == "gpu" || d.starts_with("gpu:");
  throw UsageError("--device: expected auto, cpu, cuda or cuda:N, got '" + d + "'" +
                   (gpu ? "; did you mean '" + ("cuda" + d.substr(3)) + "'?" : ""));
}

// This process as one rank of a job another launcher (or --nproc) started: NCCL on its GPU, or
// Gloo on the CPU.
void run_worker(const mt::Config& cfg, const mt::parallel::World& world, const std::string& resume) {
  spdlog::set_pattern("[%H:%M:%S] [rank " + std::to_string(world.rank) + "] %v");
  if (world.rank != 0) spdlog::set_level(spdlog::level::warn);
  const mt::Device device = mt::train::resolve_device(cfg.device);
  std::shared_ptr<mt::parallel::Communicator> comm;
  mt::Device mine = device;
  if (device.is_cuda()) {
#ifdef MT_WITH_NCCL
    mine = mt::cuda_device(world.local_rank);
    comm = mt::parallel::make_nccl_communicator(world, mine.index);
#else
    MT_THROW("WORLD_SIZE=", world.size, ": this build has no NCCL (install libnccl-dev and rebuild)");
#endif
  } else {
#ifdef MT_WITH_GLOO
    comm = mt::parallel::make_gloo_communicator(world);
#else
    throw mt::ConfigError("device: CPU ranks in separate processes need Gloo, which this build "
                          "lacks (install libgloo-dev and rebuild); `train --nproc N` without "
                          "RANK runs CPU ranks as threads");
#endif
  }
  try {
    mt::app::ConfigTrainer trainer(cfg, mine, comm);
    if (!resume.empty()) trainer.resume(resume);
    trainer.run();
  } catch (const std::exception& e) {
    // No orderly finalize (which waits for peers): exit now; `--nproc` then stops the others.
    comm->abort(e.what());
    throw;
  }
}

// `train eval ...` and `train predict ...`: argv[1] is the subcommand.
int inference_command(int argc, char** argv) {
  const std::string command = argv[1];
  std::string checkpoint, split, input, output;
  std::vector<std::string> overrides;
  std::set<std::string> given;  // every flag but --set takes one value: a second is a slip
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(command + ": " + a + " needs a value");
      if (a != "--set" && !given.insert(a).second)
        throw UsageError(command + ": " + a + " is given twice");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--checkpoint") {
      checkpoint = value();
    } else if (a == "--set") {
      overrides.push_back(value());
    } else if (a == "--device") {
      overrides.push_back("device=" + value());
      check_device_flag(argv[i]);
    } else if (a == "--split" && command == "eval") {
      split = value();
    } else if ((a == "--input" || a == "--output") && command == "predict") {
      (a == "--input" ? input : output) = value();
    } else {
      throw UsageError(command + ": unknown argument '" + a + "'");
    }
  }
  if (checkpoint.empty()) throw UsageError(command + ": --checkpoint CKPT is required");
  if (command == "eval") {
    std::puts(mt::app::format_evaluation(
                  mt::app::evaluate_checkpoint(checkpoint, overrides, split)).c_str());
    return 0;
  }
  if (input.empty() || output.empty())
    throw UsageError("predict: --input X.csv and --output P.csv are required");
  const int64_t rows = mt::app::predict_csv(checkpoint, input, output, overrides);
  std::printf("predict: %lld rows -> %s\n", static_cast<long long>(rows), output.c_str());
  return 0;
}

}  // namespace

bool mt::app::errors_share_the_terminal() { return ::isatty(1) == 1 && ::isatty(2) == 1; }

int mt::app::run_cli(int argc, char** argv, const std::string& version) {
  std::string config_path, device, resume;
  std::vector<std::string> overrides, worker_args;  // worker_args: argv without --nproc
  int nproc = 1;
  bool have_config = false, print_config = false;
  try {
    if (argc > 1 && (std::strcmp(argv[1], "eval") == 0 || std::strcmp(argv[1], "predict") == 0))
      return inference_command(argc, argv);
    const bool lm_command =
        argc > 1 && (std::strcmp(argv[1], "sample") == 0 || std::strcmp(argv[1], "tokenize") == 0);
    if (lm_command) {
      const std::vector<std::string> args(argv + 2, argv + argc);
      for (size_t i = 0; i < args.size(); i += 2)  // names at even places, each with its value
        if (args[i] == "--help" || args[i] == "-h") {
          std::fputs(kUsage, stdout);
          return 0;
        }
      return std::strcmp(argv[1], "sample") == 0 ? sample_command(args) : tokenize_command(args);
    }
    std::set<std::string> given;  // every flag but --set takes one value: a second is a slip
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw UsageError(a + " needs a value");
        if (a != "--set" && !given.insert(a).second) throw UsageError(a + " is given twice");
        return argv[++i];
      };
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (a == "--version") {
        std::fputs(version.c_str(), stdout);
        return 0;
      } else if (a == "--config-reference") {
        std::fputs(mt::reference_table().c_str(), stdout);
        return 0;
      } else if (a == "--print-config") {
        print_config = true;
        continue;
      } else if (a == "--list-ops") {
        std::fputs(mt::OpRegistry::instance().table().c_str(), stdout);
        mt::verify_ops();  // a missing kernel or a wrong signature: exit 1, naming the op
        return 0;
      } else if (a == "--config") {
        config_path = value();
        have_config = true;
      } else if (a == "--set") {
        overrides.push_back(value());
      } else if (a == "--device") {
        device = value();
        check_device_flag(device);
      } else if (a == "--resume") {
        resume = value();
        // Not "no resume": a variable that expanded to nothing would start the run afresh.
        if (resume.empty()) throw UsageError("--resume needs a checkpoint file or folder, got ''");
      } else if (a == "--nproc") {
        const std::string n = value();
        nproc = std::atoi(n.c_str());
        if (nproc < 1 || std::to_string(nproc) != n) throw UsageError("--nproc needs a positive integer, got '" + n + "'");
        continue;
      } else {
        throw UsageError("unknown argument '" + a + "'");
      }
      // Every argument but --nproc N is passed on to the workers, values included.
      for (int j = i - (a == "--set" || a == "--config" || a == "--device" || a == "--resume"); j <= i; ++j)
        worker_args.push_back(argv[j]);
    }
    if (!have_config) throw UsageError("--config FILE is required");
    if (!device.empty()) overrides.push_back("device=" + device);
    mt::Config cfg = mt::load_config(config_path, overrides);
    if (print_config) {
      std::fputs(mt::to_yaml(cfg).c_str(), stdout);
      return 0;
    }
    const mt::parallel::World world = mt::parallel::world_from_env();
    // A launcher's job of one rank runs unlike a plain process only with ZeRO-1 (the sharded
    // path, over a communicator of one).
    if (world.size > 1 || (!world.launcher.empty() && cfg.optim.shard_state)) {
      if (nproc != 1) throw UsageError("--nproc starts a job; this process is already rank " +
                                       std::to_string(world.rank) + " of one (RANK is set)");
      run_worker(cfg, world, resume);
      return 0;
    }
    if (nproc > 1) {
      mt::app::check_job_fits(cfg, mt::train::resolve_device(cfg.device), nproc);  // before spawning
      if (mt::train::resolve_device(cfg.device).is_cpu()) {
#ifdef MT_WITH_GLOO
        return mt::parallel::run_workers(nproc, "/proc/self/exe", worker_args);  // over Gloo
#else
        mt::app::run_local_ranks(cfg, nproc, resume);
        return 0;
#endif
      }
      if (mt::cuda_device_count() < nproc)
        throw mt::ConfigError("--nproc " + std::to_string(nproc) + ": only " +
                              std::to_string(mt::cuda_device_count()) + " GPUs are visible");
      return mt::parallel::run_workers(nproc, "/proc/self/exe", worker_args);
    }
    mt::app::ConfigTrainer trainer(cfg, mt::train::resolve_device(cfg.device));
    if (!resume.empty()) trainer.resume(resume);
    trainer.run();
    return 0;
  } catch (const UsageError& e) {
    // One line that says what to fix; the whole usage only on request (it would bury that line).
    std::fprintf(stderr, "train: %s\n(train --help prints the usage)\n", e.what());
    return 2;
  } catch (const mt::ConfigError& e) {
    std::fprintf(stderr, "train: config error: %s\n", e.what());
    return 2;
  } catch (const mt::app::InferenceError& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 2;
  } catch (const mt::train::CheckpointError& e) {
    std::fprintf(stderr, "train: cannot resume: %s\n", e.what());
    return 2;
  } catch (const mt::train::NonFiniteError& e) {
    std::fprintf(stderr, "%strain: %s\n", fresh_line(), e.what());
    return 3;
  } catch (const mt::data::DataError& e) {
    std::fprintf(stderr, "%strain: data error: %s\n", fresh_line(), e.what());
    return 4;
  } catch (const std::bad_alloc&) {
    // An allocation of the host's memory the checks before it did not price (eval's data, say).
    std::fprintf(stderr, "%strain: error: out of host memory (std::bad_alloc): the data, the "
                 "model or a batch is larger than this machine can hold\n", fresh_line());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%strain: error: %s\n", fresh_line(), e.what());
    return 1;
  }
}
