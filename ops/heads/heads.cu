// split_heads and merge_heads on the GPU: one permutation kernel for both directions of both ops.
// The math and the grid are in heads.h.
//
// Bytes: every element is read once and written once, so the floor is the tensor's bytes at copy
// bandwidth. The index arithmetic is in 32-bit where the element count allows it (always, for a
// GPT-2 step): 64-bit division is a long instruction sequence on the GPU and would cost more than
// the move it addresses.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/glue.h"
#include "core/registry.h"
#include "ops/heads/heads.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;

// Moves n = P·B·H·T·dv units of type U (a 16-byte pack, or one element) between the heads
// tensors h0..h2 ([B, H, T, dv] units each) and packed ([B, T, P, H, dv] units).
template <class U, class I>
__global__ void __launch_bounds__(kThreads)
heads_copy_kernel(U* __restrict__ packed, U* __restrict__ h0, U* __restrict__ h1,
                  U* __restrict__ h2, I B, I T, I H, I dv, I P, bool to_heads) {
  const I per_part = B * H * T * dv;
  const I n = P * per_part;
  for (I idx = I(blockIdx.x) * kThreads + I(threadIdx.x); idx < n; idx += I(gridDim.x) * kThreads) {
    const I p = idx / per_part;
    const I at = idx - p * per_part;  // the unit's index in head tensor p: (b, h, t, i), i fastest
    const I i = at % dv, t = (at / dv) % T, bh = at / (dv * T), h = bh % H, b = bh / H;
    const I packed_at = ((b * T + t) * P + p) * H * dv + h * dv + i;
    U* head = p == 0 ? h0 : (p == 1 ? h1 : h2);
    if (to_heads) head[at] = packed[packed_at];
    else packed[packed_at] = head[at];
  }
}

template <class U>
void launch(void* packed, const std::vector<void*>& heads, int64_t B, int64_t T, int64_t H,
            int64_t dv, bool to_heads, cudaStream_t s) {
  const int64_t P = int64_t(heads.size()), n = P * B * H * T * dv;
  if (n == 0) return;
  U* h[3] = {static_cast<U*>(heads[0]), nullptr, nullptr};
  for (size_t p = 1; p < heads.size(); ++p) h[p] = static_cast<U*>(heads[p]);
  int device = 0;
  MT_CUDA_CHECK(cudaGetDevice(&device));
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(sm_count(device)) * 16);
  if (n < (int64_t(1) << 31))
    heads_copy_kernel<U, uint32_t><<<unsigned(blocks), kThreads, 0, s>>>(
        static_cast<U*>(packed), h[0], h[1], h[2], uint32_t(B), uint32_t(T), uint32_t(H),
        uint32_t(dv), uint32_t(P), to_heads);
  else
    heads_copy_kernel<U, uint64_t><<<unsigned(blocks), kThreads, 0, s>>>(
        static_cast<U*>(packed), h[0], h[1], h[2], uint64_t(B), uint64_t(T), uint64_t(H),
        uint64_t(dv), uint64_t(P), to_heads);
  MT_CUDA_CHECK(cudaGetLastError());
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace
}  // namespace mt::cuda

// ---- Tensor-level kernel registered for both ops, both phases, on CUDA ----------------------
namespace mt {
namespace {

void heads_copy_cuda(const Tensor& packed, const std::vector<Tensor>& heads, bool to_heads) {
  const int64_t B = heads[0].size(0), H = heads[0].size(1), T = heads[0].size(2), d = heads[0].size(3);
  const size_t elem = dtype_size(packed.dtype()), row = size_t(d) * elem;
  std::vector<void*> ptrs;
  bool packs = row % 16 == 0 && cuda::aligned16(packed.data_ptr());
  for (const Tensor& h : heads) {
    ptrs.push_back(h.data_ptr());
    packs = packs && cuda::aligned16(h.data_ptr());
  }
  cudaStream_t s = cuda::stream_of(packed);
  if (packs) cuda::launch<uint4>(packed.data_ptr(), ptrs, B, T, H, int64_t(row / 16), to_heads, s);
  else if (elem == 8) cuda::launch<uint64_t>(packed.data_ptr(), ptrs, B, T, H, d, to_heads, s);
  else if (elem == 4) cuda::launch<uint32_t>(packed.data_ptr(), ptrs, B, T, H, d, to_heads, s);
  else if (elem == 2) cuda::launch<uint16_t>(packed.data_ptr(), ptrs, B, T, H, d, to_heads, s);
  else MT_CHECK(false, "split_heads / merge_heads: unsupported element size ", elem);
}

}  // namespace

MT_REGISTER_KERNEL(split_heads, Forward, CUDA, heads_copy_cuda);
MT_REGISTER_KERNEL(split_heads, Backward, CUDA, heads_copy_cuda);
MT_REGISTER_KERNEL(merge_heads, Forward, CUDA, heads_copy_cuda);
MT_REGISTER_KERNEL(merge_heads, Backward, CUDA, heads_copy_cuda);

}  // namespace mt
