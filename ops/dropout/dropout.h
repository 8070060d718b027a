#pragma once
// dropout: each element is kept with probability 1 − p and scaled by 1 / (1 − p), or zeroed.
//
//   r_i    = word i % 4 of Philox4x32-10(counter = (i / 4, offset), key = seed)   (philox.h)
//   keep_i = r_i >= threshold,   threshold = round(p · 2³²)  (P(drop) = threshold / 2³² ≈ p)
//   y_i    = keep_i ? x_i · s : 0,   s = 1 / (1 − p)        '=' into a new tensor, x's dtype
//   dx_i   = keep_i ? dy_i · s : 0                           '=' into a new tensor
// i is the element's index in x viewed as contiguous; s is rounded once to the math type (fp32,
// f64 for f64) and each result is one product rounded once, so CPU and CUDA give the same bits.
//
// The mask is a pure function of (seed, offset, i): no generator state, so a run resumed from a
// checkpoint draws the same masks, and the CPU and CUDA kernels draw the same mask. `offset`
// names the call: give every dropout call of a run its own (e.g. step · calls_per_step + call);
// two calls with different offsets never share a random word, whatever their sizes (the offset is
// half of the counter, the element group the other half).
//
// Saved vs recomputed: NOTHING tensor-sized is saved: the backward regenerates keep_i from
// (seed, offset, i), 10 Philox rounds per 4 elements, arithmetic a memory-bound kernel hides. A
// saved mask would cost a write in the forward and a read in the backward of at least 1 byte per
// element (1 bit packed): 1/4 more traffic than the forward's 4 bytes per bf16 element, and the
// memory held from forward to backward, for every dropout in the model.
//
// Grids (CUDA, dropout.cu): both passes are grid-stride maps, 256 threads a block, at most 2048
// blocks, one 16-byte pack per thread per step (8 bf16/f16, 4 f32: two or one Philox call, each
// giving four consecutive elements' words); unaligned buffers take the same kernel one element
// at a time, which draws the same words. No reduction: nothing is added into.
//
// p = 0, or training = false: the identity, x itself is returned (no node, no copy). p must be
// in [0, 1).
#include <cstdint>

#include "core/tensor.h"

namespace mt {

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, bool training = true);

// y = x · mask · s (forward) or dx = dy · mask · s (backward: the same kernel on dy). in, out
// contiguous, same shape and dtype; threshold and scale as above.
using DropoutFn = void(const Tensor& in, uint32_t threshold, double scale, uint64_t seed,
                       uint64_t offset, const Tensor& out);

// The threshold for drop probability p (p in [0, 1)).
uint32_t dropout_threshold(double p);

}  // namespace mt
