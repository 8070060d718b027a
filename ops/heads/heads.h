#pragma once
// split_heads and merge_heads: the two reshuffles around attention, as ops of their own.
//
// A GPT's c_attn projection gives, for every token, q, k and v side by side, each cut into H heads
// of d columns; attention wants each head's rows together. With C = H·d:
//
//   split_heads  qkv [B, T, 3·C]  →  q, k, v, each [B, H, T, d]
//                q[b, h, t, i] = qkv[b, t, 0·C + h·d + i],  k: 1·C + …,  v: 2·C + …
//   merge_heads  y [B, H, T, d]   →  [B, T, C]
//                out[b, t, h·d + i] = y[b, h, t, i]
//
// Backward: each is a permutation, so its gradient is the inverse permutation of the upstream
// gradient: split_heads' backward gathers dq, dk, dv into dqkv [B, T, 3·C] (a part that received
// no gradient contributes zeros), merge_heads' scatters dout back to [B, H, T, d]. Nothing is
// saved; both directions are one kernel (the "packed" side [B, T, P·C], P = 3 or 1, and P
// tensors of heads), every output written with '='.
//
// Why ops and not view → permute → contiguous: that chain copies through a generic strided
// kernel, and its backward zero-fills a full [3, B, H, T, d] buffer for each of q, k and v (a
// slice's gradient), adds the three and copies once more: on GPT-2 124M that was a quarter of
// the step (docs/perf.md). Here each direction reads and writes every element once. A model that
// goes straight from the projection to attention needs neither: attention_packed
// (ops/attention) reads the heads in place. These are for work on q, k or v in between.
//
// Grid (CUDA, heads.cu): a grid-stride loop over the heads side's elements in 16-byte packs (8
// bf16/f16, 4 f32) when d's bytes and every pointer allow it, else one element per thread, 256
// threads a block. Each thread moves one pack between its heads address and its packed address:
// consecutive threads walk a row of d, so both sides are read and written in whole rows.
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mt {

// qkv [B, T, 3·C] (any floating dtype), C divisible by n_head → {q, k, v}, each [B, n_head, T,
// C / n_head], contiguous.
std::vector<Tensor> split_heads(const Tensor& qkv, int64_t n_head);

// y [B, H, T, d] → [B, T, H·d], contiguous.
Tensor merge_heads(const Tensor& y);

// packed [B, T, P·H·d] and P ∈ {1, 3} tensors heads[p] [B, H, T, d], all contiguous, one dtype
// and device. to_heads: heads[p] = packed's part p ('='); else packed = the heads ('=').
using HeadsCopyFn = void(const Tensor& packed, const std::vector<Tensor>& heads, bool to_heads);

}  // namespace mt
