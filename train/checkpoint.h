#pragma once
// Training checkpoints: two files per saved step, each one nn::save_tensors wrote (nn/serialize.h:
// safetensors with checksums), so the model file is exactly what nn::load and PyTorch's
// `model.load_state_dict(safetensors.torch.load_file(path))` expect:
//
//   <dir>/step-000300.safetensors        model parameters under their dotted names
//                                        (metadata: the config as YAML, with data.standardize
//                                        the feature statistics, the trainer's run_steps (the
//                                        run's length), and the keys below)
//   <dir>/step-000300.optim.safetensors  optimizer state (metadata: the keys below)
//
// Both files' metadata (string -> string; other readers ignore keys they do not know) holds
//   format         "minitrain-checkpoint-3"
//   step           optimizer steps completed, in decimal; the file name's number too
//   run_id         the run that wrote it: pruning only ever removes the current run's checkpoints
//   checkpoint_id  random, one per saved step: proves a model and an optimizer file belong together
//   crc32.<name>   CRC-32 of a tensor's name, dtype, shape and bytes, 8 hex digits
//   crc32.__metadata__  CRC-32 of every other metadata key and value (core/safetensors.h)
// and loading verifies all of them, so a bit flipped anywhere (or two tensors swapped) is an
// error naming the file and the tensor. Older formats load only when asked for with
// MT_ALLOW_OLD_CHECKPOINTS=1, with a warning: format 1 has no checksums, format 2's did not
// cover 0-d tensors' names, dtypes and shapes (core/safetensors.h). A file that says format 1 but
// carries checksums is damaged (a relabelled newer one), whatever the variable says.
//
// Both are written atomically (temp file, fsync, rename, directory fsync): both temp files are
// whole on disk before either is renamed, the optimizer file first, so a save that fails changes
// no file, and a model file exists only once its optimizer file does: the newest model file
// always names a complete checkpoint, even if the process is killed mid-write. Older checkpoints
// of the run beyond keep_last are deleted only after the new one is on disk, model file first
// (a later step's checkpoint neither counts nor goes); temp and
// orphaned optimizer files left by a killed run are removed after each save. The folder is the
// run's alone while it runs (train/run_dir.h), so no other process writes there meanwhile.
//
// With checkpoint.keep_best, the step of the lowest validation loss so far is also saved as
//
//   <dir>/best.safetensors, <dir>/best.optim.safetensors    (metadata also: val_loss)
//
// the same two files under a name of their own: never pruned, and never what a directory loads
// (--resume DIR takes the newest step-*; --resume DIR/best.safetensors continues from the best).
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace mt::train {

// A checkpoint that is missing, damaged, or does not fit the run resuming from it. `train` exits
// with code 2: nothing has been written.
struct CheckpointError : Error {
  using Error::Error;
};

struct Checkpoint {
  std::string path;  // the model file it was loaded from
  int64_t step = 0;  // optimizer steps completed
  std::string run_id;  // empty for a format 1 checkpoint
  nn::StateDict model, optimizer;
  std::map<std::string, std::string> metadata;  // the model file's, without the checksums
};

// Saves step `step` of run `run_id` into `dir`, then prunes that run's checkpoints to the newest
// `keep_last` (other runs' checkpoints are left alone). `metadata` must not use the keys above.
// Returns the model file path.
std::string save_checkpoint(const std::string& dir, const std::string& run_id, int64_t step,
                            const nn::StateDict& model, const nn::StateDict& optimizer,
                            const std::map<std::string, std::string>& metadata, int64_t keep_last);

// Saves step `step` as the run's best checkpoint, <dir>/best.safetensors (and its optimizer
// file), replacing the previous best; `val_loss` goes into both files' metadata. Returns the
// model file path.
std::string save_best_checkpoint(const std::string& dir, const std::string& run_id, int64_t step,
                                 double val_loss, const nn::StateDict& model,
                                 const nn::StateDict& optimizer,
                                 const std::map<std::string, std::string>& metadata);

// <dir>/best.safetensors.
std::string best_checkpoint_path(const std::string& dir);

// Loads a checkpoint from a model file, or from a directory: its newest checkpoint that is intact
// and that `accept` (when given) takes without throwing mt::Error. A damaged newer one is skipped
// with a warning naming the file and why. Any failure is a CheckpointError naming the file(s).
Checkpoint load_checkpoint(const std::string& path,
                           const std::function<void(const Checkpoint&)>& accept = {});

// Calls `read` on `dir`'s model files, newest first, until one call does not throw mt::Error
// (load_checkpoint reads a whole checkpoint, `train eval` a model file alone): each one passed
// over is a warning naming it and why, and a fallback names the file used. A CheckpointError
// naming every reason when none reads.
void newest_that_reads(const std::string& dir, const std::function<void(const std::string&)>& read);

// The model files in `dir`, ordered by step, oldest first; names that are not
// step-<number>.safetensors are left out (empty when there are none or dir doesn't exist).
std::vector<std::string> list_checkpoints(const std::string& dir);

// The step in the name of a model file list_checkpoints gave.
int64_t checkpoint_name_step(const std::string& model_path);

// The run id in a model file's metadata ("" for a format 1 file), read from its header alone.
std::string checkpoint_run_id(const std::string& model_path);

// Deletes a checkpoint: its model file first, then its optimizer file.
void remove_checkpoint(const std::string& model_path);

// Renames a checkpoint out of list_checkpoints' sight, its model file to
// step-N.skipped.safetensors and its optimizer file (if any) to step-N.skipped.optim.safetensors;
// returns the new model file's path. mt::Error when a rename fails.
std::string move_checkpoint_aside(const std::string& model_path);

// A fresh random id (16 hex digits) for a run or a checkpoint.
std::string random_id();

}  // namespace mt::train
