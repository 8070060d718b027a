#include "nn/serialize.h"

#include <cstring>

namespace mt::nn {
namespace {

std::vector<StEntry> to_entries(const std::string& path, const StateDict& tensors) {
  std::vector<StEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    MT_CHECK(t.defined(), path, ": cannot save tensor '", name, "': it is undefined");
    const Tensor c = t.detach().to(kCPU).contiguous();
    StEntry e{name, c.dtype(), c.shape(), {}};
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    e.data.assign(p, p + c.nbytes());
    entries.push_back(std::move(e));
  }
  return entries;
}

}  // namespace

void save_tensors(const std::string& path, const StateDict& tensors, const Metadata& metadata) {
  const std::vector<StEntry> entries = to_entries(path, tensors);
  write_safetensors(path, entries, seal_metadata(metadata, entries));
}

StateDict tensors_of(const StFile& f) {
  StateDict out;
  out.reserve(f.entries.size());
  for (const StEntry& e : f.entries) {
    Tensor t = empty(e.shape, e.dtype);
    if (!e.data.empty()) std::memcpy(t.data_ptr(), e.data.data(), e.data.size());
    out.emplace_back(e.name, t);
  }
  return out;
}

TensorFile load_tensors(const std::string& path) {
  const StFile f = read_safetensors(path);
  verify_checksums(f);
  return {tensors_of(f), without_checksums(f.metadata)};
}

void save(const Module& m, const std::string& path, const Metadata& metadata) {
  save_tensors(path, m.state_dict(), metadata);
}

Metadata load(Module& m, const std::string& path, bool strict) {
  TensorFile f = load_tensors(path);
  try {
    m.load_state_dict(f.tensors, strict);
  } catch (const Error& e) {
    MT_THROW(path, ": ", e.what());
  }
  return std::move(f.metadata);
}

}  // namespace mt::nn
