#pragma once
// Flips one bit of a file in place: bit `bit` counts from the first byte's lowest bit.
#include <cstdint>
#include <fstream>
#include <string>

namespace mt::test {

inline void flip_bit(const std::string& path, uint64_t bit) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(bit / 8));
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ (1 << (bit % 8)));
  f.seekp(std::streamoff(bit / 8));
  f.write(&c, 1);
}

}  // namespace mt::test
