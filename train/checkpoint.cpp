#include "train/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include <spdlog/spdlog.h>

#include "core/atomic_file.h"
#include "core/safetensors.h"
#include "nn/serialize.h"

namespace fs = std::filesystem;

namespace mt::train {
namespace {

constexpr const char* kFormat = "minitrain-checkpoint-3";
// Older formats load only when asked for (kAllowOld): format 1 has no ids and no checksums,
// format 2's checksums do not cover 0-d tensors' names, dtypes and shapes (core/safetensors.h).
constexpr const char* kFormat2 = "minitrain-checkpoint-2";
constexpr const char* kFormat1 = "minitrain-checkpoint-1";
constexpr const char* kAllowOld = "MT_ALLOW_OLD_CHECKPOINTS";

// ---- names ----

std::string step_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

// The step of a file named step-<digits><suffix>; false for any other name.
bool parse_step_name(const std::string& name, const std::string& suffix, int64_t& step) {
  if (!name.starts_with("step-") || !name.ends_with(suffix) || name.size() <= 5 + suffix.size())
    return false;
  const char* first = name.data() + 5;
  const char* last = name.data() + name.size() - suffix.size();
  if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) return false;
  auto [end, ec] = std::from_chars(first, last, step);
  return ec == std::errc() && end == last;
}

std::string optim_path_for(const std::string& model_path) {
  const std::string suffix = ".safetensors";
  return model_path.substr(0, model_path.size() - suffix.size()) + ".optim" + suffix;
}

const std::string& meta_at(const StFile& f, const std::string& key) {
  auto it = f.metadata.find(key);
  MT_CHECK(it != f.metadata.end(), f.path, ": metadata has no '", key, "'");
  return it->second;
}

int64_t step_of(const StFile& f) {
  const std::string& s = meta_at(f, "step");
  int64_t step = -1;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), step);
  MT_CHECK(ec == std::errc() && end == s.data() + s.size() && step >= 0, f.path, ": bad step '", s,
           "'");
  return step;
}

// What a run killed mid-save leaves behind: temp files (write_safetensors names them
// "<target>.tmp.<pid>") and optimizer files whose model file never got renamed into place, or
// was already pruned. Loading never looks at them; removing them after each save keeps them from
// piling up over many interrupted runs. The folder is locked by this run, and its own save has
// finished, so none of the temp files is in use.
void remove_debris(const std::string& dir) {
  const std::string optim_suffix = ".optim.safetensors";
  std::error_code ec;
  std::vector<fs::path> debris;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string path = entry.path().string(), name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0 && name.rfind("best.", 0) != 0) continue;
    const bool temp = name.find(".safetensors.tmp.") != std::string::npos;
    const bool orphan =
        name.ends_with(optim_suffix) &&
        !fs::exists(path.substr(0, path.size() - optim_suffix.size()) + ".safetensors", ec);
    if (temp || orphan) debris.push_back(entry.path());
  }
  for (const fs::path& p : debris) fs::remove(p, ec);
}

