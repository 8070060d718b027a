#pragma once
// The Hopper attention kernels' (attention.cu) tiles in shared memory: the tensor map through
// which the tensor memory accelerator brings them there, 128-byte swizzled, and the matrix
// descriptors through which wgmma reads them; and the order in which the forward's persistent
// blocks and the backward's grids take their work. Plain integer arithmetic, host and device, so
// the CPU tests check it against the hardware's definitions and the kernel's needs.
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
// section >= 1 (at least `heads`: one section); heads · q_tiles fits in int (the launchers
// check it).
MT_WGMMA_LAYOUT_HD constexpr WorkItem work_item(int item, int heads, int q_tiles, int section) {
  const int first = item / (section * q_tiles) * section;  // the section's first head
  const int n = heads - first < section ? heads - first : section;
  const int r = item - first * q_tiles;
  return {first + r % n, q_tiles - 1 - r / n};
}

// The section size for sections of at most `most` heads: as few sections as that allows, each as
// small as that count allows (192 heads at most 66 a section: 64, 64, 64, not 66, 66, 60), so a
// short last section does not start its longest walks last, behind the rest. At least 1, at
// most `heads`.
MT_WGMMA_LAYOUT_HD constexpr int balanced_section(int heads, int64_t most) {
  const int64_t m = most < 1 ? 1 : most > heads ? heads : most;
  const int64_t sections = (heads + m - 1) / m;
  return int((heads + sections - 1) / sections);
}

// The forward's sections: as many heads as have their K and V (kv_bytes a head) in a third of the
// L2 cache (l2_bytes). On an H100 (50 MiB of L2), of the sizes tried, this was the best at GPT-2's
// shape (64 heads), within 1% of the best at T = 2048 (32) and 1.3% at [4, 16, 4096, 128] (8),
// where 16 heads, 32 MiB, did better (docs/perf.md).
MT_WGMMA_LAYOUT_HD constexpr int section_heads(int64_t kv_bytes, int64_t l2_bytes, int heads) {
  return balanced_section(heads, l2_bytes / 3 / kv_bytes);
}

// The backward's passes are grids of (head, tile) blocks that the hardware starts in order; block
// b of the grid takes work item b. Their sections: as many heads as have at most `sms` blocks
// (`tiles` a head) together, so the blocks running at once share a few heads' tensors in L2 (at
// d = 64 an SM holds two dK/dV blocks or more dQ blocks, so this is a measured size, not one
// wave). On an H100, of the sizes tried, this tied with the best at GPT-2's shape (8 heads) and
// at [4, 16, 4096, 128] (4), 1.6% below the best at T = 2048 (4) and 1.9% at [64, 6, 256, 64]
// (32) (docs/perf.md).
MT_WGMMA_LAYOUT_HD constexpr int backward_section_heads(int tiles, int sms, int heads) {
  return balanced_section(heads, sms / tiles);
}

}  // namespace mt::wgmma_layout
