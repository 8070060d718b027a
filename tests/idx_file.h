#pragma once
// IDX files (MNIST's format, data/idx.h) built in memory by the tests that read them.
#include <cstdint>
#include <string>
#include <vector>

namespace mt::test {

// An IDX array's header: the magic number (0x803 for images, 0x801 for labels: unsigned bytes,
// that many dimensions), then each dimension, all big-endian. The data follows it.
inline std::string idx_header(uint32_t magic, const std::vector<uint32_t>& dims) {
  std::string b;
  const auto be32 = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) b.push_back(char(v >> shift));
  };
  be32(magic);
  for (uint32_t d : dims) be32(d);
  return b;
}

}  // namespace mt::test