// One checkpoint from its model file, every check but the caller's `accept`.
Checkpoint load_file(const std::string& model_path) {
  MT_CHECK(fs::exists(model_path), "checkpoint: '", model_path, "' does not exist");
  StFile model = read_safetensors(model_path);
  const std::string optim_path = optim_path_for(model_path);
  MT_CHECK(fs::exists(optim_path), model_path, ": its optimizer state '", optim_path,
           "' is missing");
  StFile optim = read_safetensors(optim_path);
  for (const StFile* f : {&model, &optim}) {
    auto format = f->metadata.find("format");
    MT_CHECK(format != f->metadata.end() &&
                 (format->second == kFormat || format->second == kFormat2 || format->second == kFormat1),
             f->path, ": not a minitrain checkpoint (metadata 'format' is missing or not '",
             kFormat, "')");
  }
  const std::string format = model.metadata.at("format");
  MT_CHECK(format == optim.metadata.at("format"), model_path, " and ", optim_path,
           " are of different formats: not one checkpoint");
  const bool legacy = format == kFormat1;
  if (format != kFormat) {
    const char* allow = std::getenv(kAllowOld);
    MT_CHECK(allow != nullptr && std::string(allow) == "1", model_path, ": a checkpoint of format ",
             format.substr(format.size() - 1), ", written by an older minitrain: ",
             legacy ? "it has no checksums" : "its checksums do not cover the step counts' dtype and shape",
             ", so it cannot be fully verified. Set ", kAllowOld, "=1 to load it anyway, if you "
             "trust the file (resuming from it then saves checkpoints of the current format)");
    spdlog::warn("{}: loading a checkpoint of format {} that cannot be fully verified ({}=1)", model_path,
                 format.substr(format.size() - 1), kAllowOld);
  }
  if (legacy) {
    // Format 1 never had checksums: a file that has them was written later and relabelled.
    for (const StFile* f : {&model, &optim})
      for (const auto& [key, _] : f->metadata)
        MT_CHECK(!key.starts_with(kChecksumPrefix), f->path, ": damaged: it says format 1, which has "
                 "no checksums, but carries '", key, "'");
  } else {
    verify_checksums(model, format == kFormat2);
    verify_checksums(optim, format == kFormat2);
    MT_CHECK(meta_at(model, "run_id") == meta_at(optim, "run_id") &&
                 meta_at(model, "checkpoint_id") == meta_at(optim, "checkpoint_id"),
             model_path, " and ", optim_path,
             " are not one checkpoint (their run_id / checkpoint_id differ: ",
             meta_at(model, "run_id"), "/", meta_at(model, "checkpoint_id"), " vs ",
             meta_at(optim, "run_id"), "/", meta_at(optim, "checkpoint_id"), ")");
  }
  Checkpoint c;
  c.path = model_path;
  c.step = step_of(model);
  MT_CHECK(step_of(optim) == c.step, optim_path, ": optimizer state is for step ", step_of(optim),
           " but the model file is for step ", c.step);
  int64_t named = 0;
  if (parse_step_name(fs::path(model_path).filename().string(), ".safetensors", named))
    MT_CHECK(named == c.step, model_path, ": its name says step ", named, " but its metadata says ",
             c.step);
  if (!legacy) c.run_id = meta_at(model, "run_id");
  c.model = nn::tensors_of(model);
  c.optimizer = nn::tensors_of(optim);
  c.metadata = without_checksums(model.metadata);
  return c;
}

}  // namespace

std::string random_id() {
  std::random_device rd;
  const uint64_t id = (uint64_t(rd()) << 32) ^ rd();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    int64_t step = 0;
    if (parse_step_name(entry.path().filename().string(), ".safetensors", step))
      found.emplace_back(step, entry.path().string());
  }
  // By the number: zero padding stops at six digits, and step-1000000 must follow step-999999.
  std::sort(found.begin(), found.end());
  std::vector<std::string> files;
  for (auto& [step, path] : found) files.push_back(std::move(path));
  return files;
}

int64_t checkpoint_name_step(const std::string& model_path) {
  int64_t step = 0;
  MT_CHECK(parse_step_name(fs::path(model_path).filename().string(), ".safetensors", step),
           model_path, ": not named step-<number>.safetensors");
  return step;
}

std::string checkpoint_run_id(const std::string& model_path) {
  const auto meta = read_safetensors_metadata(model_path);
  auto it = meta.find("run_id");
  return it == meta.end() ? "" : it->second;
}

void remove_checkpoint(const std::string& model_path) {
  std::error_code ec;  // already gone is fine
  fs::remove(model_path, ec);
  fs::remove(optim_path_for(model_path), ec);
}

std::string move_checkpoint_aside(const std::string& model_path) {
  const std::string suffix = ".safetensors";
  const std::string aside = model_path.substr(0, model_path.size() - suffix.size()) + ".skipped" +
                            suffix;
  for (const auto& [from, to] : {std::pair{model_path, aside},
                                 {optim_path_for(model_path), optim_path_for(aside)}}) {
    std::error_code ec;
    if (!fs::exists(from, ec)) continue;  // a checkpoint that lost its optimizer file
    fs::rename(from, to, ec);
    MT_CHECK(!ec, "checkpoint: cannot move ", from, " aside: ", ec.message());
  }
  return aside;
}

