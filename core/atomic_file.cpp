#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

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

thread_local DirSyncBatch* current_batch = nullptr;

}  // namespace

DirSyncBatch::DirSyncBatch() : outer_(current_batch) { current_batch = this; }
DirSyncBatch::~DirSyncBatch() { current_batch = outer_; }

void DirSyncBatch::finish() {
  current_batch = outer_;
  for (const std::string& target : targets_) sync_parent_dir(target);
  targets_.clear();
}

AtomicFile::AtomicFile(std::string target)
    : target_(std::move(target)), temp_(target_ + ".tmp." + std::to_string(::getpid())),
      f_(std::fopen(temp_.c_str(), "wb")) {
  MT_CHECK(f_, target_, ": cannot create temp file ", temp_, ": ", os_error());
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (!renamed_) std::remove(temp_.c_str());
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
  MT_CHECK(std::rename(temp_.c_str(), target_.c_str()) == 0, target_, ": cannot rename ", temp_,
           " over it: ", os_error());
  renamed_ = true;
  if (current_batch == nullptr) return sync_parent_dir(target_);
  const auto dir = std::filesystem::path(target_).parent_path();
  for (const std::string& t : current_batch->targets_)
    if (std::filesystem::path(t).parent_path() == dir) return;
  current_batch->targets_.push_back(target_);
}

SyncCounts sync_counts() { return {file_syncs.load(), directory_syncs.load()}; }

void write_file_atomically(const std::string& path, const std::string& bytes) {
  AtomicFile out(path);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

}  // namespace mt
