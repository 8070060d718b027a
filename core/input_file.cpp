#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace mt {
namespace {

std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string special_file_kind(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? kind_of(st.st_mode) : "";
}

int open_regular_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  MT_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  const bool ok = ::fstat(fd, &st) == 0;
  const std::string why = ok ? kind_of(st.st_mode) : std::string("cannot stat: ") + std::strerror(errno);
  if (!ok || !why.empty() || ::fcntl(fd, F_SETFL, 0) != 0) {
    ::close(fd);
    MT_THROW(path, ": is ", why.empty() ? "unreadable" : why, ", not a regular file (a FIFO would "
             "wait for a writer, a device may never end): minitrain reads regular files only");
  }
  return fd;
}

std::string read_regular_file(const std::string& path) {
  const int fd = open_regular_file(path);
  std::string bytes;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      MT_THROW(path, ": read error: ", std::strerror(err));
    }
    bytes.append(buf, size_t(n));
  }
  ::close(fd);
  return bytes;
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

bool regular_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

}  // namespace mt
