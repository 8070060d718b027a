#pragma once
// Writing a file so that it appears whole or not at all, and survives a crash once written:
// the bytes go to "<target>.tmp.<pid>" beside it, are flushed to the disk (fsync), and the temp
// file is renamed over the target; then the directory is synced, since a rename is durable only
// once its directory is. A failure at any point throws an mt::Error naming the target, removes
// the temp file, and leaves whatever the target held before untouched.
//
//   AtomicFile out(path);
//   out.write(header.data(), header.size());
//   out.commit();                        // without commit, the destructor removes the temp file
#include <cstddef>
#include <cstdio>
#include <string>

namespace mt {

class AtomicFile {
 public:
  explicit AtomicFile(std::string target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* p, size_t n);
  // Flush to the disk, close, rename over the target, sync the directory.
  void commit();

 private:
  std::string target_, temp_;
  FILE* f_;
  bool renamed_ = false;
};

// The whole of `bytes` as `path`, through an AtomicFile.
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace mt
