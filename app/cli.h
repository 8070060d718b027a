#pragma once
// The `train` program (app/main.cpp is only its entry point): training from a YAML config, data
// parallel jobs, and the commands on a saved model. As a function, so that tests run the program
// as a user does, with model and data kinds they register themselves (app/registry.h).
//
//   train --config FILE [--set key.path=value]... [--device auto|cpu|cuda[:N]] [--resume CKPT]
//         [--nproc N] [--print-config]
//   train eval --checkpoint CKPT [--split test|val] [--set data.key=value]... [--device DEVICE]
//   train predict --checkpoint CKPT --input X.csv --output P.csv [--set ...]... [--device DEVICE]
//   train sample --checkpoint CKPT [--prompt TEXT] [--tokens N] ...   (app/lm_commands.h)
//   train tokenize --input TEXT --output SHARD.bin [--tokenizer bytes|gpt2] [--gpt2-dir DIR]
//   train --list-ops | --config-reference | --help | --version
//
// Exit codes (the usage text prints the same table; docs/guide.md, "Troubleshooting"):
//   0  success, also resuming a run that is already complete
//   1  a runtime error: a failed write, a CUDA error, anything unexpected
//   2  a usage or config error: the command line, the config, a device that is not there, a
//      --resume / --checkpoint that is missing, damaged or does not fit, a checkpoint.dir another
//      run holds, data that does not fit the model (nothing is written)
//   3  a non-finite loss, gradient or state: the run stops before saving it
//   4  a data error: a data file that cannot be read or parsed (the message names file and line)
#include <string>

namespace mt::app {

// Runs the program on argv (argv[0] is the program's name) and returns its exit code; errors are
// printed to stderr, never thrown. `version` is what --version prints. --nproc starts worker
// processes of /proc/self/exe, which must then be the `train` program itself.
int run_cli(int argc, char** argv, const std::string& version = "minitrain " MT_VERSION "\n");

// Whether stdout and stderr are both terminals (taken to be one). Then the message of an error
// found while running (exit 1, 3 or 4) starts with a newline, which ends the line stdout may
// have left open there (the live progress line, text being sampled); anywhere else the message
// is a line of its own already.
bool errors_share_the_terminal();

}  // namespace mt::app
