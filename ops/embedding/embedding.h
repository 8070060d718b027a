#pragma once
// embedding: a table lookup. ids (int64, any shape) pick rows of W [V, C]:
//
//   y[p, :] = W[ids[p], :]                    p over the positions of ids; y is ids.shape + [C]
//   dW[v, :] += Σ_{p : ids[p] = v} dy[p, :]   '+=' into W's .grad (the grad sink; fp32, f64 for
//                                             f64 W), in a fixed order for every v (below)
//
// The backward is a scatter-add: one id may appear at many positions of a batch (a common token
// thousands of times), and every one of those rows must be added into the same row of dW. Adding
// them with float atomics would give bits that depend on the order in which threads arrive. Here
// the positions are sorted by id (stably: each id's positions stay increasing), cut into chunks of
// 32, and each chunk summed in order; a run of one id that spans several chunks is the sum of its
// chunks' partials in chunk order. The order depends only on the ids, so the bits are the same on
// every run (fp32 on CUDA; the CPU sums each row in double in increasing p, then rounds).
//
// Saved vs recomputed: ids only (8 bytes a position); W is not needed by the backward at all,
// and dy is what arrives. Nothing is recomputed.
//
// Grids (CUDA, embedding.cu):
//   forward   a one-block check of the ids (any outside [0, V) goes to the device error record,
//             below), then a grid-stride gather over 16-byte packs of the output (8 bf16/f16, 4
//             f32) when C and the pointers allow, else elements; y '='.
//   backward  (1) a map writes (key = id, value = position) pairs; (2) cub's radix sort orders
//             them by id, stably; (3) the chunk sum: a warp per chunk of 32 sorted pairs and per
//             slab of 32 packs of columns (16-byte packs of dy, 256 columns in bf16) loads 8 dy
//             rows at a time and adds each run of equal ids in order in fp32 registers; a run that
//             stays inside its chunk goes straight into dW's row ('+=', float4 read-modify-write),
//             one that crosses a chunk boundary leaves its chunk's part in a scratch row; (4) the
//             combine: a block of 8 warps per 8 chunks, for each run that crosses, adds its
//             partials in a fixed order (the 8 warps split a long run's chunks) and the total into
//             dW ('+='). Every element of dW has one writer: no atomics. A token repeated over
//             the whole batch is summed by every warp of the chunk sum at once. No host round
//             trip: the scratch comes from the stream's pool, its size from the element count
//             alone, so the backward can be captured in a CUDA graph.
//
// An id outside [0, V) is an mt::Error naming its position and value: at once on the CPU; on
// CUDA at the next host synchronization with the device (the device-side record that
// cross_entropy's targets use, core/cuda/runtime.h), since checking on the host would stop every
// step. Its output row is NaN, and the backward skips it.
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace mt {

// ids: i64, any shape (positions); W: [V, C] floating (f64/f32/bf16/f16). Returns ids.shape + [C]
// in W's dtype.
Tensor embedding(const Tensor& ids, const Tensor& W);

// ids contiguous; y [n, C] ('=').
using EmbeddingForwardFn = void(const Tensor& ids, const Tensor& W, const Tensor& y);
// dy [n, C] contiguous in W's dtype; dW [V, C] in the grad dtype, '+='.
using EmbeddingBackwardFn = void(const Tensor& ids, const Tensor& dy, const Tensor& dW);

// "embedding: position 5 has id 10, outside [0, 8) for a table of 8 rows"
std::string bad_id_message(int64_t position, int64_t id, int64_t rows);

}  // namespace mt
