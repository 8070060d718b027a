#pragma once
// Storage: one block of memory on one device, shared by every tensor that views it.
//
// The version counter lives here, not on the tensor, because an in-place write through any view
// changes what every other view (and every saved copy of it) sees. Autograd compares versions to
// catch "saved for backward, then modified in place".
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/device.h"

namespace mt {

class Storage {
 public:
  // CPU memory is 64-byte aligned; CUDA memory comes from the stream-ordered pool.
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  Storage(void* data, size_t nbytes, Device device) : data_(data), nbytes_(nbytes), device_(device) {}
  void* data_;
  size_t nbytes_;
  Device device_;
  uint64_t version_ = 0;
};

// Tests turn this on so that every new allocation is filled with 0xFF bytes (NaN in every
// floating dtype) before a kernel writes it: an element a kernel forgot to write stays NaN.
void set_poison_allocations(bool on);
bool poison_allocations();

}  // namespace mt
