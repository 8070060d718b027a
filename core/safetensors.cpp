#include "core/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/input_file.h"

namespace mt {
namespace {

using Json = nlohmann::ordered_json;  // keeps the header's key order, so entries keep theirs

// The reference implementation refuses larger headers too; a bigger one is corruption, not a model.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeCode {
  DType dtype;
  const char* code;
};
constexpr DTypeCode kDTypeCodes[] = {{DType::f64, "F64"},   {DType::f32, "F32"},
                                     {DType::bf16, "BF16"}, {DType::f16, "F16"},
                                     {DType::i64, "I64"},   {DType::i32, "I32"}};

const char* dtype_code(DType t) {
  for (const auto& c : kDTypeCodes)
    if (c.dtype == t) return c.code;
  MT_THROW("safetensors: unknown dtype ", int(t));
}

bool dtype_from_code(const std::string& code, DType& out) {
  for (const auto& c : kDTypeCodes)
    if (code == c.code) {
      out = c.dtype;
      return true;
    }
  return false;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Bytes taken by a tensor of `shape` with `elem`-byte elements; false if a dimension is negative
// or the count does not fit in 64 bits.
bool byte_size(const std::vector<int64_t>& shape, uint64_t elem, uint64_t& bytes) {
  uint64_t n = elem;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / uint64_t(d)) return false;
    n *= uint64_t(d);
  }
  bytes = n;
  return true;
}

std::string os_error() { return std::strerror(errno); }

// ---- writing ----

