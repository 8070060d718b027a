#include "core/arena.h"

#include "core/error.h"

namespace mt {

Arena::Arena(size_t capacity, size_t align) : capacity_(capacity / align * align), align_(align) {
  MT_CHECK(align > 0, "Arena: alignment must be positive");
  if (capacity_ > 0) free_[0] = capacity_;
}

std::optional<size_t> Arena::allocate(size_t bytes) {
  const size_t need = (std::max<size_t>(bytes, 1) + align_ - 1) / align_ * align_;
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->second >= need && (best == free_.end() || it->second < best->second)) best = it;
  if (best == free_.end()) return std::nullopt;
  const size_t offset = best->first, size = best->second;
  free_.erase(best);
  if (size > need) free_[offset + need] = size - need;
  taken_[offset] = need;
  used_ += need;
  return offset;
}

void Arena::free(size_t offset) {
  auto it = taken_.find(offset);
  MT_CHECK(it != taken_.end(), "Arena::free: offset ", offset, " was not handed out");
  size_t start = offset, size = it->second;
  used_ -= size;
  taken_.erase(it);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {  // merge with the block after
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // and with the block before
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = size;
}

}  // namespace mt
