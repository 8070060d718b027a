#pragma once
// Shared by the Tensor-level CUDA kernels each op registers (the bottom of every ops/*/*.cu):
// the raw launchers take pointers, a dtype and a stream; these turn tensors into those.
#include <cuda_runtime.h>

#include "core/cuda/runtime.h"
#include "core/tensor.h"

namespace mt::cuda {

// Makes t's device current (the launchers use the current device for their scratch) and returns
// the framework stream there.
inline cudaStream_t stream_of(const Tensor& t) {
  set_device(t.device().index);
  return stream(t.device().index);
}

// A tensor's data pointer, or nullptr for an undefined (not needed) tensor.
template <class T = void>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

}  // namespace mt::cuda
