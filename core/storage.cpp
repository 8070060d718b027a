#include "core/storage.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/runtime.h"
#include "core/cuda/tensor_copy_cuda.h"
#endif

namespace mt {

static bool g_poison = false;
void set_poison_allocations(bool on) { g_poison = on; }
bool poison_allocations() { return g_poison; }

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  // Byte counts come from nbytes_of; this bound also keeps the rounding below from wrapping.
  MT_CHECK(nbytes <= size_t(INT64_MAX), "Storage::allocate: ", nbytes, " bytes on ", device.str(),
           " is more than an int64 can count");
  void* p = nullptr;
  if (device.is_cpu()) {
    // aligned_alloc needs a size that is a multiple of the alignment.
    size_t rounded = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
    p = std::aligned_alloc(64, rounded);
    MT_CHECK(p, "Storage::allocate: out of host memory allocating ", nbytes, " bytes");
    if (g_poison) std::memset(p, 0xff, nbytes);
  } else {
#ifdef MT_WITH_CUDA
    MT_CHECK(device.index < cuda::device_count(), "Storage::allocate: ", device.str(),
             " does not exist (", cuda::device_count(), " CUDA devices visible)");
    p = nbytes ? cuda::alloc(nbytes, device.index) : nullptr;
    if (g_poison && p) cuda::poison(p, nbytes, device.index);
#else
    MT_THROW("Storage::allocate: ", device.str(), " requested but minitrain was built without CUDA");
#endif
  }
  return std::shared_ptr<Storage>(new Storage(p, nbytes, device));
}

Storage::~Storage() {
  if (device_.is_cpu()) {
    std::free(data_);
  } else {
#ifdef MT_WITH_CUDA
    // A destructor must not throw. The one failure expected here is a tensor made inside a CUDA
    // graph capture that a refused call just invalidated (core/cuda/graph.h): its memory was
    // never more than a node of the discarded graph.
    try {
      if (data_) cuda::free(data_, device_.index);
    } catch (const Error&) {
    }
#endif
  }
}

}  // namespace mt
