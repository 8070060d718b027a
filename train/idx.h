#pragma once
// MNIST's IDX files: a 4-byte magic (0, 0, element type, number of dimensions), each dimension as
// a big-endian u32, then the elements row-major. MNIST uses unsigned bytes: images are
// 0x00000803 ([n, rows, cols]) and labels 0x00000801 ([n]); any unsigned-byte IDX file reads the
// same way. The files are usually distributed gzip'd; both forms are read.
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct IdxArray {
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // product(shape) bytes
};

// Throws mt::Error naming the file and the byte offset of the problem for a bad magic, a
// non-byte element type, a size that overflows, or data shorter or longer than the shape says.
IdxArray read_idx(const std::string& path);

}  // namespace mt
