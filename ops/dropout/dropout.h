#pragma once
// dropout: each element is kept with probability 1 − p and scaled by 1 / (1 − p), or zeroed.
//
//   r_i    = 16-bit half i % 8 of Philox4x32-10(counter = (i / 8, offset), key = seed)
//            (philox.h: draw, half16)
//   keep_i = r_i >= threshold,   threshold = round(p · 2¹⁶)  (P(drop) = threshold / 2¹⁶ ≈ p)
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
// The offset on the device (CUDA graphs). A captured graph replays its kernels with the
// arguments they were recorded with, so a host offset would give every replay the first step's
// mask. A call may therefore add a device word to its offset: offset = offset + base[0], base an
// i64 [1] tensor on x's device, read by the kernels (forward and backward) when they run. The
// word holds the step's part of the offset and the host argument the call's part within the step.
// advance_dropout_base() moves it from step to step, on the device:
//   run eagerly        base[0] = value               (the host knows the step: value = f(step))
//   in a capture       base[0] += stride             (each replay moves to the next step)
// so a step run eagerly and the same step replayed read the same word, as long as each replay
// runs the step after the previous one (the trainer's loop) and value = first + step · stride.
// The backward reads the word again instead of keeping a copy: advance it only before a step's
// first forward, never between a forward and its backward.
//
// Sixteen bits an element: p is then a multiple of 2⁻¹⁶ (0.1 drops 0.100006 of the elements;
// FlashAttention's dropout uses 8 bits), and one Philox call serves eight elements. With a whole
// 32-bit word an element the integer work, about 25 instructions an element, was what limited
// the kernel on the H200 (77% of copy bandwidth for bf16); at half of it the map is memory-bound.
//
// Saved vs recomputed: NOTHING tensor-sized is saved: the backward regenerates keep_i from
// (seed, offset, i), 10 Philox rounds per 8 elements, arithmetic a memory-bound kernel hides. A
// saved mask would cost a write in the forward and a read in the backward of at least 1 byte per
// element (1 bit packed): 1/4 more traffic than the forward's 4 bytes per bf16 element, and the
// memory held from forward to backward, for every dropout in the model. The base word, when
// given, is saved (one element) so that its version is checked: moved between the forward and
// the backward, it would give the backward another mask, so that is the "modified in place"
// error; advance_dropout_base counts as a write.
//
// Grids (CUDA, dropout.cu): both passes are one grid-stride map, 256 threads a block, a few waves
// of blocks (what fits on the GPU at once, times 4; fewer for small n). A thread takes groups of
// eight elements (one Philox call each), two groups loaded at once as 16-byte packs (a pack of 8
// bf16/f16, two of 4 f32, four of 2 f64) before it draws their words, so loads stay in flight
// while it computes; the n % 8 last elements go one by one. Unaligned buffers take the same
// kernel one element a load, which draws the same words. The base word is read once by each
// thread. No reduction: nothing is added into.
//
// p = 0, or training = false: the identity, x itself is returned (no node, no copy). p must be
// in [0, 1).
#include <cstdint>

#include "core/tensor.h"

namespace mt {

// base: undefined (the offset alone), or an i64 [1] tensor on x's device added to the offset
// when the kernels run (above).
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, bool training = true,
               const Tensor& base = Tensor());

// base[0] = value when run eagerly; recorded in a CUDA graph capture, base[0] += stride (above).
// base: an i64 [1] tensor (its bits are the uint64 word). Not differentiable.
void advance_dropout_base(const Tensor& base, uint64_t value, uint64_t stride);

// y = x · mask · s (forward) or dx = dy · mask · s (backward: the same kernel on dy). in, out
// contiguous, same shape and dtype; threshold and scale as above; base undefined or i64 [1] on
// in's device, its word added to offset.
using DropoutFn = void(const Tensor& in, uint32_t threshold, double scale, uint64_t seed,
                       uint64_t offset, const Tensor& base, const Tensor& out);
// advance_dropout_base's kernel.
using DropoutBaseFn = void(const Tensor& base, uint64_t value, uint64_t stride);

// The threshold for drop probability p (p in [0, 1)) against a 16-bit half: round(p · 2¹⁶).
uint32_t dropout_threshold(double p);

}  // namespace mt
