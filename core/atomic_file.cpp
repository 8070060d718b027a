#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace mt {
namespace {

std::string os_error() { return std::strerror(errno); }

void sync_parent_dir(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  MT_CHECK(fd >= 0, path, ": saved, but cannot open its directory to sync it: ", os_error());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems (certain network and FUSE mounts) cannot sync a directory at all.
  MT_CHECK(rc == 0 || err == EINVAL, path,
           ": saved, but syncing its directory failed: ", std::strerror(err));
}

}  // namespace

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
  FILE* f = f_;
  f_ = nullptr;
  MT_CHECK(std::fclose(f) == 0, target_, ": cannot close ", temp_, ": ", os_error());
  MT_CHECK(std::rename(temp_.c_str(), target_.c_str()) == 0, target_, ": cannot rename ", temp_,
           " over it: ", os_error());
  renamed_ = true;
  sync_parent_dir(target_);
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  AtomicFile out(path);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

}  // namespace mt