// The JSON header, validating the entries on the way and space-padded so that the data starts
// 8-byte aligned (8-byte length + header).
std::string build_header(const std::string& path, const std::vector<StEntry>& entries,
                         const std::map<std::string, std::string>& metadata) {
  Json h = Json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const StEntry& e : entries) {
    MT_CHECK(!e.name.empty(), path, ": cannot save a tensor with an empty name");
    MT_CHECK(e.name != "__metadata__", path, ": '__metadata__' is reserved, not a tensor name");
    MT_CHECK(names.insert(e.name).second, path, ": duplicate tensor name '", e.name, "'");
    uint64_t bytes = 0;
    MT_CHECK(byte_size(e.shape, dtype_size(e.dtype), bytes), path, ": tensor '", e.name,
             "': invalid shape ", shape_str(e.shape));
    MT_CHECK(bytes == e.data.size(), path, ": tensor '", e.name, "': shape ", shape_str(e.shape),
             " of ", dtype_name(e.dtype), " needs ", bytes, " bytes but its data has ",
             e.data.size());
    h[e.name] = {{"dtype", dtype_code(e.dtype)},
                 {"shape", e.shape},
                 {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const nlohmann::json::exception& ex) {
    MT_THROW(path, ": tensor names and metadata must be valid UTF-8 (", ex.what(), ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// ---- reading ----

void read_exact(FILE* f, void* dst, size_t n, const std::string& path, const char* what) {
  if (n == 0 || std::fread(dst, 1, n, f) == n) return;
  MT_THROW(path, ": cannot read ", what, ": ",
           std::ferror(f) ? os_error() : "file ended early (was it modified while reading?)");
}

// A JSON value that must be a non-negative integer.
bool as_u64(const Json& v, uint64_t& out) {
  if (!v.is_number_unsigned()) return false;
  out = v.get<uint64_t>();
  return true;
}

// One tensor's header entry, checked on its own; `begin`/`end` are its data_offsets.
StEntry parse_entry(const std::string& path, const std::string& name, const Json& v,
                    uint64_t& begin, uint64_t& end) {
  const std::string where = path + ": tensor '" + name + "'";
  MT_CHECK(v.is_object(), where, ": expected an object with dtype, shape and data_offsets, got ",
           v.dump());
  for (const auto& [key, _] : v.items())
    MT_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where,
             ": unexpected field '", key, "'");
  MT_CHECK(v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"), where,
           ": needs dtype, shape and data_offsets, got ", v.dump());

  StEntry e;
  e.name = name;
  const Json& dt = v["dtype"];
  MT_CHECK(dt.is_string() && dtype_from_code(dt.get<std::string>(), e.dtype), where,
           ": unsupported dtype ", dt.dump(), " (minitrain reads F64, F32, BF16, F16, I64, I32)");

  const Json& shape = v["shape"];
  MT_CHECK(shape.is_array(), where, ": shape must be an array, got ", shape.dump());
  for (const Json& d : shape) {
    uint64_t n = 0;
    MT_CHECK(as_u64(d, n) && n <= uint64_t(std::numeric_limits<int64_t>::max()), where, ": shape ",
             shape.dump(), " has an invalid dimension ", d.dump());
    e.shape.push_back(int64_t(n));
  }
  uint64_t bytes = 0;
  MT_CHECK(byte_size(e.shape, dtype_size(e.dtype), bytes), where, ": shape ", shape.dump(),
           " has more elements than fit in 64 bits");

  const Json& off = v["data_offsets"];
  MT_CHECK(off.is_array() && off.size() == 2 && as_u64(off[0], begin) && as_u64(off[1], end), where,
           ": data_offsets must be two non-negative integers, got ", off.dump());
  MT_CHECK(begin <= end, where, ": data_offsets ", off.dump(), " end before they begin");
  MT_CHECK(end - begin == bytes, where, ": data_offsets ", off.dump(), " span ", end - begin,
           " bytes but shape ", shape.dump(), " of ", dt.get<std::string>(), " needs ", bytes);
  return e;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<StEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = build_header(path, entries, metadata);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(header.size()) >> (8 * i));

  AtomicFile out(path);
  out.write(len, 8);
  out.write(header.data(), header.size());
  for (const StEntry& e : entries) out.write(e.data.data(), e.data.size());
  out.commit();
}

namespace {

// The reader behind both entry points: with `with_data` false it validates everything the header
// says against the file's size but reads no tensor bytes (entries keep empty data).
StFile read_file(const std::string& path, bool with_data) {
  const int fd = open_regular_file(path);  // a FIFO named like a checkpoint must not block
  std::unique_ptr<FILE, int (*)(FILE*)> file(::fdopen(fd, "rb"), &std::fclose);
  if (!file) ::close(fd);
  MT_CHECK(file, path, ": cannot open: ", os_error());
  FILE* f = file.get();
  struct stat st {};
  MT_CHECK(::fstat(::fileno(f), &st) == 0, path, ": cannot stat: ", os_error());
  const uint64_t file_size = uint64_t(st.st_size);

  MT_CHECK(file_size >= 8, path, ": truncated: ", file_size,
           " bytes is too short for the 8-byte header length");
  uint8_t len[8];
  read_exact(f, len, 8, path, "the header length");
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= uint64_t(len[i]) << (8 * i);
  if (header_size > file_size - 8) {
    // A file of another kind (a config, a CSV) reads as a huge length: say that, not "truncated".
    char first = 0;
    const bool json = file_size == 8 || (::pread(::fileno(f), &first, 1, 8) == 1 && first == '{');
    MT_CHECK(json, path, ": not a safetensors file: its first 8 bytes are not a header length ",
             "followed by a JSON header ('{')");
    MT_THROW(path, ": truncated: header length says ", header_size, " bytes but only ",
             file_size - 8, " follow");
  }
  MT_CHECK(header_size <= kMaxHeaderBytes, path, ": header length ", header_size,
           " is over the 100 MB limit; the file is corrupt");

  std::string text(header_size, '\0');
  read_exact(f, text.data(), text.size(), path, "the header");
  // The JSON parser would stop quietly at a NUL byte; the header is text, so a NUL is corruption.
  MT_CHECK(text.find('\0') == std::string::npos, path, ": header contains a NUL byte at offset ",
           8 + text.find('\0'));
  // A header nests three deep (header, tensor, shape); anything deeper is refused as it is met,
  // before printing it for an error (dump() recurses once per level: 100,000 levels overflowed
  // the stack). A key given twice in one object is refused too: the parser would keep the last
  // silently, a second dtype, say, or a second tensor of the same name.
  std::vector<std::set<std::string>> keys;  // of each open object
  const Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    using E = Json::parse_event_t;
    if (event == E::object_start || event == E::array_start) {
      MT_CHECK(depth <= 2, path, ": header nests deeper than a safetensors header does (",
               "objects or arrays ", depth + 1, " levels deep)");
      if (event == E::object_start) keys.emplace_back();
    } else if (event == E::object_end) {
      keys.pop_back();
    } else if (event == E::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      MT_CHECK(keys.back().insert(key).second, path, ": header gives '", key, "' twice in one ",
               "object");
    }
    return true;
  };
  Json h;
  try {
    h = Json::parse(text, check);
  } catch (const nlohmann::json::exception& ex) {
    MT_THROW(path, ": header is not valid JSON: ", ex.what());
  }
  MT_CHECK(h.is_object(), path, ": header must be a JSON object, got ", h.type_name());

  StFile out;
  out.path = path;
  struct Span {
    uint64_t begin, end;
    size_t entry;
  };
  std::vector<Span> spans;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      MT_CHECK(v.is_object(), path, ": __metadata__ must be an object, got ", v.dump());
      for (const auto& [key, value] : v.items()) {
        MT_CHECK(value.is_string(), path, ": __metadata__ value of '", key,
                 "' must be a string, got ", value.dump());
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    Span s{};
    out.entries.push_back(parse_entry(path, name, v, s.begin, s.end));
    s.entry = out.entries.size() - 1;
    spans.push_back(s);
  }

  // The tensors must tile the data area exactly: sorted by offset, each starts where the
  // previous one ended, and the last ends at the end of the file.
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    const std::string& name = out.entries[s.entry].name;
    MT_CHECK(s.begin >= expected, path, ": tensor '", name, "' data [", s.begin, ", ", s.end,
             ") overlaps tensor '", out.entries[spans[i - 1].entry].name, "', which ends at ",
             expected);
    MT_CHECK(s.begin == expected, path, ": tensor '", name, "' data starts at ", s.begin,
             ", leaving a gap after offset ", expected);
    expected = s.end;
  }
  const uint64_t available = file_size - 8 - header_size;
  MT_CHECK(expected <= available, path, ": truncated: header says ", expected,
           " bytes of data but file has ", available);
  MT_CHECK(expected == available, path, ": ", available - expected,
           " bytes of trailing garbage after the ", expected, " bytes of tensor data");

  // Only now, with every size checked against the file, allocate and read.
  std::vector<StEntry> ordered;
  ordered.reserve(spans.size());
  for (const Span& s : spans) {
    StEntry& e = out.entries[s.entry];
    if (with_data) {
      e.data.resize(s.end - s.begin);
      read_exact(f, e.data.data(), e.data.size(), path, ("tensor '" + e.name + "'").c_str());
    }
    ordered.push_back(std::move(e));
  }
  out.entries = std::move(ordered);
  return out;
}

}  // namespace

