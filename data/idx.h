#pragma once
// MNIST's IDX files: a 4-byte magic (0, 0, element type, number of dimensions), each dimension as
// a big-endian u32, then the elements row-major. MNIST uses unsigned bytes: images are
// 0x00000803 ([n, rows, cols]) and labels 0x00000801 ([n]); any unsigned-byte IDX file reads the
// same way. The files are usually distributed gzip'd; both forms are read.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mt {

// The most data one IDX file may hold: 4 GiB, 90 times MNIST's training images. A gzip'd file
// can inflate a thousandfold, so its header, not its size on disk, is what has to be bounded.
inline constexpr uint64_t kMaxIdxBytes = uint64_t(1) << 32;

struct IdxArray {
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // product(shape) bytes
};

// Throws mt::Error naming the file and the byte offset of the problem for a bad magic, a
// non-byte element type, a shape of more than kMaxIdxBytes, or data shorter or longer than the
// shape says. Exactly the bytes the header promises are read, then the end of the data is
// required, so no file makes it read more than kMaxIdxBytes + 1.
//
// `check_shape`, when given, sees the header's shape before any of the data is read and throws
// to refuse the file (e.g. an image count that does not match the labels').
IdxArray read_idx(const std::string& path,
                  const std::function<void(const std::vector<int64_t>&)>& check_shape = {});

}  // namespace mt
