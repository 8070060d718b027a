#pragma once
// libFuzzer hands a harness its input as bytes in memory, but the readers under test take a path
// (the path is their real interface: they stat, open and seek the file themselves). An anonymous
// in-memory file (memfd) bridges the two: its /proc/self/fd path opens like any regular file, it
// never touches the disk, and nothing is left behind when the fuzzer stops.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace mt::fuzz {

class InputFile {
 public:
  InputFile() : fd_(::memfd_create("mt-fuzz-input", 0)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Replaces the file's contents with `data` and returns its path.
  const std::string& write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0 || (size > 0 && ::pwrite(fd_, data, size, 0) != ssize_t(size))) {
      std::perror("writing the fuzz input");
      std::abort();
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

}  // namespace mt::fuzz
