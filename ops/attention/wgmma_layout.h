#pragma once
// The Hopper attention kernels' (attention.cu) tiles in shared memory: the tensor map through
// which the tensor memory accelerator brings them there, 128-byte swizzled, and the matrix
// descriptors through which wgmma reads them; and the order in which the forward's persistent
// blocks and the backward's grids take their work. Plain integer arithmetic, host and device, so the CPU tests check it
// against the hardware's definitions and the kernel's needs.
#include <cstdint>

#ifdef __CUDACC__
#define MT_WGMMA_LAYOUT_HD __host__ __device__ __forceinline__
#else
#define MT_WGMMA_LAYOUT_HD inline
#endif

namespace mt::wgmma_layout {

// A tile of `rows` rows of D 16-bit elements is stored as D/64 slabs of rows × 64 elements (128
// bytes a row, rows a multiple of 8 so each slab starts on a 1024-byte boundary), one copy (box)
// a slab. Inside a slab, 16-byte chunk c of row r lands in chunk c ^ (r % 8) of its row: the
// 128-byte swizzle (the tensor map's CU_TENSOR_MAP_SWIZZLE_128B, wgmma's swizzle mode 1), which
// puts the 8 rows of one column of chunks in 8 different bank groups.

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

// The tensor map through which the Hopper kernels' tensor-memory-accelerator copies find a
// head's rows (cuTensorMapEncodeTiled): a head layout (attention_cuda.h's HeadsLayout: `heads`
// heads a batch, element strides batch, head and row) seen as a 4-dimensional tensor of 16-bit
// elements (elem bytes each), dimensions fastest first (d, T, heads, n_heads / heads) and the
// byte strides of the last three. Element c of row i of head b·heads + h is then at
// c·elem + i·strides[0] + h·strides[1] + b·strides[2], where the layout puts it. With one head
// a batch the head stride is never multiplied by anything but 0; the map gets the batch's
// there rather than the layout's 0, a stride the driver's stated requirements (a multiple of 16
// bytes, below 2^40) plainly allow.
struct TensorMapShape {
  uint64_t dims[4];
  uint64_t strides[3];
};
MT_WGMMA_LAYOUT_HD constexpr TensorMapShape heads_tensor_map(int64_t heads, int64_t batch,
                                                             int64_t head, int64_t row,
                                                             int64_t n_heads, int64_t T,
                                                             int64_t d, int64_t elem) {
  return {{uint64_t(d), uint64_t(T), uint64_t(heads), uint64_t(n_heads / heads)},
          {uint64_t(row * elem), uint64_t((heads > 1 ? head : batch) * elem),
           uint64_t(batch * elem)}};
}

// The forward's work items: the heads in sections of `section` heads (the last may have fewer),
// one section after the other, and in a section the longest walk first: its item r is Q tile
// q_tiles − 1 − r / n of the section's head r % n (n heads in it: every head's last tile, then
// every head's second-to-last, ...). Under the causal mask tile t walks t + 1 K/V tiles, and the
// blocks take the items in this order (each asks for its next one as it starts one), so the
// short walks fill in at the end and no block runs on alone; the sections keep the K and V that
// the blocks read at once, and read again a few items later, small enough to stay in L2.
struct WorkItem {
  int head, tile;
};
MT_WGMMA_LAYOUT_HD constexpr WorkItem work_item(int item, int heads, int q_tiles, int section) {
  const int first = item / (section * q_tiles) * section;  // the section's first head
  const int n = heads - first < section ? heads - first : section;
  const int r = item - first * q_tiles;
  return {first + r % n, q_tiles - 1 - r / n};
}

// The heads of a section: the largest power of two whose K and V (kv_bytes a head) fit in a
// third of the L2 cache (l2_bytes), at least 1 and at most `heads`. On an H100 this was the best
// of the powers of two tried at GPT-2's shape and at T = 2048, and within 1.5% of the best at
// [4, 16, 4096, 128] (docs/perf.md).
MT_WGMMA_LAYOUT_HD constexpr int section_heads(int64_t kv_bytes, int64_t l2_bytes, int heads) {
  int n = 1;
  while (2 * n <= heads && 2 * n * kv_bytes <= l2_bytes / 3) n *= 2;
  return n;
}

// The backward's passes are grids of (head, tile) blocks that the hardware starts in order, the
// blocks taken as work items in this order too (block b of the grid is work_item b). Their
// sections: the largest power of two of heads whose `tiles` blocks each fit in one wave of `sms`
// blocks, at least 1 and at most `heads`, so the blocks that run together share a few heads'
// tensors in L2. On an H100 this was the best of the powers of two tried at GPT-2's shape and at
// [4, 16, 4096, 128], within 1% at T = 2048 and 3% at [64, 6, 256, 64] (docs/perf.md).
MT_WGMMA_LAYOUT_HD constexpr int wave_section_heads(int tiles, int sms, int heads) {
  int n = 1;
  while (2 * n <= heads && 2 * n * tiles <= sms) n *= 2;
  return n;
}

}  // namespace mt::wgmma_layout
