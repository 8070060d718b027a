#pragma once
// The 128-byte swizzled shared-memory layout that the Hopper attention kernels (attention.cu)
// write their tiles in, and the matrix descriptors through which wgmma reads them. Plain integer
// arithmetic, host and device, so the CPU tests check it against the hardware's definition.
#include <cstdint>

#ifdef __CUDACC__
#define MT_WGMMA_LAYOUT_HD __host__ __device__ __forceinline__
#else
#define MT_WGMMA_LAYOUT_HD inline
#endif

namespace mt::wgmma_layout {

// A tile of `rows` rows of D 16-bit elements is stored as D/64 slabs of rows × 64 elements (128
// bytes a row, rows a multiple of 8 so each slab starts on a 1024-byte boundary). Inside a slab,
// 16-byte chunk c of row r lands in chunk c ^ (r % 8) of its row: the 128-byte swizzle, which puts
// the 8 rows of one column of chunks in 8 different bank groups. Returns the element offset of
// chunk c (of D/8) of row r.
MT_WGMMA_LAYOUT_HD constexpr int chunk_offset(int r, int c, int rows) {
  return (c / 8) * rows * 64 + r * 64 + ((c % 8) ^ (r % 8)) * 8;
}

// A wgmma shared-memory matrix descriptor in the 128-byte swizzle mode: the start address
// (bits 0-13), the leading byte offset (16-29) and the stride byte offset (32-45), each in
// 16-byte units, and the mode, 1 = 128 bytes (bits 62-63). K-major operands: stride = 8 rows
// (1024 bytes), leading unused; MN-major: leading = one 64-column slab to the next, stride =
// 8 rows of K.
MT_WGMMA_LAYOUT_HD constexpr uint64_t descriptor(uint32_t smem_byte_addr, uint32_t leading,
                                                 uint32_t stride) {
  return uint64_t((smem_byte_addr & 0x3FFFF) >> 4) | uint64_t(leading >> 4) << 16 |
         uint64_t(stride >> 4) << 32 | uint64_t(1) << 62;
}

}  // namespace mt::wgmma_layout
