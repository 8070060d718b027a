#pragma once
// Training checkpoints: two safetensors files per saved step, so the model file is exactly what
// PyTorch's `model.load_state_dict(safetensors.torch.load_file(path))` expects:
//
//   <dir>/step-000300.safetensors        model parameters under their dotted names
//                                        (metadata: format, step, the config as YAML)
//   <dir>/step-000300.optim.safetensors  optimizer state and the step it belongs to
//
// Both are written atomically (temp file, fsync, rename), the optimizer file first: a model file
// exists only once its optimizer file does, so the newest model file always names a complete
// checkpoint, even if the process is killed mid-write. Older checkpoints beyond keep_last are
// deleted only after the new one is on disk, model file first; temp and orphaned optimizer files
// left by a killed run are removed after each save.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mt::train {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct Checkpoint {
  int64_t step = 0;  // optimizer steps completed
  NamedTensors model, optimizer;
  std::map<std::string, std::string> metadata;  // the model file's
};

// Saves step `step` into `dir` and prunes to the newest `keep_last`. Returns the model file path.
std::string save_checkpoint(const std::string& dir, int64_t step, const NamedTensors& model,
                            const NamedTensors& optimizer,
                            const std::map<std::string, std::string>& metadata, int64_t keep_last);

// Loads a checkpoint from a model file, or from a directory (its newest complete checkpoint).
// Truncated, corrupt or mismatched files are mt::Errors naming the file.
Checkpoint load_checkpoint(const std::string& path);

// The model files in `dir`, oldest first (empty when there are none or dir doesn't exist).
std::vector<std::string> list_checkpoints(const std::string& dir);

}  // namespace mt::train
