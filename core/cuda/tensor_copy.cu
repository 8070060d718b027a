// Strided gather, strided scatter and fill, the kernels Tensor itself needs on the GPU.
//
// copy_strided: one thread per output element (grid-stride). The output index is decomposed into
// coordinates with the shape, and the input offset rebuilt with the strides: up to 8 dimensions,
// passed by value in a small struct so the launch needs no device-side metadata buffer.
// copy_to_strided is the same walk with the strided side on the output (copy_ into a view).
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/cuda/tensor_copy_cuda.h"
#include "core/cuda/vec.cuh"

namespace mt::cuda {
namespace {

constexpr int kMaxDims = 8;
struct StridedLayout {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];
  int64_t offset;
};

__device__ inline double load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return to_float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f16: return to_float(static_cast<const __half*>(p)[i]);
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return double(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

__device__ inline void store(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f64: static_cast<double*>(p)[i] = v; break;
    case DType::f32: static_cast<float*>(p)[i] = float(v); break;
    // Through float, so the rounding matches the CPU's float_to_bf16 / float_to_f16.
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = from_float<__nv_bfloat16>(float(v)); break;
    case DType::f16: static_cast<__half*>(p)[i] = from_float<__half>(float(v)); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = saturate_to<int32_t>(v); break;
    case DType::i64: static_cast<int64_t*>(p)[i] = saturate_to<int64_t>(v); break;
  }
}

__global__ void copy_strided_kernel(const void* src, DType st, StridedLayout L, void* dst, DType dt,
                                    int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, off = L.offset;
    for (int d = L.ndim - 1; d >= 0; --d) {
      off += (rem % L.shape[d]) * L.strides[d];
      rem /= L.shape[d];
    }
    store(dst, dt, i, load(src, st, off));
  }
}

// The transpose of copy_strided_kernel: read element i, write it at its strided offset. Bits are
// moved through an unsigned integer of the element's width, so no dtype is converted.
template <class Bits>
__global__ void copy_to_strided_kernel(const Bits* src, StridedLayout L, Bits* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, off = L.offset;
    for (int d = L.ndim - 1; d >= 0; --d) {
      off += (rem % L.shape[d]) * L.strides[d];
      rem /= L.shape[d];
    }
    dst[off] = src[i];
  }
}

__global__ void fill_kernel(void* dst, DType dt, double v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    store(dst, dt, i, v);
}

int blocks_for(int64_t n) { return int(std::min<int64_t>((n + 255) / 256, 65536)); }

}  // namespace

void copy_strided(const void* src_base, DType src_dtype, const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& strides, int64_t offset, void* dst, DType dst_dtype,
                  int device) {
  MT_CHECK(shape.size() <= kMaxDims, "copy_strided: at most ", kMaxDims, " dimensions, got ",
           shape.size());
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n == 0) return;
  StridedLayout L{int(shape.size()), {}, {}, offset};
  for (size_t d = 0; d < shape.size(); ++d) {
    L.shape[d] = shape[d];
    L.strides[d] = strides[d];
  }
  set_device(device);
  copy_strided_kernel<<<blocks_for(n), 256, 0, stream(device)>>>(src_base, src_dtype, L, dst,
                                                                   dst_dtype, n);
  MT_CUDA_CHECK_LAUNCH();
}

void copy_to_strided(const void* src, void* dst_base, DType dtype, const std::vector<int64_t>& shape,
                     const std::vector<int64_t>& strides, int64_t offset, int device) {
  MT_CHECK(shape.size() <= kMaxDims, "copy_to_strided: at most ", kMaxDims, " dimensions, got ",
           shape.size());
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n == 0) return;
  StridedLayout L{int(shape.size()), {}, {}, offset};
  for (size_t d = 0; d < shape.size(); ++d) {
    L.shape[d] = shape[d];
    L.strides[d] = strides[d];
  }
  set_device(device);
  auto launch = [&](auto* typed_dst) {
    using Bits = std::remove_pointer_t<decltype(typed_dst)>;
    copy_to_strided_kernel<<<blocks_for(n), 256, 0, stream(device)>>>(
        static_cast<const Bits*>(src), L, typed_dst, n);
  };
  switch (dtype_size(dtype)) {
    case 2: launch(static_cast<uint16_t*>(dst_base)); break;
    case 4: launch(static_cast<uint32_t*>(dst_base)); break;
    case 8: launch(static_cast<uint64_t*>(dst_base)); break;
    default: MT_THROW("copy_to_strided: unsupported element size ", dtype_size(dtype), " of ",
                      dtype_name(dtype));
  }
  MT_CUDA_CHECK_LAUNCH();
}

void poison(void* dst, size_t nbytes, int device) {
  MT_CUDA_CHECK(cudaMemsetAsync(dst, 0xff, nbytes, stream(device)));
}

void fill_tensor(void* dst, double value, int64_t n, DType dtype, int device) {
  if (n == 0) return;
  set_device(device);
  fill_kernel<<<blocks_for(n), 256, 0, stream(device)>>>(dst, dtype, value, n);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
