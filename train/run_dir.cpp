#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace mt::train {

RunDir::RunDir(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw ConfigError("checkpoint.dir: cannot create '" + dir + "': " + ec.message());
  const std::string lock = (fs::path(dir) / ".lock").string();
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw ConfigError("checkpoint.dir: cannot open '" + lock + "': " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
    ::close(fd_);
    std::string holder = n > 0 ? std::string(pid, size_t(n)) : "";
    while (!holder.empty() && holder.back() == '\n') holder.pop_back();
    if (err != EWOULDBLOCK)
      throw ConfigError("checkpoint.dir: cannot lock '" + lock + "': " + std::strerror(err));
    throw ConfigError("checkpoint.dir: '" + dir + "' is in use by another run" +
                      (holder.empty() ? "" : " (pid " + holder + ")") +
                      "; one folder holds one run at a time: wait for it to finish, or pick "
                      "another checkpoint.dir");
  }
  // Who holds it, for the message above; the lock works without it.
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size()))
    spdlog::warn("checkpoint.dir: cannot record the pid in {}: {}", lock, std::strerror(errno));
}

RunDir::~RunDir() { ::close(fd_); }

void RunDir::claim(const std::string& run_id, bool fresh, const std::string& metrics,
                   bool overwrite) {
  std::vector<std::string> foreign;  // model files
  std::vector<std::string> files = list_checkpoints(dir_);
  std::error_code ec;
  // An earlier run's best checkpoint (keep_best) goes with its other files, listed first so that
  // the message's "newest" names a step.
  if (const std::string best = best_checkpoint_path(dir_); fs::exists(best, ec))
    files.insert(files.begin(), best);
  for (const std::string& f : files) {
    if (!fresh) {
      std::string owner;
      try {
        owner = checkpoint_run_id(f);
      } catch (const Error&) {
        continue;  // a damaged file the resumed run skipped over; it is left alone
      }
      if (owner.empty() || owner == run_id) continue;  // format 1 files carry no run id
    }
    foreign.push_back(f);
  }
  const bool old_metrics = fresh && fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0;
  if (foreign.empty() && !old_metrics) return;

  std::string what;
  if (!foreign.empty())
    what = std::to_string(foreign.size()) + " checkpoint(s) of " +
           (fresh ? "an earlier run" : "another run") + ", the newest " +
           fs::path(foreign.back()).filename().string();
  if (old_metrics) what += (what.empty() ? "" : ", and ") + std::string("the metrics ") + metrics;
  if (!overwrite)
    throw ConfigError("checkpoint.dir: '" + dir_ + "' already holds " + what +
                      "; this run would mix its files with them. Continue that run with --resume " +
                      dir_ + ", pick another checkpoint.dir, or set checkpoint.overwrite=true to "
                      "delete them first");
  spdlog::warn("checkpoint.overwrite: deleting {} in {}", what, dir_);
  for (const std::string& f : foreign) remove_checkpoint(f);
  if (old_metrics) fs::remove(metrics, ec);
}

}  // namespace mt::train