namespace {

// The two files of one checkpoint, optimizer file first (train/checkpoint.h).
void write_checkpoint(const std::string& model_path, const std::string& run_id, int64_t step,
                      const nn::StateDict& model, const nn::StateDict& optimizer,
                      std::map<std::string, std::string> ids,
                      const std::map<std::string, std::string>& metadata) {
  for (const auto& [key, _] : metadata)
    MT_CHECK(key != "format" && key != "step" && key != "run_id" && key != "checkpoint_id" &&
                 !key.starts_with(kChecksumPrefix) && !ids.contains(key),
             "checkpoint: metadata key '", key, "' is reserved");
  const std::string dir = fs::path(model_path).parent_path().string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, "checkpoint: cannot create directory '", dir, "': ", ec.message());
  ids.insert({{"format", kFormat},
              {"step", std::to_string(step)},
              {"run_id", run_id},
              {"checkpoint_id", random_id()}});
  std::map<std::string, std::string> model_meta = metadata;
  model_meta.insert(ids.begin(), ids.end());
  // Both files are written and synced before either is renamed (CommitGroup), so a save that
  // fails, a full disk say, leaves the old files as they were: for best.safetensors, whose names
  // are reused, the previous best pair. The directory is synced once, after both renames and
  // before older checkpoints are pruned. A crash before that sync may lose either rename: a model
  // file without its optimizer file fails to load, and resume falls back to the previous
  // checkpoint, which is still there.
  CommitGroup files;
  nn::save_tensors(optim_path_for(model_path), optimizer, ids);
  nn::save_tensors(model_path, model, model_meta);
  files.finish();
}

}  // namespace

std::string best_checkpoint_path(const std::string& dir) {
  return (fs::path(dir) / "best.safetensors").string();
}

std::string save_best_checkpoint(const std::string& dir, const std::string& run_id, int64_t step,
                                 double val_loss, const nn::StateDict& model,
                                 const nn::StateDict& optimizer,
                                 const std::map<std::string, std::string>& metadata) {
  char loss[32];
  std::snprintf(loss, sizeof loss, "%.17g", val_loss);  // reads back as exactly this double
  const std::string path = best_checkpoint_path(dir);
  write_checkpoint(path, run_id, step, model, optimizer, {{"val_loss", loss}}, metadata);
  remove_debris(dir);
  return path;
}

std::string save_checkpoint(const std::string& dir, const std::string& run_id, int64_t step,
                            const nn::StateDict& model, const nn::StateDict& optimizer,
                            const std::map<std::string, std::string>& metadata, int64_t keep_last) {
  const std::string model_path = (fs::path(dir) / (step_name(step) + ".safetensors")).string();
  write_checkpoint(model_path, run_id, step, model, optimizer, {}, metadata);

  // Newest first, this run's beyond the newest keep_last go (reading headers only when some may).
  // One of a later step is not one of the kept: the trainer's RunDir::claim leaves none (it
  // refuses, deletes or moves them aside), but a caller saving into a folder of its own may.
  const std::vector<std::string> all = list_checkpoints(dir);
  if (all.size() > size_t(keep_last)) {
    int64_t kept = 0;
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      if (checkpoint_name_step(*it) > step) continue;
      std::string owner;
      try {
        owner = checkpoint_run_id(*it);
      } catch (const Error&) {
        continue;  // unreadable: not provably this run's, so not ours to delete
      }
      if (owner == run_id && ++kept > keep_last) remove_checkpoint(*it);
    }
  }
  remove_debris(dir);
  return model_path;
}

Checkpoint load_checkpoint(const std::string& path,
                           const std::function<void(const Checkpoint&)>& accept) {
  auto attempt = [&](const std::string& model_path) {
    Checkpoint c = load_file(model_path);
    if (accept) {
      try {
        accept(c);
      } catch (const Error& e) {
        MT_THROW(model_path, ": cannot resume from it: ", e.what());
      }
    }
    return c;
  };
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    try {
      return attempt(path);
    } catch (const Error& e) {
      throw CheckpointError(e.what());
    }
  }
  Checkpoint c;
  newest_that_reads(path, [&](const std::string& model_path) { c = attempt(model_path); });
  return c;
}

void newest_that_reads(const std::string& dir,
                       const std::function<void(const std::string&)>& read) {
  const std::vector<std::string> all = list_checkpoints(dir);
  if (all.empty())
    throw CheckpointError("checkpoint: no step-*.safetensors checkpoint in '" + dir + "'");
  std::string reasons;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      read(*it);
      if (it != all.rbegin())
        spdlog::warn("checkpoint: using {} (step {})", *it, checkpoint_name_step(*it));
      return;
    } catch (const Error& e) {
      reasons += std::string("\n  ") + e.what();
      if (it + 1 != all.rend())
        spdlog::warn("checkpoint {} is unusable: {}; falling back to the next newest", *it, e.what());
    }
  }
  throw CheckpointError("checkpoint: no intact checkpoint in '" + dir + "':" + reasons);
}

}  // namespace mt::train
