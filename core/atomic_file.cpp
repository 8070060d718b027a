#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace mt {
namespace {

std::string os_error() { return std::strerror(errno); }

std::atomic<int64_t> file_syncs{0}, directory_syncs{0};

void sync_parent_dir(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  MT_CHECK(fd >= 0, path, ": saved, but cannot open its directory to sync it: ", os_error());
  int rc = ::fsync(fd);
  int err = errno;
  ++directory_syncs;
  ::close(fd);
  // Some filesystems (certain network and FUSE mounts) cannot sync a directory at all.
  MT_CHECK(rc == 0 || err == EINVAL, path,
           ": saved, but syncing its directory failed: ", std::strerror(err));
}

thread_local CommitGroup* current_group = nullptr;

void rename_over(const std::string& temp, const std::string& target) {
  MT_CHECK(std::rename(temp.c_str(), target.c_str()) == 0, target, ": cannot rename ", temp,
           " over it: ", os_error());
}

}  // namespace

CommitGroup::CommitGroup() : outer_(current_group) { current_group = this; }

CommitGroup::~CommitGroup() {
  current_group = outer_;
  for (const Pending& p : pending_)
    if (!p.temp.empty()) std::remove(p.temp.c_str());
}

void CommitGroup::finish() {
  current_group = outer_;
  std::vector<std::string> synced_dirs;
  for (Pending& p : pending_) {
    rename_over(p.temp, p.target);
    p.temp.clear();  // renamed: nothing for the destructor to remove
  }
  for (const Pending& p : pending_) {
    const std::string dir = std::filesystem::path(p.target).parent_path().string();
    if (std::find(synced_dirs.begin(), synced_dirs.end(), dir) != synced_dirs.end()) continue;
    sync_parent_dir(p.target);
    synced_dirs.push_back(dir);
  }
  pending_.clear();
}

AtomicFile::AtomicFile(std::string target)
    : target_(std::move(target)), temp_(target_ + ".tmp." + std::to_string(::getpid())),
      f_(std::fopen(temp_.c_str(), "wb")) {
  MT_CHECK(f_, target_, ": cannot create temp file ", temp_, ": ", os_error());
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (!committed_) std::remove(temp_.c_str());
}

void AtomicFile::write(const void* p, size_t n) {
  MT_CHECK(n == 0 || std::fwrite(p, 1, n, f_) == n, target_, ": write to ", temp_, " failed: ",
           os_error());
}

void AtomicFile::commit() {
  MT_CHECK(std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0, target_, ": cannot flush ", temp_,
           " to disk: ", os_error());
  ++file_syncs;
  FILE* f = f_;
  f_ = nullptr;
  MT_CHECK(std::fclose(f) == 0, target_, ": cannot close ", temp_, ": ", os_error());
  if (current_group != nullptr) {
    current_group->pending_.push_back({temp_, target_});
    committed_ = true;  // the group renames the temp file, or removes it
    return;
  }
  rename_over(temp_, target_);
  committed_ = true;
  sync_parent_dir(target_);
}

SyncCounts sync_counts() { return {file_syncs.load(), directory_syncs.load()}; }

void write_file_atomically(const std::string& path, const std::string& bytes) {
  AtomicFile out(path);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

}  // namespace mt
