#pragma once
// Using a trained model without writing C++: `train eval` and `train predict` (app/cli.cpp)
// are these functions.
//
// A checkpoint's model file is an nn::save file whose metadata holds the run's config as YAML
// (train/checkpoint.h); that config rebuilds the model (build_model) and names the data, so a
// model file alone is enough. The data goes through the training run's own loaders
// (data::load_dataset), so it gets whatever they applied (MNIST's normalization, say).
//
//   train eval --checkpoint runs/mlp/step-000300.safetensors
//   test: loss 0.1234 | accuracy 0.9688 (4000 samples)      <- the line the training run printed
//   train eval --checkpoint runs/shakespeare                 (a GPT: its validation windows)
//   val: loss 2.144 | bpb 3.0931 | ppl 8.5334 (128 windows)
//
//   train predict --checkpoint runs/mlp --input x.csv --output p.csv
//   p.csv:  class,p0,p1,...,p7         one row per input row: the predicted class (the largest
//           3,0.00124,...,0.0312        logit, the first on ties) and the softmax probabilities
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/data.h"
#include "nn/module.h"
#include "nn/serialize.h"
#include "app/config.h"
#include "train/evaluate.h"

namespace mt::app {

// A checkpoint or an input file that `train eval` / `train predict` cannot use (missing, damaged,
// not a model file, the wrong width): `train` exits with code 2, having written nothing.
struct InferenceError : Error {
  using Error::Error;
};

// A model file `train` saved, as read from `checkpoint`: the file itself, or a checkpoint
// directory's newest model file that reads (as --resume takes it, but without needing the
// optimizer file; one older than the newest is named in a warning), every checksum verified. A file
// without the run's config, one holding a model of the program that trained it (only that
// program can build it), or one with a non-finite value (a run never saves one: damage) is an
// InferenceError naming the file.
struct ModelFile {
  std::string path;  // the model file
  nn::TensorFile file;
};
ModelFile read_model_file(const std::string& checkpoint);

// A model as its training run left it, ready for inference.
struct SavedModel {
  std::string path;  // the model file it came from
  Config config;     // the one stored in it, with the overrides applied
  Device device;     // config.device, resolved
  std::shared_ptr<nn::Module> model;  // on `device`, in eval mode, in the run's compute dtype
  data::Standardization standardization;  // the run's (data.standardize), applied to every input
};

// Loads a model file, or a checkpoint directory's newest intact model file (read_model_file),
// verifying every checksum. `overrides` ("key.path=value", as --set) may change only data.*,
// eval.* and device: the model is the checkpoint's (anything else is a ConfigError).
SavedModel load_saved_model(const std::string& checkpoint,
                            const std::vector<std::string>& overrides = {});

struct CheckpointEvaluation : train::Evaluation {  // the mean loss and the task's metrics
  std::string split;  // "test" or "val"
  int64_t samples = 0;
  std::string unit = "samples";  // what `samples` counts: "windows" for token data
};

// Mean cross-entropy and accuracy (the classification task) on `split`: "test" (the config's test set) or "val" (the
// validation part of the training data, split as the run split it); "" is "test". Token data
// (data.kind text or tokens, a GPT) has no test set: "" is "val" there, its validation windows,
// with the model's own task (loss in nats per token, "bpb", "ppl"). Computed as the trainer
// does (train::evaluate: batches of eval.batch_size, the run's device and compute dtype), so on the data of the run
// it reproduces the run's numbers. A ConfigError when the split does not exist or the data does
// not fit the model.
CheckpointEvaluation evaluate_checkpoint(const std::string& checkpoint,
                               const std::vector<std::string>& overrides = {},
                               const std::string& split = "");

// "test: loss 0.1234 | accuracy 0.9688 (4000 samples)": the format of the training run's line.
std::string format_evaluation(const CheckpointEvaluation& e);

// Reads `input` (features only, model.input numbers a row; a header line when data.header says
// so, or for "auto" when its first line is not all numbers), standardizes it as the run did
// (data.standardize), and writes `output` as "class,p0,...,p{C-1}" and one row per sample, probabilities to 9
// significant digits (a float's round trip). The output is written to a temp file and renamed
// into place: it appears whole or not at all. An input that cannot be read or parsed is a
// data::DataError, one of the wrong width an InferenceError, each naming the file and line. Returns the number of rows written.
// A language model (token data: model.kind gpt) is an InferenceError pointing to `train sample`.
int64_t predict_csv(const std::string& checkpoint, const std::string& input,
                    const std::string& output, const std::vector<std::string>& overrides = {});

// An output a command writes whole, by a rename (`flag` names it in the error, e.g. "predict:
// --output"): a new or a regular file, none of `inputs` (the files the command reads), and not
// an existing file of a kind a training run keeps (.safetensors, .jsonl, .svg, .lock, .yaml,
// .yml). A symbolic link would be replaced rather than followed, a FIFO or a device, whose reader
// expects a stream, lost, and an input or a run's file overwritten. An InferenceError otherwise
// (exit code 2).
void check_output_file(const std::string& flag, const std::string& output,
                       const std::vector<std::string>& inputs);

}  // namespace mt::app
