#pragma once
// The safetensors file format, so PyTorch and numpy can open what we save:
//
//   [8 bytes: N, little-endian u64] [N bytes: JSON header, space-padded] [tensor bytes]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, offsets
// counted from the first byte after the header, plus an optional "__metadata__" object of
// string -> string. The tensors' bytes follow back to back, in entry order, little-endian.
//
// Writing is atomic (temp file, fsync, rename, directory fsync), so a crash mid-save never costs
// the file it replaces. Reading trusts nothing: every length and offset is checked against the
// file before it is used, and anything inconsistent is an mt::Error naming the file.
//
// A well-formed file can still hold flipped bits. The checksums below, kept in the metadata where
// other readers ignore them, catch those: every file minitrain writes carries them
// (nn::save_tensors, nn/serialize.h). This layer handles bytes only; Tensors are nn's business.
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

// ---- checksums ----
// Metadata keys of a file that carries checksums (8 hex digits each):
//   crc32.<name>        CRC-32 of a tensor's name, dtype, shape and bytes
//   crc32.__metadata__  CRC-32 of every other metadata key and value
//   checksum_rule       "2": every field counts, empty ones too. Files sealed before it have no
//                       such key; their checksums did not cover a 0-d or empty tensor's name,
//                       dtype and shape (an empty field restarted the CRC).
// With both, a bit flipped anywhere in the file, or two same-shape tensors swapped, is found.
inline constexpr const char* kChecksumPrefix = "crc32.";
inline constexpr const char* kChecksumRule = "checksum_rule";
inline constexpr const char* kChecksumRuleVersion = "2";

// `metadata` plus the checksums of `entries` and then of the metadata itself: what to write the
// entries with. `metadata` must not already use the prefix or kChecksumRule (mt::Error naming
// the key).
std::map<std::string, std::string> seal_metadata(std::map<std::string, std::string> metadata,
                                                 const std::vector<StEntry>& entries);

// Every checksum of `f` matches and every tensor has one; otherwise an mt::Error as
// "<path>: damaged: tensor 'w' fails its checksum (stored ..., computed ...)". A file sealed by
// the old rule is verified by it, and refused if it has a 0-d or empty tensor (which that rule did
// not cover) unless `accept_legacy`.
void verify_checksums(const StFile& f, bool accept_legacy = false);

// `metadata` without the checksum keys (and checksum_rule): what the writer passed to seal_metadata.
std::map<std::string, std::string> without_checksums(std::map<std::string, std::string> metadata);

}  // namespace mt