StFile read_safetensors(const std::string& path) { return read_file(path, true); }

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  return read_file(path, false).metadata;
}

const StEntry& StFile::at(const std::string& name) const {
  for (const StEntry& e : entries)
    if (e.name == name) return e;
  MT_THROW(path, ": no tensor named '", name, "'");
}

bool StFile::contains(const std::string& name) const {
  return std::any_of(entries.begin(), entries.end(),
                     [&](const StEntry& e) { return e.name == name; });
}

// ---- checksums ----

namespace {

const std::string kMetadataCrc = std::string(kChecksumPrefix) + "__metadata__";

// CRC-32 over a sequence of fields, each length-prefixed so that no two sequences share a stream.
// An empty field adds its length only: crc32_z(crc, NULL, 0) does not add nothing, it returns the
// initial value, which once dropped everything before a 0-d tensor's shape (`legacy` keeps that
// rule, to verify files sealed with it).
class Crc {
 public:
  explicit Crc(bool legacy = false) : legacy_(legacy) {}
  Crc& add(const void* p, size_t n) {
    const uint64_t len = n;
    crc_ = crc32_z(crc_, reinterpret_cast<const Bytef*>(&len), sizeof len);
    if (n > 0 || (legacy_ && p == nullptr)) crc_ = crc32_z(crc_, static_cast<const Bytef*>(p), n);
    return *this;
  }
  Crc& add(const std::string& s) { return add(s.data(), s.size()); }
  std::string hex() const {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08lx", static_cast<unsigned long>(crc_));
    return buf;
  }

