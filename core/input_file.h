#pragma once
// Opening a path that came from outside (a config, a checkpoint, a data file) for reading. A path
// can name a FIFO, where open() waits for a writer that may never come, or a device that never
// ends; minitrain reads regular files only, and finds out what a path is without blocking.
#include <string>

namespace mt {

// What `path` names when it is not a regular file: "a FIFO (named pipe)", "a directory", "a
// character device", "a block device", "a socket"; "" for a regular file, or for a path that
// cannot be stat'ed (opening it then says why). stat() only: it never blocks.
std::string special_file_kind(const std::string& path);

// A file descriptor open for reading `path`, a regular file. Anything else is an mt::Error naming
// the path and what it is ("<path>: is a FIFO (named pipe), not a regular file"); so is a failed
// open. The open itself never blocks (O_NONBLOCK, cleared once the file is known to be regular).
int open_regular_file(const std::string& path);

// The whole of `path`, a regular file (opened as open_regular_file opens it), as bytes; a failed
// read is an mt::Error naming the path.
std::string read_regular_file(const std::string& path);

// Whether `path` exists, and whether it is a regular file (links followed). A path that cannot be
// stat'ed (an unreadable parent directory, say) counts as not there: no exception.
bool exists(const std::string& path);
bool regular_file(const std::string& path);

}  // namespace mt
