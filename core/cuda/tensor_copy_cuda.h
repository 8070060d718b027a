#pragma once
// The CUDA halves of Tensor::contiguous / to(dtype) / copy_ / fill_: a strided gather with dtype
// conversion, a strided scatter, and a fill. All run on the framework stream of `device`.
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace mt::cuda {

// dst (contiguous, dst_dtype) <- src viewed through (shape, strides, offset), converting dtype.
void copy_strided(const void* src_base, DType src_dtype, const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& strides, int64_t offset, void* dst, DType dst_dtype,
                  int device);

// dst viewed through (shape, strides, offset) <- src (contiguous, the same dtype): copy_ into a
// strided destination (the gradient of a narrow or split writes its slice of a larger tensor).
// The bits are moved as they are, for every dtype.
void copy_to_strided(const void* src, void* dst_base, DType dtype, const std::vector<int64_t>& shape,
                     const std::vector<int64_t>& strides, int64_t offset, int device);

// Fills nbytes with 0xFF on the framework stream (see set_poison_allocations).
void poison(void* dst, size_t nbytes, int device);

void fill_tensor(void* dst, double value, int64_t n, DType dtype, int device);

}  // namespace mt::cuda