 private:
  bool legacy_;
  uLong crc_ = crc32_z(0, nullptr, 0);
};

std::string tensor_crc(const StEntry& e, bool legacy = false) {
  Crc c(legacy);
  c.add(e.name).add(std::string(dtype_name(e.dtype))).add(e.shape.data(), e.shape.size() * 8);
  return c.add(e.data.data(), e.data.size()).hex();
}

std::string metadata_crc(const std::map<std::string, std::string>& metadata) {
  Crc c;
  for (const auto& [key, value] : metadata)
    if (key != kMetadataCrc) c.add(key).add(value);
  return c.hex();
}

bool is_checksum_key(const std::string& key) { return key.starts_with(kChecksumPrefix) || key == kChecksumRule; }

// Whether the legacy rule left part of e uncovered: a 0-d shape or no data.
bool has_empty_field(const StEntry& e) { return e.shape.empty() || e.data.empty(); }

}  // namespace

std::map<std::string, std::string> seal_metadata(std::map<std::string, std::string> metadata,
                                                 const std::vector<StEntry>& entries) {
  for (const auto& [key, _] : metadata)
    MT_CHECK(!is_checksum_key(key), "safetensors: metadata key '", key, "' is reserved (the '",
             kChecksumPrefix, "' keys and '", kChecksumRule, "' hold the file's checksums)");
  for (const StEntry& e : entries) metadata[kChecksumPrefix + e.name] = tensor_crc(e);
  metadata[kChecksumRule] = kChecksumRuleVersion;
  metadata[kMetadataCrc] = metadata_crc(metadata);
  return metadata;
}

void verify_checksums(const StFile& f, bool accept_legacy) {
  auto stored = f.metadata.find(kMetadataCrc);
  MT_CHECK(stored != f.metadata.end(), f.path, ": damaged: metadata has no '", kMetadataCrc,
           "' (a file minitrain wrote always has it)");
  const std::string meta = metadata_crc(f.metadata);
  MT_CHECK(stored->second == meta, f.path, ": damaged: the metadata fails its checksum (stored ",
           stored->second, ", computed ", meta, ")");
  auto rule = f.metadata.find(kChecksumRule);
  MT_CHECK(rule == f.metadata.end() || rule->second == kChecksumRuleVersion, f.path, ": metadata '",
           kChecksumRule, "' is '", rule->second, "', a rule this build does not know");
  const bool legacy = rule == f.metadata.end();
  if (legacy)
    for (const StEntry& e : f.entries)
      MT_CHECK(accept_legacy || !has_empty_field(e), f.path, ": its checksums were made before they "
               "covered the name, dtype and shape of 0-d and empty tensors, such as '", e.name,
               "': it cannot be fully verified");
  size_t listed = 0;
  for (const auto& [key, value] : f.metadata)
    if (is_checksum_key(key) && key != kMetadataCrc && key != kChecksumRule) {
      ++listed;
      const std::string name = key.substr(std::strlen(kChecksumPrefix));
      MT_CHECK(f.contains(name), f.path, ": damaged: tensor '", name,
               "' has a checksum but is not in the file");
    }
  for (const StEntry& e : f.entries) {
    auto it = f.metadata.find(kChecksumPrefix + e.name);
    MT_CHECK(it != f.metadata.end(), f.path, ": damaged: tensor '", e.name, "' has no checksum");
    const std::string crc = tensor_crc(e, legacy);
    MT_CHECK(it->second == crc, f.path, ": damaged: tensor '", e.name,
             "' fails its checksum (stored ", it->second, ", computed ", crc, ")");
  }
  MT_CHECK(listed == f.entries.size(), f.path, ": damaged: ", listed, " tensor checksums for ",
           f.entries.size(), " tensors");
}

std::map<std::string, std::string> without_checksums(std::map<std::string, std::string> metadata) {
  std::erase_if(metadata, [](const auto& kv) { return is_checksum_key(kv.first); });
  return metadata;
}

}  // namespace mt
