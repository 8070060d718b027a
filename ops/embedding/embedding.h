#pragma once
// embedding: a table lookup. ids (int64, any shape) pick rows of W [V, C]:
//
//   y[p, :] = W[ids[p], :]                    p over the positions of ids; y is ids.shape + [C]
//   dW[v, :] += Σ_{p : ids[p] = v} dy[p, :]   '+=' into W's .grad (the grad sink; fp32, f64 for
//                                             f64 W), in order of increasing p for every v
//
// The backward is a scatter-add: one id may appear at many positions of a batch (a common token
// thousands of times), and every one of those rows must be added into the same row of dW. Adding
// them with float atomics would give bits that depend on the order in which threads arrive. Here
// each row of dW is summed by one thread per column, over its positions in increasing order, so
// the bits are the same on every run and on both devices' orders of summation (fp32 on CUDA,
// double on the CPU, then rounded).
//
// Saved vs recomputed: ids only (8 bytes a position); W is not needed by the backward at all,
// and dy is what arrives. Nothing is recomputed.
//
// Grids (CUDA, embedding.cu):
//   forward   a one-block check of the ids (any outside [0, V) goes to the device error record,
//             below), then a grid-stride gather over 16-byte packs of the output (8 bf16/f16, 4
//             f32) when C and the pointers allow, else elements; y '='.
//   backward  (1) a map writes (key = id, value = position) pairs; (2) cub's radix sort orders
//             them by id, stably, so each id's positions stay increasing; (3) a warp per sorted
//             pair and per 32 packs of columns: the warp whose pair starts a run of equal ids sums
//             dy over the run in order (fp32 registers) and adds the total into dW's row ('+=');
//             the others return. No host round trip: the sort's scratch comes from the stream's
//             pool and its size from the element count alone, so the backward can be captured in
//             a CUDA graph.
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
