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
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace mt {

class AtomicFile {
 public:
  explicit AtomicFile(std::string target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* p, size_t n);
  // Flush to the disk, close, rename over the target, sync the directory (in a CommitGroup: flush
  // and close; the group does the rest).
  void commit();

 private:
  std::string target_, temp_;
  FILE* f_;
  bool committed_ = false;  // renamed over the target, or handed to a CommitGroup
};

// Several files that are one unit (a checkpoint's model and optimizer files): while a CommitGroup
// is alive on this thread, AtomicFile::commit syncs each file's bytes but leaves the rename to
// finish(), which renames the files in commit order and then syncs each directory once. So a file
// that cannot be written (a full disk) fails before any target changes: the destructor removes
// the temp files, and every target keeps what it held, the old pair still a pair. Only a crash
// between finish()'s renames, which do no I/O of their own, can leave one file new and the other
// old. One checkpoint costs three fsyncs instead of four. Until finish() returns no rename is
// known to be durable, so the caller must not rely on one before that (the trainer prunes older
// checkpoints after it).
class CommitGroup {
 public:
  CommitGroup();
  ~CommitGroup();
  CommitGroup(const CommitGroup&) = delete;
  CommitGroup& operator=(const CommitGroup&) = delete;
  void finish();

 private:
  friend class AtomicFile;
  struct Pending {
    std::string temp, target;
  };
  std::vector<Pending> pending_;  // synced temp files, in commit order, not yet renamed
  CommitGroup* outer_;
};

// The fsyncs of files and of directories this process has made through AtomicFile, for tests and
// measurements.
struct SyncCounts {
  int64_t files = 0, directories = 0;
};
SyncCounts sync_counts();

// The whole of `bytes` as `path`, through an AtomicFile.
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace mt
