#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator. Four 32-bit words of output are a pure function of a 128-bit counter
// and a 64-bit key, with no state to carry from one call to the next, so any thread can draw the
// numbers of any position, in any order, on any device, and get the same bits. Dropout, and
// attention's dropout on P, draw one 16-bit half of a word per element (dropout.h).
#include <cstdint>

#ifdef __CUDACC__
#define MT_PHILOX_HD __host__ __device__ __forceinline__
#else
#define MT_PHILOX_HD inline
#endif

namespace mt::philox {

struct U32x4 {
  uint32_t v[4];
};

MT_PHILOX_HD uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t& hi) {
#ifdef __CUDA_ARCH__
  hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t p = uint64_t(a) * b;
  hi = uint32_t(p >> 32);
  return uint32_t(p);
#endif
}

// The ten rounds, the constants of the paper's reference implementation.
MT_PHILOX_HD U32x4 philox4x32_10(U32x4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(kM0, c.v[0], hi0);
    const uint32_t lo1 = mulhilo(kM1, c.v[2], hi1);
    c = U32x4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// The four words of draw `group` of the call keyed by (seed, offset): the counter is
// (group, offset), the key the seed. Dropout's draw `group` serves elements 8·group .. 8·group + 7.
MT_PHILOX_HD U32x4 draw(uint64_t seed, uint64_t offset, uint64_t group) {
  return philox4x32_10(U32x4{{uint32_t(group), uint32_t(group >> 32), uint32_t(offset),
                              uint32_t(offset >> 32)}},
                       uint32_t(seed), uint32_t(seed >> 32));
}

// Half k (k in [0, 8)) of a draw's 128 bits: the low 16 bits of word k / 2 for even k, the high
// 16 bits for odd k. The word is chosen with selects, not an index, so that a kernel keeps r in
// registers whatever k is.
MT_PHILOX_HD uint32_t half16(const U32x4& r, int k) {
  const uint32_t w = k < 4 ? (k < 2 ? r.v[0] : r.v[1]) : (k < 6 ? r.v[2] : r.v[3]);
  return (k & 1) ? w >> 16 : w & 0xffffu;
}

}  // namespace mt::philox
