#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace mt::train {

namespace {

// An exclusive flock on `lock` (created if needed), which records this process's pid; `key` and
// `what` name the thing it guards, and `rule` the rule, in the ConfigError when another run holds it.
int take_lock(const std::string& lock, const std::string& key, const std::string& what,
              const std::string& rule) {
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw ConfigError(key + ": cannot open '" + lock + "': " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(fd, pid, sizeof pid - 1, 0);
    ::close(fd);
    std::string holder = n > 0 ? std::string(pid, size_t(n)) : "";
    while (!holder.empty() && holder.back() == '\n') holder.pop_back();
    if (err != EWOULDBLOCK)
      throw ConfigError(key + ": cannot lock '" + lock + "': " + std::strerror(err));
    throw ConfigError(key + ": '" + what + "' is in use by another run" +
                      (holder.empty() ? "" : " (pid " + holder + ")") +
                      "; " + rule + ": wait for it to finish, or pick another " + key);
  }
  // Who holds it, for the message above; the lock works without it.
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != ssize_t(me.size()))
    spdlog::warn("{}: cannot record the pid in {}: {}", key, lock, std::strerror(errno));
  return fd;
}

// The curve a resumed run may redraw: its own (write_curve_svg records the run id).
bool curve_of_run(const std::string& path, const std::string& run_id) {
  std::ifstream in(path);
  std::string head(1024, '\0');
  in.read(head.data(), std::streamsize(head.size()));
  head.resize(size_t(in.gcount()));
  return head.find("data-run-id='" + run_id + "'") != std::string::npos;
}

}  // namespace

RunDir::RunDir(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ConfigError("checkpoint.dir: cannot create '" + dir + "': " + ec.message());
  fds_.push_back(take_lock((fs::path(dir) / ".lock").string(), "checkpoint.dir", dir,
                           "one folder holds one run at a time"));
}

RunDir::~RunDir() {
  for (int fd : fds_) ::close(fd);
}

void RunDir::lock_file(const std::string& key, const std::string& path) {
  std::error_code ec;
  const fs::path parent = fs::weakly_canonical(fs::absolute(fs::path(path).parent_path(), ec), ec);
  if (fs::equivalent(parent, dir_, ec)) return;  // the folder's lock covers it
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && !fs::is_regular_file(st)) return;  // a pipe or device: a stream
  if (!parent.empty()) fs::create_directories(parent, ec);  // as the writer would
  fds_.push_back(take_lock(path + ".lock", key, path, "one run writes a file at a time"));
}

void RunDir::claim(const std::string& run_id, int64_t resumed_step, bool newer_skipped,
                   const std::string& metrics, const std::string& curve, bool overwrite) {
  const bool fresh = resumed_step < 0;
  std::vector<std::string> foreign, later, skipped;  // model files
  std::vector<std::string> files = list_checkpoints(dir_);
  std::error_code ec;
  // An earlier run's best checkpoint (keep_best) goes with its other files, listed first so that
  // the message's "newest" names a step. This run's own best is never "later": it has no step in
  // its name, and the resumed run replaces it only with a lower loss.
  const std::string best = best_checkpoint_path(dir_);
  if (fs::exists(best, ec)) files.insert(files.begin(), best);
  for (const std::string& f : files) {
    if (!fresh) {
      std::string owner;
      const bool past = f != best && checkpoint_name_step(f) > resumed_step;
      try {
        owner = checkpoint_run_id(f);
      } catch (const Error&) {
        if (past) skipped.push_back(f);  // damaged: the run's own save at its step would replace it
        continue;
      }
      if (owner.empty()) continue;  // format 1 files carry no run id
      if (owner == run_id) {
        if (past) (newer_skipped ? skipped : later).push_back(f);
        continue;
      }
    }
    foreign.push_back(f);
  }
  if (!later.empty()) {
    const std::string what = std::to_string(later.size()) + " later checkpoint(s) of this run, the newest " +
                             fs::path(later.back()).filename().string();
    if (!overwrite)
      throw ConfigError("checkpoint.dir: '" + dir_ + "' holds " + what + ", but this run resumes from step " +
                        std::to_string(resumed_step) + ": it would branch off, its checkpoints pruned against the "
                        "other branch's and the next --resume " + dir_ + " taking the other branch. Continue "
                        "from the newest with --resume " + dir_ + ", write the branch to another "
                        "checkpoint.dir, or set checkpoint.overwrite=true to delete the later ones first");
    spdlog::warn("checkpoint.overwrite: deleting {} in {}; the run goes on from step {}", what, dir_, resumed_step);
    for (const std::string& f : later) remove_checkpoint(f);
  }
  const bool old_metrics = fresh && fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0;
  // A curve is redrawn whole at the run's end: one that is not this run's would be lost.
  const bool old_curve = fs::is_regular_file(curve, ec) && fs::file_size(curve, ec) > 0 &&
                         (fresh || !curve_of_run(curve, run_id));
  // A later checkpoint the resume passed over (damaged, or without its optimizer file) is moved
  // aside, not written over when the run reaches its step: its model may still be of use.
  auto set_aside = [&] {
    for (const std::string& f : skipped)
      spdlog::warn("checkpoint {} was passed over by the resume; moved aside as {}", f,
                   move_checkpoint_aside(f));
  };
  if (foreign.empty() && !old_metrics && !old_curve) {
    set_aside();
    return;
  }

  std::string what;
  if (!foreign.empty())
    what = std::to_string(foreign.size()) + " checkpoint(s) of " +
           (fresh ? "an earlier run" : "another run") + ", the newest " +
           fs::path(foreign.back()).filename().string();
  if (old_metrics) what += (what.empty() ? "" : ", and ") + std::string("the metrics ") + metrics;
  if (old_curve)
    what += (what.empty() ? "" : ", and ") + std::string("the curve ") + curve +
            (fresh ? "" : " (not this run's)");
  if (!overwrite) {
    // Metrics without a checkpoint: a run stopped before its first save, with nothing to resume.
    const std::string choices =
        !fresh ? "; this run would mix its files with them. Pick other paths, or set "
                 "checkpoint.overwrite=true to delete them first"
        : foreign.empty()
            ? "; there is no checkpoint to resume from (a run stopped before its first save?). "
              "Pick another checkpoint.dir, or set checkpoint.overwrite=true to delete it first"
            : "; this run would mix its files with them. Continue that run with --resume " + dir_ +
                  ", pick another checkpoint.dir, or set checkpoint.overwrite=true to delete them first";
    throw ConfigError("checkpoint.dir: '" + dir_ + "' already holds " + what + choices);
  }
  spdlog::warn("checkpoint.overwrite: deleting {} in {}", what, dir_);
  for (const std::string& f : foreign) remove_checkpoint(f);
  if (old_metrics) fs::remove(metrics, ec);
  if (old_curve) fs::remove(curve, ec);
  set_aside();
}

}  // namespace mt::train
