#pragma once
// Offsets in a fixed range [0, capacity), handed out and taken back: the bookkeeping of the
// memory a CUDA graph owns (core/cuda/runtime.cpp), kept free of CUDA so the CPU tests check it.
//
// Best fit over the free blocks, every block a multiple of `align` bytes, and a freed block
// merged with free neighbours, so a graph whose allocations come and go in stack order (a forward,
// then its backward) reuses the same bytes instead of growing.
#include <cstddef>
#include <map>
#include <optional>

namespace mt {

class Arena {
 public:
  explicit Arena(size_t capacity, size_t align = 256);

  // An offset of `bytes` free bytes, or nothing when no free block is big enough.
  std::optional<size_t> allocate(size_t bytes);
  // Gives back a block allocate() returned; anything else is an mt::Error.
  void free(size_t offset);

  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t live() const { return taken_.size(); }  // blocks handed out and not yet freed

 private:
  size_t capacity_, align_, used_ = 0;
  std::map<size_t, size_t> free_;   // offset -> size, disjoint, never adjacent
  std::map<size_t, size_t> taken_;  // offset -> size
};

}  // namespace mt
