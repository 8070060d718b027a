#pragma once
// Checkpoints in the safetensors format, so PyTorch and numpy can open what we save:
//
//   [8 bytes: N, little-endian u64] [N bytes: JSON header, space-padded] [tensor bytes]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, offsets
// counted from the first byte after the header, plus an optional "__metadata__" object of
// string -> string. The tensors' bytes follow back to back, in entry order, little-endian.
//
// Writing is atomic (temp file, fsync, rename), so a crash mid-save never costs the last good
// checkpoint. Reading trusts nothing: every length and offset is checked against the file before
// it is used, and anything inconsistent is an mt::Error naming the file.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mt {

struct StEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // numel * dtype_size bytes, row-major, little-endian
};

// Writes `entries` (data in this order) and `metadata` to `path`, replacing any existing file only
// once the new one is complete and on disk. Throws mt::Error, leaving `path` untouched, on bad
// entries (duplicate name, data size not matching the shape) or any I/O failure.
void write_safetensors(const std::string& path, const std::vector<StEntry>& entries,
                       const std::map<std::string, std::string>& metadata);

struct StFile {
  std::string path;  // where it was read from, for error messages
  std::map<std::string, std::string> metadata;
  std::vector<StEntry> entries;  // in the order their data is stored in the file

  const StEntry& at(const std::string& name) const;  // throws mt::Error if absent
  bool contains(const std::string& name) const;
};

// Reads and fully validates a safetensors file. Only the dtypes minitrain has (F64, F32, BF16,
// F16, I64, I32) are accepted.
StFile read_safetensors(const std::string& path);

// The `__metadata__` of a safetensors file, validated like read_safetensors but without reading
// the tensors' bytes: for looking at many checkpoints cheaply.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

}  // namespace mt
