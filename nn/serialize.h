#pragma once
// Saving and loading a module's state, and any list of named tensors, as safetensors files
// (core/safetensors.h) that PyTorch reads as they are:
//
//   nn::save(model, "model.safetensors", {{"note", "after epoch 3"}});
//   auto metadata = nn::load(model, "model.safetensors");     // strict, as in PyTorch
//
//   # Python
//   model.load_state_dict(safetensors.torch.load_file("model.safetensors"))
//
// Tensor names are the state_dict's dotted names ("layers.0.weight"): a module's parameters and
// buffers, nothing else (a bf16 compute copy is derived from its fp32 parameter, so it is not
// saved; loading rebuilds it). Every file is written atomically (temp file, fsync, rename,
// directory fsync: a crash mid-save leaves the old file whole) and carries CRC-32 checksums of
// every tensor and of the metadata, which loading verifies: a bit flipped anywhere in the file is
// an mt::Error naming the file and the tensor, never a silently different model.
//
// Metadata is string -> string, for the caller (training checkpoints keep their config there);
// the keys starting "crc32." and the key "checksum_rule" are the checksums' and are reserved.
#include <map>
#include <string>

#include "core/safetensors.h"
#include "nn/module.h"

namespace mt::nn {

using Metadata = std::map<std::string, std::string>;

// ---- a module ------------------------------------------------------------------------------
// Saves m.state_dict() (copied to the host; the module is left as it is) with `metadata`.
void save(const Module& m, const std::string& path, const Metadata& metadata = {});

// Verifies `path` and copies its tensors into `m` (Module::load_state_dict: strict by default, so
// a missing or unexpected key, or a shape or dtype that differs, is an error naming the key and
// both sides, and nothing is copied). Returns the metadata `save` was given.
Metadata load(Module& m, const std::string& path, bool strict = true);

// ---- a list of named tensors (an optimizer's state, a batch) ----------------------------------
// Throws mt::Error, leaving `path` untouched, on a duplicate or empty name, a reserved metadata
// key, or an I/O failure.
void save_tensors(const std::string& path, const StateDict& tensors, const Metadata& metadata = {});

struct TensorFile {
  StateDict tensors;  // host tensors, in the file's order
  Metadata metadata;  // without the checksums
};
// Reads `path` and verifies its checksums (a file without them is refused too: it was not written
// here, so it cannot be verified; read it with read_safetensors and tensors_of if that is fine).
TensorFile load_tensors(const std::string& path);

// The tensors of a file already read, as host tensors in the file's order, without verifying
// anything beyond what read_safetensors did: call verify_checksums(f) first where it must be intact.
StateDict tensors_of(const StFile& f);

}  // namespace mt::nn
