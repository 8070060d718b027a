#include "train/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "train/safetensors.h"

namespace fs = std::filesystem;

namespace mt::train {
namespace {

constexpr const char* kFormat = "minitrain-checkpoint-1";

std::vector<StEntry> to_entries(const NamedTensors& tensors) {
  std::vector<StEntry> entries;
  for (const auto& [name, t] : tensors) {
    Tensor c = t.detach().to(kCPU).contiguous();
    StEntry e{name, c.dtype(), c.shape(), {}};
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    e.data.assign(p, p + c.nbytes());
    entries.push_back(std::move(e));
  }
  return entries;
}

NamedTensors from_file(const StFile& f) {
  NamedTensors out;
  for (const StEntry& e : f.entries) {
    Tensor t = empty(e.shape, e.dtype);
    if (!e.data.empty()) std::memcpy(t.data_ptr(), e.data.data(), e.data.size());
    out.emplace_back(e.name, t);
  }
  return out;
}

std::string step_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::string optim_path_for(const std::string& model_path) {
  const std::string suffix = ".safetensors";
  return model_path.substr(0, model_path.size() - suffix.size()) + ".optim" + suffix;
}

// What a run killed mid-save leaves behind: temp files (write_safetensors names them
// "<target>.tmp.<pid>") and optimizer files whose model file never got renamed into place, or
// was already pruned. Loading never looks at them; removing them after each save keeps them from
// piling up over many interrupted runs. This process's own save has finished by then, so none of
// the temp files is in use.
void remove_debris(const std::string& dir) {
  const std::string optim_suffix = ".optim.safetensors";
  std::error_code ec;
  std::vector<fs::path> debris;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string path = entry.path().string(), name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    const bool temp = name.find(".safetensors.tmp.") != std::string::npos;
    const bool orphan =
        name.ends_with(optim_suffix) &&
        !fs::exists(path.substr(0, path.size() - optim_suffix.size()) + ".safetensors", ec);
    if (temp || orphan) debris.push_back(entry.path());
  }
  for (const fs::path& p : debris) fs::remove(p, ec);
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.size() > 17 &&
        name.compare(name.size() - 12, 12, ".safetensors") == 0 &&
        name.find(".optim.") == std::string::npos)
      files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());  // zero-padded step numbers sort by step
  return files;
}

std::string save_checkpoint(const std::string& dir, int64_t step, const NamedTensors& model,
                            const NamedTensors& optimizer,
                            const std::map<std::string, std::string>& metadata, int64_t keep_last) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, "checkpoint: cannot create directory '", dir, "': ", ec.message());
  const std::string model_path = (fs::path(dir) / (step_name(step) + ".safetensors")).string();
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = kFormat;
  meta["step"] = std::to_string(step);
  write_safetensors(optim_path_for(model_path), to_entries(optimizer),
                    {{"format", kFormat}, {"step", std::to_string(step)}});
  write_safetensors(model_path, to_entries(model), meta);
  std::vector<std::string> all = list_checkpoints(dir);
  // The model file goes first, so that a model file never outlives its optimizer file.
  for (size_t i = 0; i + size_t(keep_last) < all.size(); ++i) {
    fs::remove(all[i], ec);
    fs::remove(optim_path_for(all[i]), ec);
  }
  remove_debris(dir);
  return model_path;
}

Checkpoint load_checkpoint(const std::string& path) {
  std::string model_path = path;
  if (fs::is_directory(path)) {
    std::vector<std::string> all = list_checkpoints(path);
    MT_CHECK(!all.empty(), "checkpoint: no step-*.safetensors checkpoint in '", path, "'");
    model_path = all.back();
  }
  MT_CHECK(fs::exists(model_path), "checkpoint: '", model_path, "' does not exist");
  StFile model = read_safetensors(model_path);
  auto format = model.metadata.find("format");
  MT_CHECK(format != model.metadata.end() && format->second == kFormat, model_path,
           ": not a minitrain checkpoint (metadata 'format' is missing or not '", kFormat, "')");
  const std::string optim_path = optim_path_for(model_path);
  MT_CHECK(fs::exists(optim_path), model_path, ": its optimizer state '", optim_path,
           "' is missing");
  StFile optim = read_safetensors(optim_path);
  auto step_of = [](const StFile& f) -> int64_t {
    auto it = f.metadata.find("step");
    MT_CHECK(it != f.metadata.end(), f.path, ": metadata has no 'step'");
    try {
      size_t used = 0;
      long long s = std::stoll(it->second, &used);
      MT_CHECK(used == it->second.size() && s >= 0, f.path, ": bad step '", it->second, "'");
      return s;
    } catch (const std::logic_error&) {
      MT_THROW(f.path, ": bad step '", it->second, "'");
    }
  };
  Checkpoint c;
  c.step = step_of(model);
  MT_CHECK(step_of(optim) == c.step, optim_path, ": optimizer state is for step ", step_of(optim),
           " but the model file is for step ", c.step);
  c.model = from_file(model);
  c.optimizer = from_file(optim);
  c.metadata = model.metadata;
  return c;
}

}  // namespace mt::train
