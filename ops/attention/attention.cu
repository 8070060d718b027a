// Causal attention on the GPU, one (batch, head) = one [T, d] slice of q, k, v, o, found through
// a HeadsLayout (attention_cuda.h): the same kernels read a head's rows from a contiguous [B, H,
// T, d] tensor or in place from the [B, T, 3·C] projection, and write O into [B, H, T, d] or
// straight into [B, T, C]. The math is in attention.h; scores are kept in log2 units here
// (x = S · log2 e), so every exponential is one exp2, and L (natural log) = (m₂ + log2 ℓ) · ln 2.
//
// Tensor-core path (bf16, f16; d = 32, 64, 128). Blocks of 4 warps. Tiles of q, k, v or dO sit
// in shared memory with each row padded by 16 bytes, so the 8 rows an ldmatrix reads fall in 8
// different bank groups. Tiles arrive by cp.async (16 bytes a thread, rows past T filled with
// zeros), double-buffered: the next tile loads while this one is multiplied. Products are
// mma.sync m16n8k16 with fp32 accumulators; a warp owns whole rows of every product, and a score
// tile's accumulators are re-packed in registers as the A operand of the next product (P·V,
// Pᵀ·dO, dSᵀ·Q, dS·K), so P and dS never touch shared memory. Tile shapes are at the launchers
// (fwd_keys and the rest), set by the registers they need.
//   forward    grid (B·H, T/128 Q tiles), the last Q tile first (it walks the most K/V tiles);
//              every tile kernel's grid has the heads in x (tile_grid: longest walks first; the
//              Hopper passes take their blocks in sections of heads, below).
//              Each warp keeps its 32 rows of q in registers (re-read from shared memory at
//              d = 128) and walks the K/V tiles up to its diagonal (the only ones masked) with
//              the online softmax: per row a running max m and sum ℓ (a thread's partial sum,
//              a tile's terms in four running sums; its quad adds them at the end), the output
//              rescaled by exp2(m_old − m_new) whenever m grows. Writes O = acc / ℓ and L.
//   backward   1. D = rowsum(dO ∘ O): eight lanes a row, 16-byte packs (any dtype).
//              2. dK, dV: grid (B·H, T/64 K tiles). A block owns 64 keys (16 a warp) and walks
//                 the Q tiles from its diagonal to T: Sᵀ = K·Qᵀ, P = exp2(x − L),
//                 dPᵀ = V·dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D), then dV += Pᵀ·dO and dK += dSᵀ·Q in fp32
//                 registers.
//              3. dQ (deterministic): grid (B·H, T/64 Q tiles); a block owns
//                 its query rows and walks the K/V tiles up to its diagonal, recomputing S, P, dP
//                 and dS (two more GEMMs than FlashAttention-2's atomic dQ) and adding dS·K in
//                 fp32 registers. It needs nothing from pass 2: the two run side by side (a side
//                 branch, eager and in a graph capture). Non-deterministic variant: pass 2 also
//                 writes dSᵀ to shared memory, computes the tile's dS·K and atomicAdds it into an
//                 fp32 scratch; a last map rounds it into dq.
// Hopper path (a compute capability 9.0 GPU and a build for sm_90a; bf16, f16; d = 64, 128): the
// same walks with warpgroup MMA (wgmma) from swizzled shared memory, a warpgroup (4 warps)
// owning 64 query rows or keys, the tiles brought by the tensor memory accelerator (TMA) instead
// of cp.async; the sections "on Hopper" below hold the layout.
//   forward    forward_wg: persistent, a block an SM (a producer warpgroup, two consumer
//              warpgroups of 64 rows taking turns at the tensor cores) taking Q tiles of 128 rows
//              from a counter, in sections of heads, the longest walks first in each (two Q
//              buffers, so the next item's Q lands during this one); K/V tiles of 128 keys. With
//              dropout, forward_wg_dropout: grid (B·H, T/128 Q tiles), the last first, 2
//              warpgroups a block sharing the K/V tiles.
//   backward   dkdv_wg and dq_wg take passes 2 and 3 when the backward is deterministic and
//              without dropout (the same bits as the mma.sync passes): grids (B·H, T/64·G K or
//              Q tiles), G = 1 warpgroup a block at d = 64 (Q tiles of 128 rows for dK/dV),
//              2 at d = 128; block b takes the b-th (head, tile) of the forward's order, in
//              sections of the heads whose blocks number at most the SMs
//              (backward_section_heads).
// CUDA-core path (f32; bf16 and f16 at other d ≤ 256): one warp per row (forward, dQ) or per key
// (dK, dV), lane ℓ scoring key (or query) j0 + ℓ of each group of 32, fp32 throughout.
// Dropout on P (attention.h): each kernel that supports it (all but D's and the Hopper backward
// passes; the Hopper forward has a kernel for each case) is a template of kDrop, and the launchers
// pick the instantiation without it for p = 0, so that path is the kernel as it was. With it, every
// thread reads the base word once when it starts and draws the words of the probabilities it holds:
// the forward and the dQ pass hold a row's keys 2t and 2t + 1 (one Philox call for both), the dK/dV
// pass a key's queries 2t and 2t + 1 (two rows: one call each), the CUDA-core lanes one element
// each; elements past the diagonal or T draw nothing. Dropped values are zeroed in P before P·V
// (after ℓ took them) and in Pᵀ before Pᵀ·dO; the 1/(1 − p) of the kept ones multiplies O with 1/ℓ
// and dV at its store, while dP is scaled element by element before − D.
//
// Accumulation: O, L, D, dQ, dK, dV all '='. Every sum has a fixed order (mma k-order, the quad
// shuffles, the tile walk), and the kernel and its grid depend only on the shape, the device and
// the build, so the same inputs give the same bits on every run there; only the atomic dQ
// variant does not. The Hopper forward's 128-key tiles give O and L other last bits than
// forward_tc's.
#include "ops/attention/attention_cuda.h"
#include "ops/attention/attention_testing.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include <cuda.h>  // CUtensorMap (the driver's entry point is found at run time, no libcuda link)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda/check.h"
#include "core/cuda/fast_exp.cuh"
#include "core/cuda/glue.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/runtime.h"
#include "core/cuda/vec.cuh"
#include "core/registry.h"
#include "core/switches.h"
#include "ops/attention/attention.h"
#include "ops/attention/wgmma_layout.h"
#include "ops/dropout/dropout.h"
#include "ops/dropout/philox.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;      // rows of a Q tile (forward, dQ) and of a K tile (dK/dV)
constexpr int kPad = 8;        // elements of padding per shared-memory row: 16 bytes
constexpr float kInf = __builtin_huge_valf();

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The element offset of head bh's row 0 (attention_cuda.h).
__device__ __forceinline__ int64_t head_base(const HeadsLayout& l, int bh) {
  return int64_t(bh / int(l.heads)) * l.batch + int64_t(bh % int(l.heads)) * l.head;
}

// ---- PTX wrappers ---------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; !valid writes 16 zero bytes (src-size 0).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a · b for one m16n8k16 tile, fp32 accumulators.
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two fp32 values as one register of two 16-bit ones (lo in the low half: the lower column).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// ---- dropout on P (attention.h) ---------------------------------------------------------------
// Each kernel is instantiated twice, kDrop false (no dropout: the code below has no trace of it)
// and true. Element e = (bh·T + i)·T + j of P is kept where 16-bit half e % 8 of Philox draw
// e / 8 clears the threshold, as on the CPU and in ops/dropout.

struct Drop {
  uint32_t threshold;
  float scale;
  uint64_t seed, offset;
};

// The key as the kernel uses it: the device word added to the offset, read when the kernel runs
// (a CUDA graph replay reads that replay's word). Without dropout nothing is read.
template <bool kDrop>
__device__ __forceinline__ Drop drop_of(const AttentionDropoutArgs& a) {
  if constexpr (!kDrop) return Drop{};
  else return {a.threshold, a.scale, a.seed, a.offset + (a.base != nullptr ? *a.base : 0)};
}

// Whether element e of P is kept.
__device__ __forceinline__ bool kept(const Drop& dr, uint64_t e) {
  return philox::half16(philox::draw(dr.seed, dr.offset, e / 8), int(e % 8)) >= dr.threshold;
}

// Elements e and e + 1 (two adjacent keys of one row, as a thread holds them in an accumulator
// tile): one draw serves both unless e is the last half of its draw.
__device__ __forceinline__ void kept_pair(const Drop& dr, uint64_t e, bool& k0, bool& k1) {
  const philox::U32x4 r = philox::draw(dr.seed, dr.offset, e / 8);
  const int k = int(e % 8);
  k0 = philox::half16(r, k) >= dr.threshold;
  k1 = (k < 7 ? philox::half16(r, k + 1)
              : philox::half16(philox::draw(dr.seed, dr.offset, e / 8 + 1), 0)) >= dr.threshold;
}

// The index of P[row, 0] for head bh.
__device__ __forceinline__ uint64_t p_row(int bh, int row, int T_len) {
  return (uint64_t(bh) * uint64_t(T_len) + uint64_t(row)) * uint64_t(T_len);
}

// ---- warp-level tile products -----------------------------------------------------------------
// A warp's accumulator tile acc[MT][N/8][4] is 16·MT rows × N columns in mma's layout: with
// g = lane/4 and t = lane%4, acc[m][n][e] is row 16m + g + 8·(e/2), column 8n + 2t + e%2. A warp
// with MT = 2 reuses every B fragment it loads from shared memory for two mma, which halves the
// shared-memory traffic per FLOP (with MT = 1 it, not the tensor cores, bounds the forward).

// ROWS rows of D elements, `stride` apart, from global row row0 on (zeros past T) into a padded
// shared tile.
template <class T, int D, int ROWS, int kBlockThreads>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t stride, int row0, int T_len) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += kBlockThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = row0 + r < T_len;
    cp_async16(s + r * (D + kPad) + c * 8, g + int64_t(valid ? row0 + r : 0) * stride + c * 8,
               valid);
  }
}

// The A fragments of 16·MT rows × K columns of a row-major shared tile (stride in elements).
template <int MT, int K, class T>
__device__ __forceinline__ void load_a(uint32_t (&a)[MT][K / 16][4], const T* s, int stride) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk)
      ldmatrix_x4(a[m][kk], s + (m * 16 + lane % 16) * stride + kk * 16 + (lane / 16) * 8);
}

// The B fragments of two n8 tiles (n0 .. n0 + 15) × k16 (k0 ..) of B[k][n] = sB[n][k] (stored
// n-major: "NT"), or of B = sB[k][n] (stored k-major: "NN", ldmatrix transposes on the way).
template <class T>
__device__ __forceinline__ void load_b_nt(uint32_t (&b)[4], const T* sB, int stride, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(b, sB + (n0 + lane % 8 + (lane / 16) * 8) * stride + k0 + ((lane / 8) % 2) * 8);
}
template <class T>
__device__ __forceinline__ void load_b_nn(uint32_t (&b)[4], const T* sB, int stride, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4_trans(b, sB + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * stride + n0 + (lane / 16) * 8);
}

// acc += A · B, A in registers (16·MT × K), B from shared memory, NT or NN (kTransB).
template <bool kTransB, int MT, int N, int K, class T>
__device__ __forceinline__ void mma_reg(float (&acc)[MT][N / 8][4], const uint32_t (&a)[MT][K / 16][4],
                                        const T* sB, int stride) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      uint32_t b[4];
      if constexpr (kTransB) load_b_nn(b, sB, stride, nn * 16, kk * 16);
      else load_b_nt(b, sB, stride, nn * 16, kk * 16);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma<T>(acc[m][2 * nn], a[m][kk], b[0], b[1]);
        mma<T>(acc[m][2 * nn + 1], a[m][kk], b[2], b[3]);
      }
    }
}

// acc += A · Bᵀ-stored (NT) with A read from shared memory one k-step at a time: fewer registers.
template <int MT, int N, int K, class T>
__device__ __forceinline__ void mma_smem_nt(float (&acc)[MT][N / 8][4], const T* sA, const T* sB,
                                            int stride) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
      ldmatrix_x4(a[m], sA + (m * 16 + lane % 16) * stride + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      uint32_t b[4];
      load_b_nt(b, sB, stride, nn * 16, kk * 16);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        mma<T>(acc[m][2 * nn], a[m], b[0], b[1]);
        mma<T>(acc[m][2 * nn + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// An accumulator tile rounded to T as the A operand (16·MT × N along k) of the next product.
template <int MT, int N, class T>
__device__ __forceinline__ void to_a(const float (&acc)[MT][N / 8][4], uint32_t (&a)[MT][N / 16][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
      a[m][kk][0] = pack2<T>(acc[m][2 * kk][0], acc[m][2 * kk][1]);
      a[m][kk][1] = pack2<T>(acc[m][2 * kk][2], acc[m][2 * kk][3]);
      a[m][kk][2] = pack2<T>(acc[m][2 * kk + 1][0], acc[m][2 * kk + 1][1]);
      a[m][kk][3] = pack2<T>(acc[m][2 * kk + 1][2], acc[m][2 * kk + 1][3]);
    }
}

// The rows of an accumulator tile starting at global row row0, times `mul`, rounded to T, into
// global rows < T, `stride` apart (each thread writes 4 bytes; a quad, 16 contiguous bytes).
template <int MT, int N, class T>
__device__ __forceinline__ void store_rows(T* g_out, int64_t stride,
                                           const float (&acc)[MT][N / 8][4], int row0, int T_len,
                                           float mul) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 16 * m + g + 8 * h;
      if (row >= T_len) continue;
#pragma unroll
      for (int n = 0; n < N / 8; ++n)
        *reinterpret_cast<uint32_t*>(g_out + int64_t(row) * stride + n * 8 + 2 * t) =
            pack2<T>(acc[m][n][2 * h] * mul, acc[m][n][2 * h + 1] * mul);
    }
}

template <int MT, int N>
__device__ __forceinline__ void zero(float (&acc)[MT][N][4]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < N; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;
}

// The online softmax of one score tile for rows w0 + 16m + g + 8h, in three steps that the Hopper
// forward runs apart (the maxima while a product is in flight): mask_tile sets the keys past each
// row to −∞; row_max takes the new running max m of each row (log2 units) and the factor
// corr = exp2(m_old − m_new) that rescales ℓ (here) and the output (rescale_rows); exp_tile
// writes P = exp2(x − m) unnormalised in place of the scores and adds it to ℓ.
template <int MT, int BC>
__device__ __forceinline__ void mask_tile(float (&s)[MT][BC / 8][4], int key0, int w0, int g,
                                          int t) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < BC / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[m][n][e] = key0 + n * 8 + 2 * t + e % 2 > w0 + 16 * m + g + 8 * (e / 2) ? -kInf
                                                                                  : s[m][n][e];
}

// The max of a row's BC/4 scores in this thread as a tree (depth log2, not a chain of BC/4), then
// over its quad: exact in any order, so the bits do not depend on it.
template <int MT, int BC>
__device__ __forceinline__ void row_max(const float (&s)[MT][BC / 8][4], float (&m_run)[MT][2],
                                        float (&l)[MT][2], float (&corr)[MT][2],
                                        float scale_log2) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v[BC / 8];
#pragma unroll
      for (int n = 0; n < BC / 8; ++n) v[n] = fmaxf(s[m][n][2 * h], s[m][n][2 * h + 1]);
#pragma unroll
      for (int step = 1; step < BC / 8; step *= 2)
#pragma unroll
        for (int n = 0; n < BC / 8; n += 2 * step) v[n] = fmaxf(v[n], v[n + step]);
      float mx = fmaxf(v[0], __shfl_xor_sync(0xffffffffu, v[0], 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[m][h], mx * scale_log2);
      corr[m][h] = fast_exp2(m_run[m][h] - (m_new == -kInf ? 0.0f : m_new));
      m_run[m][h] = m_new;
      l[m][h] *= corr[m][h];
    }
}

// The tile's P of a row is summed in four running sums (element e of n-block n into sum
// 2·(n % 2) + e % 2), added pairwise into ℓ: four short chains of additions instead of one of
// BC/4, a fixed order all the same.
template <int MT, int BC>
__device__ __forceinline__ void exp_tile(float (&s)[MT][BC / 8][4], const float (&m_run)[MT][2],
                                         float (&l)[MT][2], float scale_log2) {
  static_assert(BC % 16 == 0);
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_use = m_run[m][h] == -kInf ? 0.0f : m_run[m][h];  // a row with nothing yet
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int n = 0; n < BC / 8; ++n)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const float p = fast_exp2(s[m][n][e] * scale_log2 - m_use);
          s[m][n][e] = p;
          part[2 * (n % 2) + e % 2] += p;
        }
      l[m][h] += (part[0] + part[1]) + (part[2] + part[3]);
    }
}

template <int MT, int D>
__device__ __forceinline__ void rescale_rows(float (&acc)[MT][D / 8][4],
                                             const float (&corr)[MT][2]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][n][e] *= corr[m][e / 2];
}

// All three on one tile; only a tile reaching past the warp's first row has keys to mask.
template <int MT, int BC, int D>
__device__ __forceinline__ void online_softmax(float (&s)[MT][BC / 8][4],
                                               float (&acc)[MT][D / 8][4], float (&m_run)[MT][2],
                                               float (&l)[MT][2], int key0, int w0, int g, int t,
                                               float scale_log2) {
  if (key0 + BC - 1 > w0) mask_tile<MT, BC>(s, key0, w0, g, t);
  float corr[MT][2];
  row_max<MT, BC>(s, m_run, l, corr, scale_log2);
  rescale_rows<MT, D>(acc, corr);
  exp_tile<MT, BC>(s, m_run, l, scale_log2);
}

// Dropout on a tile of P after ℓ took it: P·Z goes into the product and Z's 1/(1 − p) comes at
// the end. Rows w0 + 16m + g + 8h, keys key0 + 8n + 2t and + 1 (one draw for both); elements
// past the diagonal or T are 0 already and draw nothing.
template <int MT, int BC>
__device__ __forceinline__ void drop_tile(float (&s)[MT][BC / 8][4], const Drop& dr, int bh,
                                          int key0, int w0, int g, int t, int T_len) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = w0 + 16 * m + g + 8 * h, j = key0 + 2 * t;
#pragma unroll
      for (int n = 0; n < BC / 8; ++n) {
        if (row >= T_len || j + n * 8 > row) continue;
        bool k0, k1;
        kept_pair(dr, p_row(bh, row, T_len) + uint64_t(j + n * 8), k0, k1);
        if (!k0) s[m][n][2 * h] = 0.0f;
        if (!k1) s[m][n][2 * h + 1] = 0.0f;
      }
    }
}

// The end of a forward walk: each row's ℓ summed over its quad, L = (m + log2 ℓ) · ln 2 written,
// and O = acc · mul / ℓ stored (mul: dropout's 1/(1 − p), else 1).
template <int MT, int D, class T>
__device__ __forceinline__ void finish_rows(float (&acc)[MT][D / 8][4], const float (&m_run)[MT][2],
                                            const float (&l)[MT][2], int w0, int g, int t,
                                            int T_len, int bh, float* lse, T* o, int64_t stride,
                                            float mul) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[m][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = w0 + 16 * m + g + 8 * h;
      if (t == 0 && row < T_len) lse[int64_t(bh) * T_len + row] = (m_run[m][h] + log2f(sum)) * kLn2;
      const float inv = 1.0f / sum * mul;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) acc[m][n][2 * h] *= inv, acc[m][n][2 * h + 1] *= inv;
    }
  store_rows<MT, D, T>(o, stride, acc, w0, T_len, 1.0f);
}

// The Hopper backward's elementwise steps (it has no dropout), in two parts so that a warpgroup
// can take the exponentials while dP's product is still in flight: P = exp2(x − L) in place of
// S (masked), then dS = P ∘ (dP − D) in place of dP. (key_tile_grads and row_tile_grads below do
// both at once, with or without dropout, for the mma.sync kernels; they stay apart so those
// kernels' code is unchanged.) In the dK/dV pass a thread's elements are its keys j_base,
// j_base + 8 against queries i0 + 8n + 2t (+ 1), so L and D are per column (shared memory), and
// edge says the causal mask or T cut the tile; in the dQ pass rows w0 + 16m + g + 8h against
// keys j0 + 8n + 2t (+ 1), per row.
template <int BR>
__device__ __forceinline__ void key_tile_p(float (&s)[1][BR / 8][4], const float* L, int i0,
                                           int j_base, int t, bool edge, int T_len,
                                           float scale_log2) {
#pragma unroll
  for (int n = 0; n < BR / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int il = n * 8 + 2 * t + e % 2, i = i0 + il, j = j_base + 8 * (e / 2);
      const float p = fast_exp2(s[0][n][e] * scale_log2 - L[il]);
      s[0][n][e] = edge && (i < j || i >= T_len) ? 0.0f : p;
    }
}
template <int BR>
__device__ __forceinline__ void key_tile_ds(const float (&p)[1][BR / 8][4],
                                            float (&dp)[1][BR / 8][4], const float* Dr, int t) {
#pragma unroll
  for (int n = 0; n < BR / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dp[0][n][e] = p[0][n][e] * (dp[0][n][e] - Dr[n * 8 + 2 * t + e % 2]);
}
template <int MT, int BC>
__device__ __forceinline__ void row_tile_p(float (&s)[MT][BC / 8][4], const float (&L)[MT][2],
                                           int j0, int w0, int g, int t, float scale_log2) {
  const bool edge = j0 + BC - 1 > w0;  // some key of the tile is after some row: mask
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < BC / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = w0 + 16 * m + g + 8 * (e / 2), j = j0 + n * 8 + 2 * t + e % 2;
        const float p = fast_exp2(s[m][n][e] * scale_log2 - L[m][e / 2]);
        s[m][n][e] = edge && j > i ? 0.0f : p;
      }
}
template <int MT, int BC>
__device__ __forceinline__ void row_tile_ds(const float (&p)[MT][BC / 8][4],
                                            float (&dp)[MT][BC / 8][4], const float (&Dr)[MT][2]) {
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < BC / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[m][n][e] = p[m][n][e] * (dp[m][n][e] - Dr[m][e / 2]);
}

// The dK/dV pass's elementwise step on a tile: Sᵀ and dPᵀ (this warp's keys j_base, j_base + 8
// against queries i0 + 8n + 2t (+ 1)) become P·Z in s (for dV += Pᵀ·dO) and dSᵀ = P ∘ (Z ∘ dPᵀ − D)
// in dp (for dK += dSᵀ·Q); L in log2 units. edge: the causal mask or T cut the tile.
template <int BR, bool kDrop>
__device__ __forceinline__ void key_tile_grads(float (&s)[1][BR / 8][4],
                                               float (&dp)[1][BR / 8][4], const float* L,
                                               const float* Dr, int i0, int j_base, int t,
                                               bool edge, int T_len, float scale_log2,
                                               const Drop& dr, int bh) {
#pragma unroll
  for (int n = 0; n < BR / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int il = n * 8 + 2 * t + e % 2, i = i0 + il, j = j_base + 8 * (e / 2);
      float p = fast_exp2(s[0][n][e] * scale_log2 - L[il]);
      if (edge && (i < j || i >= T_len)) p = 0.0f;
      float pz = p, dpz = dp[0][n][e];
      if constexpr (kDrop) {  // Z: P·Z into dV (1/(1 − p) at its store), dP = Z ∘ (dO·vᵀ)
        const bool keep = i >= j && i < T_len && kept(dr, p_row(bh, i, T_len) + j);
        pz = keep ? p : 0.0f;
        dpz = keep ? dpz * dr.scale : 0.0f;
      }
      s[0][n][e] = pz;
      dp[0][n][e] = p * (dpz - Dr[il]);  // dSᵀ
    }
}

// The dQ pass's elementwise step on a tile: dP of rows w0 + 16m + g + 8h against keys
// j0 + 8n + 2t (+ 1) becomes dS = P ∘ (Z ∘ dP − D) in place, P = exp2(x − L) from s.
template <int MT, int BC, bool kDrop>
__device__ __forceinline__ void row_tile_grads(const float (&s)[MT][BC / 8][4],
                                               float (&dp)[MT][BC / 8][4], const float (&L)[MT][2],
                                               const float (&Dr)[MT][2], int j0, int w0, int g,
                                               int t, int T_len, float scale_log2, const Drop& dr,
                                               int bh) {
  const bool edge = j0 + BC - 1 > w0;  // some key of the tile is after some row: mask
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < BC / 8; ++n) {
      [[maybe_unused]] bool keep[4] = {true, true, true, true};
      if constexpr (kDrop) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = w0 + 16 * m + g + 8 * h, j = j0 + n * 8 + 2 * t;
          if (i < T_len && j <= i)  // else masked: p = 0
            kept_pair(dr, p_row(bh, i, T_len) + uint64_t(j), keep[2 * h], keep[2 * h + 1]);
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = w0 + 16 * m + g + 8 * (e / 2), j = j0 + n * 8 + 2 * t + e % 2;
        float p = fast_exp2(s[m][n][e] * scale_log2 - L[m][e / 2]);
        if (edge && j > i) p = 0.0f;
        float dpz = dp[m][n][e];
        if constexpr (kDrop) dpz = keep[e] ? dpz * dr.scale : 0.0f;  // dP = Z ∘ (dO·vᵀ)
        dp[m][n][e] = p * (dpz - Dr[m][e / 2]);  // dS
      }
    }
}

// ---- tensor-core forward ----------------------------------------------------------------------
// Block: kWarps warps of 16·MT query rows each (kBM rows); K/V tiles of BC keys.

template <class T, int D, int MT, int BC, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    forward_tc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
               HeadsLayout in, T* __restrict__ o, HeadsLayout out, float* __restrict__ lse,
               int T_len, float scale_log2, AttentionDropoutArgs dropout) {
  constexpr int kS = D + kPad, kBM = kWarps * 16 * MT;
  constexpr bool kHoldQ = D <= 64;  // q's fragments in registers; at d = 128 re-read per tile
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kBM * kS;      // [2][BC][kS]
  T* sV = sK + 2 * BC * kS;   // [2][BC][kS]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned head = blockIdx.x;                             // tile_grid: heads in x,
  const int q0 = (int(gridDim.y) - 1 - int(blockIdx.y)) * kBM;  // the longest walk first
  const int w0 = q0 + warp * 16 * MT;                           // this warp's first row
  const int64_t base = head_base(in, head);
  const int tiles = int(ceil_div(min(q0 + kBM, T_len), BC));  // keys up to the block's last row
  [[maybe_unused]] const Drop dr = drop_of<kDrop>(dropout);
  load_tile<T, D, kBM, kThreads>(sQ, q + base, in.row, q0, T_len);
  load_tile<T, D, BC, kThreads>(sK, k + base, in.row, 0, T_len);
  load_tile<T, D, BC, kThreads>(sV, v + base, in.row, 0, T_len);
  cp_async_commit();

  float acc[MT][D / 8][4];
  zero(acc);
  float m_run[MT][2], l[MT][2];  // per row 16m + g + 8h: running max (log2 units), partial sum
#pragma unroll
  for (int m = 0; m < MT; ++m) m_run[m][0] = m_run[m][1] = -kInf, l[m][0] = l[m][1] = 0.0f;
  uint32_t qa[kHoldQ ? MT : 1][kHoldQ ? D / 16 : 1][4];
  const T* sQw = sQ + warp * 16 * MT * kS;
  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait_all();
    __syncthreads();  // tile kt landed, and every warp is done with the buffer refilled next
    const int buf = kt & 1;
    if constexpr (kHoldQ)
      if (kt == 0) load_a<MT, D>(qa, sQw, kS);
    if (kt + 1 < tiles) {
      load_tile<T, D, BC, kThreads>(sK + (buf ^ 1) * BC * kS, k + base, in.row, (kt + 1) * BC,
                                    T_len);
      load_tile<T, D, BC, kThreads>(sV + (buf ^ 1) * BC * kS, v + base, in.row, (kt + 1) * BC,
                                    T_len);
    }
    cp_async_commit();

    float s[MT][BC / 8][4];  // raw q·k; scaled inside the exponent
    zero(s);
    if constexpr (kHoldQ) mma_reg<false, MT, BC, D>(s, qa, sK + buf * BC * kS, kS);
    else mma_smem_nt<MT, BC, D>(s, sQw, sK + buf * BC * kS, kS);
    online_softmax<MT, BC, D>(s, acc, m_run, l, kt * BC, w0, g, t, scale_log2);
    if constexpr (kDrop) drop_tile<MT, BC>(s, dr, head, kt * BC, w0, g, t, T_len);
    uint32_t pa[MT][BC / 16][4];
    to_a<MT, BC, T>(s, pa);
    mma_reg<true, MT, D, BC>(acc, pa, sV + buf * BC * kS, kS);
  }

  finish_rows<MT, D, T>(acc, m_run, l, w0, g, t, T_len, head, lse, o + head_base(out, head),
                        out.row, kDrop ? dr.scale : 1.0f);
}

// ---- tensor-core forward on Hopper: warpgroup products (sm_90a) ------------------------------
// The walk of forward_tc with the products issued by warpgroups (4 warps, 64 query rows each) as
// wgmma: S = Q·Kᵀ with both operands read by the tensor cores straight from shared memory, and
// O += P·V with P in registers (S's accumulators re-packed, as above: wgmma's accumulator layout
// per warp is mma.sync's) and V from shared memory. A wgmma runs asynchronously; the warpgroup
// waits for it (wgmma.wait_group) before it reads the result. Shared-memory operands are tiles
// of 64-column slabs whose 128-byte rows are swizzled: 16-byte chunk c of row r sits at chunk
// c ^ (r % 8), the layout wgmma's 128-byte swizzle mode reads without bank conflicts; each slab
// starts on a 1024-byte boundary (the swizzle is a function of address bits 4-9). Tiles arrive
// by TMA, which swizzles them on the way in: one thread issues a copy a slab, and an mbarrier
// per buffer tells the block when its bytes have landed, so no thread spends instructions on a
// copy's addresses and swizzle, as with cp.async (16 bytes a thread): on an H200 the forward ran
// 1.12x as fast at GPT-2's shape, 1.17x at T = 2048 and 1.45x at d = 128. Q and K are
// read K-major (d along a row), V MN-major (the tensor cores transpose it). Built only where the
// architecture list holds sm_90a (wgmma is not in plain sm_90); the launcher picks it on such a
// device for bf16 and f16 at d = 64 and 128 (with dropout forward_wg_dropout, below), forward_tc
// elsewhere.
//   Warp-specialized and persistent, as FlashAttention-3: one block an SM (grid: min(SMs, work
//   items)) of three warpgroups. The producer's one thread issues every copy (its registers go to
//   the others by setmaxnreg: 40 against 232): an item's Q tile (128 rows), then its K/V tiles
//   into S buffers (4 at d = 64, 2 at d = 128), each waiting for its buffer to be released. The
//   two consumer warpgroups own 64 rows each and walk the same K/V tiles; in a tile they issue
//   S = Q·Kᵀ of this tile and O += P·V of the one before together, take the row maxima of S
//   while P·V runs, then the exponentials. They take turns (named barriers): one issues its
//   products while the other runs its softmax, so the tensor cores and the exp2 units work at
//   once. Items are (head, Q tile) pairs, in sections of heads whose K and V fit in a third of
//   L2 and in a section longest walk first (wgmma_layout.h's work_item: 1.06x at GPT-2's shape
//   on an H100 against one section of all heads, whose K and V L2 could not hold); the
//   first grid's worth go one a block, every later one to the block whose producer asks the
//   counter next (atomicAdd; each launch leaves the counter at zero for the next, so the
//   framework's stream needs no memset before it), so blocks end together. mbarriers pass
//   every buffer between producer and consumers. Which block takes an item changes from run to
//   run; what it computes does not (one block walks an item whole, in a fixed order), so O and L
//   have the same bits on every run. On an H200: 1.07x the forward of two warpgroups a block
//   that each ran product, softmax, product in turn (the same bits) at GPT-2's shape (perf.md).

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MT_ATTENTION_WGMMA_BODY 1
#endif
constexpr int kWgRows = 64;  // query rows of a warpgroup
constexpr int kWgKeys = 128;  // keys of the forward's K/V tiles

#if defined(MT_ATTENTION_WGMMA_BODY)  // the wgmma helpers exist only in the sm_90a pass
// The descriptor of the tile at p (wgmma_layout.h).
__device__ __forceinline__ uint64_t wg_desc(const void* p, uint32_t leading, uint32_t stride) {
  return wgmma_layout::descriptor(smem_addr(p), leading, stride);
}

// Dynamic shared memory from its first 1024-byte boundary on (the swizzle is a function of
// address bits 4-9); the launchers ask for 1024 bytes more than the tiles take.
__device__ __forceinline__ unsigned char* align_1024(unsigned char* raw) {
  return raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
}

__device__ __forceinline__ void wg_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait_one() {  // all but the last group committed
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}
// The tiles arrive by the tensor memory accelerator (TMA): one thread asks for a box of a tensor
// map (64 elements of d × rows, swizzled as above on the way in, zeros past T) and the copy
// signals an mbarrier with its bytes; the other threads wait for the barrier's phase.
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned arrivals = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals));
}
// One arrival (a copy's barrier's only one) that also says how many bytes the copies will bring.
__device__ __forceinline__ void mbar_expect_bytes(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// One arrival where `pred` (predicated, not branched: no branch while a wgmma is in flight).
__device__ __forceinline__ void mbar_arrive_if(uint64_t* bar, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n"
      ::"r"(smem_addr(bar)), "r"(int(pred))
      : "memory");
}
// The box at (column c0, row, head h, batch b) of `map` into dst, completing on bar.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap& map, int c0, int row,
                                         int h, int b, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(row), "r"(h), "r"(b),
      "r"(smem_addr(bar))
      : "memory");
}
// A tile of ROWS rows from row `row` of head (h, b): its D/64 slabs, one copy each.
template <int D, int ROWS, class T>
__device__ __forceinline__ void tma_tile(T* dst, const CUtensorMap& map, int row, int h, int b,
                                         uint64_t* bar) {
#pragma unroll
  for (int sl = 0; sl < D / 64; ++sl) tma_load(dst + sl * ROWS * 64, map, 64 * sl, row, h, b, bar);
}
// Two such tiles from the same rows (K and V, Q and dO), their slabs' copies interleaved.
template <int D, int ROWS, class T>
__device__ __forceinline__ void tma_tile_pair(T* dst0, const CUtensorMap& map0, int h0, int b0,
                                              T* dst1, const CUtensorMap& map1, int h1, int b1,
                                              int row, uint64_t* bar) {
#pragma unroll
  for (int sl = 0; sl < D / 64; ++sl) {
    tma_load(dst0 + sl * ROWS * 64, map0, 64 * sl, row, h0, b0, bar);
    tma_load(dst1 + sl * ROWS * 64, map1, 64 * sl, row, h1, b1, bar);
  }
}
// The two buffers' barriers, made by one thread before any copy may signal them.
__device__ __forceinline__ void init_buffer_barriers(uint64_t (&full)[2]) {
  if (threadIdx.x == 0) {
    mbar_init(&full[0]);
    mbar_init(&full[1]);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copies
  }
  __syncthreads();
}
// Keeps the compiler from moving the uses of a wgmma's result (accumulators, float) above the
// wait that completes it, or a new value into the A fragments (uint32_t) it reads from registers.
template <class E, int N>
__device__ __forceinline__ void wg_hold(E (&d)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (std::is_same_v<E, float>) asm volatile("" : "+f"(d[n][e])::"memory");
      else asm volatile("" : "+r"(d[n][e])::"memory");
    }
}
// Named barriers 1 and 2 between the forward's two consumer warpgroups (256 threads).
__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void named_arrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

// d (+)= A·B for one m64nNk16 step of the warpgroup, N = 64 or 128: d is this thread's N/2
// accumulators in the mma layout (d[n][e]). wg_ss reads A and B through descriptors (scale-d
// p = accumulate: false overwrites d); wg_rs takes A as four registers (the A fragment of
// mma.sync, its warp's 16 rows) and B MN-major.
#define MT_ACC4(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define MT_ACC32 \
  MT_ACC4(0), MT_ACC4(1), MT_ACC4(2), MT_ACC4(3), MT_ACC4(4), MT_ACC4(5), MT_ACC4(6), MT_ACC4(7)
#define MT_ACC64 MT_ACC32, MT_ACC4(8), MT_ACC4(9), MT_ACC4(10), MT_ACC4(11), MT_ACC4(12), \
                 MT_ACC4(13), MT_ACC4(14), MT_ACC4(15)
#define MT_REGS32                                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "   \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define MT_REGS64                                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "   \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "    \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "    \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
// SS: descriptors %R, %R+1 and the flag %R+2; RS: A %R .. %R+3, descriptor %R+4, flag %R+5.
#define MT_WGMMA_SS(SHAPE, TY, REGS, A, B, P)                                                     \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\nwgmma.mma_async.sync.aligned." SHAPE ".f32." TY \
  "." TY " " REGS ", %" A ", %" B ", p, 1, 1, 0, 0;\n}\n"
#define MT_WGMMA_RS(SHAPE, TY, REGS, A0, A1, A2, A3, B, P)                                        \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\nwgmma.mma_async.sync.aligned." SHAPE ".f32." TY \
  "." TY " " REGS ", {%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" B ", p, 1, 1, 1;\n}\n"

template <class T, int N>
__device__ __forceinline__ void wg_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b,
                                      bool accumulate) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  const int p = accumulate;
  if constexpr (N == 64 && kBf16)
    asm volatile(MT_WGMMA_SS("m64n64k16", "bf16", MT_REGS32, "32", "33", "34")
                 : MT_ACC32 : "l"(a), "l"(b), "r"(p));
  else if constexpr (N == 64)
    asm volatile(MT_WGMMA_SS("m64n64k16", "f16", MT_REGS32, "32", "33", "34")
                 : MT_ACC32 : "l"(a), "l"(b), "r"(p));
  else if constexpr (kBf16)
    asm volatile(MT_WGMMA_SS("m64n128k16", "bf16", MT_REGS64, "64", "65", "66")
                 : MT_ACC64 : "l"(a), "l"(b), "r"(p));
  else
    asm volatile(MT_WGMMA_SS("m64n128k16", "f16", MT_REGS64, "64", "65", "66")
                 : MT_ACC64 : "l"(a), "l"(b), "r"(p));
}

template <class T, int N>
__device__ __forceinline__ void wg_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (N == 64 && kBf16)
    asm volatile(MT_WGMMA_RS("m64n64k16", "bf16", MT_REGS32, "32", "33", "34", "35", "36", "37")
                 : MT_ACC32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  else if constexpr (N == 64)
    asm volatile(MT_WGMMA_RS("m64n64k16", "f16", MT_REGS32, "32", "33", "34", "35", "36", "37")
                 : MT_ACC32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  else if constexpr (kBf16)
    asm volatile(MT_WGMMA_RS("m64n128k16", "bf16", MT_REGS64, "64", "65", "66", "67", "68", "69")
                 : MT_ACC64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  else
    asm volatile(MT_WGMMA_RS("m64n128k16", "f16", MT_REGS64, "64", "65", "66", "67", "68", "69")
                 : MT_ACC64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
// acc = a·bᵀ over d, committed as one group: a is a warpgroup's 64 rows of a K-major tile of
// A_ROWS rows ([D/64][A_ROWS][64], a at the warpgroup's first row), b a K-major tile of N rows
// ([D/64][N][64]). k-step kk reads slab kk / 4, 32 bytes a step along the swizzled row.
template <class T, int N, int D, int A_ROWS>
__device__ __forceinline__ void wg_product_nt(float (&acc)[N / 8][4], const T* a, const T* b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wg_ss<T, N>(acc, wg_desc(a + (kk / 4) * A_ROWS * 64 + (kk % 4) * 16, 16, 1024),
                wg_desc(b + (kk / 4) * N * 64 + (kk % 4) * 16, 16, 1024), /*accumulate=*/kk > 0);
  wg_commit();
}
#undef MT_ACC4
#undef MT_ACC32
#undef MT_ACC64
#undef MT_REGS32
#undef MT_REGS64
#undef MT_WGMMA_SS
#undef MT_WGMMA_RS
#endif

// The forward's shared memory: two buffers of Q's 128 rows (the next item's Q lands while this
// one's last tile runs) and S buffered K/V tiles (+ 1024 for align_1024).
template <int D>
constexpr int wg_forward_stages() { return D == 64 ? 4 : 2; }
template <class T, int D>
constexpr size_t wg_forward_smem() {
  return size_t(2 * 2 * kWgRows + 2 * wg_forward_stages<D>() * kWgKeys) * D * sizeof(T) + 1024;
}
static_assert(wg_forward_smem<__nv_bfloat16, 128>() <= 227 * 1024);

// The persistent forward's counters on each device: the next work item and how many blocks have
// asked past the last one. Zero at load, and zero again after every launch that uses them (its
// last block to ask past the end zeroes both), so a launch on the framework's stream, ordered
// after the one before, needs no memset node to start from zero. (A launch that could start
// before the one before it ends, as programmatic dependent launch allows, would have to wait
// for it before its first atomicAdd.) The kernel's `counters` argument: nullptr for these, else
// a zeroed pair of the launch's own. [[maybe_unused]]: the sm_80 pass compiles no body that
// names them, yet declares them, as every pass and the host side do.
[[maybe_unused]] __device__ int forward_wg_counters[2];

template <class T, int D>
__global__ void __launch_bounds__(384, 1)
    forward_wg(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
               const __grid_constant__ CUtensorMap map_v, int layout_heads, T* __restrict__ o,
               HeadsLayout out, float* __restrict__ lse, int T_len, float scale_log2, int heads,
               int section, int* counters) {
#if defined(MT_ATTENTION_WGMMA_BODY)
  constexpr int BC = kWgKeys, kBM = 2 * kWgRows, S = wg_forward_stages<D>();
  constexpr unsigned kQBytes = kBM * D * sizeof(T), kTileBytes = BC * D * sizeof(T);
  static_assert(S >= 2, "tile kt waits for its buffer before tile kt - 1's is released");
  static_assert(BC == kBM, "only an item's last K/V tile crosses the diagonal");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Item n uses Q buffer n % 2. q_full[q]: its Q landed (s_item[q] names the item);
  // q_empty[q]: the consumers' 8 warps are done with it. k_full[b], v_full[b]: K/V buffer b's
  // K, V tile landed; kv_empty[b]: both consumers are done with buffer b.
  __shared__ uint64_t q_full[2], q_empty[2], k_full[S], v_full[S], kv_empty[S];
  __shared__ int s_item[2];
  unsigned char* smem = align_1024(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem);  // [2][D/64][kBM][64]
  T* sK = sQ + 2 * kBM * D;            // [S][D/64][BC][64]
  T* sV = sK + S * BC * D;             // [S][D/64][BC][64]
  const int q_tiles = int(ceil_div(T_len, kBM)), items = heads * q_tiles;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      mbar_init(&q_full[q]);
      mbar_init(&q_empty[q], 8);
    }
#pragma unroll
    for (int b = 0; b < S; ++b) {
      mbar_init(&k_full[b]);
      mbar_init(&v_full[b]);
      mbar_init(&kv_empty[b], 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copies
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // the producer warpgroup: one thread issues every copy
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0) {
      if (counters == nullptr) counters = forward_wg_counters;
      int fill = 0, item = blockIdx.x;  // fill: K/V tiles issued, into buffer fill % S
      for (int n = 0;; ++n) {
        const int q = n % 2;
        if (n >= 2) mbar_wait(&q_empty[q], (n / 2 - 1) & 1);  // item n − 2 is done with it
        s_item[q] = item;
        if (item >= items) {  // no more work: the consumers stop at this barrier's phase
          mbar_expect_bytes(&q_full[q], 0);
          // This block's last atomicAdd on the item counter (the one that gave this item) comes
          // before its count below; the block that counts last knows every block is done.
          __threadfence();
          if (atomicAdd(&counters[1], 1) == int(gridDim.x) - 1) {
            __threadfence();  // every other block's last atomicAdd before the zeroing
            counters[0] = counters[1] = 0;
          }
          break;
        }
        const wgmma_layout::WorkItem w = wgmma_layout::work_item(item, heads, q_tiles, section);
        const int hl = w.head % layout_heads, bl = w.head / layout_heads, q0 = w.tile * kBM;
        mbar_expect_bytes(&q_full[q], kQBytes);
        tma_tile<D, kBM>(sQ + q * kBM * D, map_q, q0, hl, bl, &q_full[q]);
        item = atomicAdd(&counters[0], 1) + int(gridDim.x);  // the next one, asked for ahead
        const int tiles = int(ceil_div(min(q0 + kBM, T_len), BC));
        for (int kt = 0; kt < tiles; ++kt, ++fill) {
          const int b = fill % S;
          if (fill >= S) mbar_wait(&kv_empty[b], (fill / S - 1) & 1);  // its last use is done
          mbar_expect_bytes(&k_full[b], kTileBytes);
          tma_tile<D, BC>(sK + b * BC * D, map_k, kt * BC, hl, bl, &k_full[b]);
          mbar_expect_bytes(&v_full[b], kTileBytes);
          tma_tile<D, BC>(sV + b * BC * D, map_v, kt * BC, hl, bl, &v_full[b]);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");  // the producer's registers
  const int wg = threadIdx.x / 128 - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  auto release = [&](uint64_t* bar) {     // one arrival a warp, once all its lanes are done
    __syncwarp();
    mbar_arrive_if(bar, lane == 0);
  };
  // Turns: warpgroup w issues its products after bar.sync 1 + w and then lets the other one go
  // (bar.arrive 2 − w), so one multiplies while the other runs its softmax. Warpgroup 1 lets
  // warpgroup 0 go first, and warpgroup 0 takes that arrival back when it leaves.
  if (wg == 1) named_arrive(1);
  int fill = 0;
  for (int n = 0;; ++n) {
    const int q = n % 2;
    mbar_wait(&q_full[q], (n / 2) & 1);
    const int item = s_item[q];
    if (item >= items) break;
    const T* sQw = sQ + q * kBM * D + wg * kWgRows * 64;  // this warpgroup's rows of Q's slab 0
    const wgmma_layout::WorkItem w = wgmma_layout::work_item(item, heads, q_tiles, section);
    const int q0 = w.tile * kBM, w0 = q0 + wg * kWgRows + warp * 16;  // the warp's first row
    const int tiles = int(ceil_div(min(q0 + kBM, T_len), BC));  // up to the item's last row
    float acc[1][D / 8][4];
    zero(acc);
    float m_run[1][2] = {{-kInf, -kInf}}, l[1][2] = {{0.0f, 0.0f}}, corr[1][2];
    uint32_t pa[1][BC / 16][4];  // P of the tile before, the A operand of its P·V
    auto issue_s = [&](float (&s)[1][BC / 8][4], int b) {  // S = Q·Kᵀ from buffer b
      wg_product_nt<T, BC, D, kBM>(s[0], sQw, sK + b * BC * D);
    };
    auto issue_pv = [&](int b) {  // O += P·V from buffer b, 16 keys a k-step
      const T* sVb = sV + b * BC * D;
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk)
        wg_rs<T, D>(acc[0], pa[0][kk], wg_desc(sVb + kk * 16 * 64, BC * 64 * sizeof(T), 1024));
      wg_commit();
    };
    {  // tile 0: its S alone
      float s[1][BC / 8][4];
      mbar_wait(&k_full[fill % S], (fill / S) & 1);
      named_sync(1 + wg);
      wg_fence();
      issue_s(s, fill % S);
      named_arrive(2 - wg);
      wg_wait_all();
      wg_hold(s[0]);
      if (tiles == 1) {  // the diagonal: Q's last product is done
        release(&q_empty[q]);
        mask_tile<1, BC>(s, 0, w0, g, t);
      }
      row_max<1, BC>(s, m_run, l, corr, scale_log2);
      exp_tile<1, BC>(s, m_run, l, scale_log2);
      rescale_rows<1, D>(acc, corr);
      to_a<1, BC, T>(s, pa);
    }
    // Tile kt ≥ 1: its S beside tile kt − 1's P·V, the row maxima and P's exponentials written
    // before the wait for P·V (P·V reads pa and writes acc; P is formed in s). ptxas still puts
    // the wait among the first exponentials, yet this order ran 1% faster than the wait first
    // (docs/perf.md). The diagonal tile (the last) is its own instance, so nothing branches
    // while a product is in flight (the compiler would wait for it at the branch).
    auto step = [&](int kt, auto diagonal) {
      const int cur = (fill + kt) % S, prev = (fill + kt - 1) % S;
      float s[1][BC / 8][4];
      mbar_wait(&k_full[cur], ((fill + kt) / S) & 1);
      mbar_wait(&v_full[prev], ((fill + kt - 1) / S) & 1);
      named_sync(1 + wg);
      wg_fence();
      issue_s(s, cur);
      issue_pv(prev);
      named_arrive(2 - wg);
      wg_wait_one();  // S
      wg_hold(s[0]);
      if constexpr (decltype(diagonal)::value) {
        release(&q_empty[q]);
        mask_tile<1, BC>(s, kt * BC, w0, g, t);
      }
      row_max<1, BC>(s, m_run, l, corr, scale_log2);
      exp_tile<1, BC>(s, m_run, l, scale_log2);
      wg_hold(s[0]);
      wg_wait_all();  // P·V
      wg_hold(acc[0]);
      wg_hold(pa[0]);
      release(&kv_empty[prev]);
      rescale_rows<1, D>(acc, corr);
      to_a<1, BC, T>(s, pa);
    };
    for (int kt = 1; kt < tiles - 1; ++kt) step(kt, std::false_type{});
    if (tiles > 1) step(tiles - 1, std::true_type{});
    {  // the last tile's P·V alone
      const int last = (fill + tiles - 1) % S;
      mbar_wait(&v_full[last], ((fill + tiles - 1) / S) & 1);
      named_sync(1 + wg);
      wg_fence();
      issue_pv(last);
      named_arrive(2 - wg);
      wg_wait_all();
      wg_hold(acc[0]);
      release(&kv_empty[last]);
    }
    fill += tiles;
    finish_rows<1, D, T>(acc, m_run, l, w0, g, t, T_len, w.head, lse, o + head_base(out, w.head),
                         out.row, 1.0f);
  }
  if (wg == 0) named_sync(1);
#else
  __trap();  // no sm_90a code in this image: attention_uses_wgmma should have said no
#endif
}

// With dropout: the walk of one block per Q tile (grid (B·H, T/128 tiles), the last first), 2
// warpgroups a block sharing double-buffered K/V tiles, each running product, softmax, product in
// turn. The draws make the softmax the long part, and the warp-specialized forward above ran
// 11-22% slower than this one with them on an H200 (perf.md), with the same bits.
template <class T, int D>
constexpr size_t wg_dropout_smem() {
  return size_t(2 * kWgRows + 4 * kWgKeys) * D * sizeof(T) + 1024;
}

template <class T, int D>
__global__ void __launch_bounds__(256, 1)
    forward_wg_dropout(const __grid_constant__ CUtensorMap map_q,
                       const __grid_constant__ CUtensorMap map_k,
                       const __grid_constant__ CUtensorMap map_v, int layout_heads,
                       T* __restrict__ o, HeadsLayout out, float* __restrict__ lse, int T_len,
                       float scale_log2, AttentionDropoutArgs dropout) {
#if defined(MT_ATTENTION_WGMMA_BODY)
  constexpr int BC = kWgKeys, kBM = 2 * kWgRows;
  constexpr unsigned kQBytes = kBM * D * sizeof(T), kKvBytes = 2 * BC * D * sizeof(T);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ uint64_t full[2];  // K/V buffer b holds its tile (the first one: Q's too)
  unsigned char* smem = align_1024(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem);  // [D/64][kBM][64]
  T* sK = sQ + kBM * D;                // [2][D/64][BC][64]
  T* sV = sK + 2 * BC * D;             // [2][D/64][BC][64]
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const unsigned head = blockIdx.x;                             // tile_grid: heads in x,
  const int q0 = (int(gridDim.y) - 1 - int(blockIdx.y)) * kBM;  // the longest walk first
  const int w0 = q0 + wg * kWgRows + warp * 16;  // the warp's first row
  const int hl = int(head % unsigned(layout_heads)), bl = int(head / unsigned(layout_heads));
  const int tiles = int(ceil_div(min(q0 + kBM, T_len), BC));  // keys up to the block's last row
  const Drop dr = drop_of<true>(dropout);
  auto load_kv = [&](int kt, int buf) {  // one thread
    tma_tile_pair<D, BC>(sK + buf * BC * D, map_k, hl, bl, sV + buf * BC * D, map_v, hl, bl,
                         kt * BC, &full[buf]);
  };
  init_buffer_barriers(full);
  if (threadIdx.x == 0) {
    mbar_expect_bytes(&full[0], kQBytes + kKvBytes);
    tma_tile<D, kBM>(sQ, map_q, q0, hl, bl, &full[0]);
    load_kv(0, 0);
  }

  float acc[1][D / 8][4];
  zero(acc);
  float m_run[1][2] = {{-kInf, -kInf}}, l[1][2] = {{0.0f, 0.0f}};  // rows w0 + g + 8h
  for (int kt = 0; kt < tiles; ++kt) {
    const int buf = kt & 1;
    __syncthreads();  // both warpgroups are done with the buffer refilled next (tile kt − 1's)
    if (threadIdx.x == 0 && kt + 1 < tiles) {
      mbar_expect_bytes(&full[buf ^ 1], kKvBytes);
      load_kv(kt + 1, buf ^ 1);
    }
    mbar_wait(&full[buf], (kt >> 1) & 1);  // tile kt landed: the buffer's (kt / 2)-th fill

    float s[1][BC / 8][4];  // raw q·k
    wg_fence();
    wg_product_nt<T, BC, D, kBM>(s[0], sQ + wg * kWgRows * 64, sK + buf * BC * D);
    wg_wait_all();
    wg_hold(s[0]);
    online_softmax<1, BC, D>(s, acc, m_run, l, kt * BC, w0, g, t, scale_log2);
    drop_tile<1, BC>(s, dr, head, kt * BC, w0, g, t, T_len);
    uint32_t pa[1][BC / 16][4];
    to_a<1, BC, T>(s, pa);
    const T* sVb = sV + buf * BC * D;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk)  // 16 keys = 2 groups of 8 swizzled rows a k-step
      wg_rs<T, D>(acc[0], pa[0][kk], wg_desc(sVb + kk * 16 * 64, BC * 64 * sizeof(T), 1024));
    wg_commit();
    wg_wait_all();
    wg_hold(acc[0]);
  }
  finish_rows<1, D, T>(acc, m_run, l, w0, g, t, T_len, head, lse, o + head_base(out, head),
                       out.row, dr.scale);
#else
  __trap();  // no sm_90a code in this image: attention_uses_wgmma should have said no
#endif
}

// ---- backward on Hopper: the dK/dV and dQ passes with warpgroup products (sm_90a) -------------
// The walks of dkdv_tc and dq_tc (deterministic, no dropout) with every product a wgmma, in the
// layout of forward_wg: the two products of a tile from shared memory (Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ;
// S = Q·Kᵀ and dP = dO·Vᵀ), issued as two groups so the exponentials of P run while dP's product
// does, then the two (one) whose A is a re-packed accumulator tile in registers and whose B is a
// tile read MN-major (dV += Pᵀ·dO, dK += dSᵀ·Q; dQ += dS·K). A warpgroup owns 64 keys (dK/dV)
// or 64 query rows (dQ). The products add the same terms in the same order as the mma.sync
// kernels', so dQ, dK and dV have the same bits.
//   dK/dV  grid (B·H, T/64·G K tiles), G warpgroups a block; Q tiles of R rows (G = 1, R = 128
//          at d = 64: 254 registers, 2 blocks an SM; G = 2, R = 64 at d = 128).
//   dQ     grid (B·H, T/64·G Q tiles), the last first in each section of heads; K/V tiles of 64
//          keys (G = 1 at d = 64: 122 registers; G = 2 at d = 128).
// Both take their blocks in the forward's order (wgmma_layout.h's work_item), in sections of
// the heads whose blocks number at most the SMs (backward_section_heads).
template <int D>
constexpr int wg_dkdv_rows() { return D == 64 ? 128 : 64; }
template <int D>
constexpr int wg_bwd_groups() { return D == 64 ? 1 : 2; }
constexpr int kWgDqKeys = 64;
template <class T, int D>
constexpr size_t wg_dkdv_smem() {
  constexpr int kKeys = kWgRows * wg_bwd_groups<D>(), R = wg_dkdv_rows<D>();
  return size_t(2 * kKeys + 4 * R) * D * sizeof(T) + size_t(4 * R) * sizeof(float) + 1024;
}
template <class T, int D>
constexpr size_t wg_dq_smem() {
  return size_t(2 * kWgRows * wg_bwd_groups<D>() + 4 * kWgDqKeys) * D * sizeof(T) + 1024;
}
static_assert(wg_dkdv_smem<__nv_bfloat16, 128>() <= 227 * 1024);
static_assert(wg_dq_smem<__nv_bfloat16, 128>() <= 227 * 1024);

template <class T, int D>
__global__ void __launch_bounds__(128 * wg_bwd_groups<D>())
    dkdv_wg(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
            const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
            HeadsLayout in, int out_heads, const float* __restrict__ lse,
            const float* __restrict__ Dvec, T* __restrict__ dk, T* __restrict__ dv, int T_len,
            float scale, float scale_log2, int section) {
#if defined(MT_ATTENTION_WGMMA_BODY)
  constexpr int BR = wg_dkdv_rows<D>(), kBK = kWgRows * wg_bwd_groups<D>();
  constexpr int kBlock = 128 * wg_bwd_groups<D>();
  constexpr unsigned kKvBytes = 2 * kBK * D * sizeof(T), kQBytes = 2 * BR * D * sizeof(T);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ uint64_t full[2];  // Q/dO buffer b holds its tile (the first one: K's and V's too)
  unsigned char* smem = align_1024(smem_raw);
  T* sK = reinterpret_cast<T*>(smem);  // [D/64][kBK][64]
  T* sV = sK + kBK * D;                // [D/64][kBK][64]
  T* sQ = sV + kBK * D;                // [2][D/64][BR][64]
  T* sdO = sQ + 2 * BR * D;            // [2][D/64][BR][64]
  float* sL = reinterpret_cast<float*>(sdO + 2 * BR * D);  // [2][BR], log2 units
  float* sD = sL + 2 * BR;                                  // [2][BR]
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // The block's (head, key tile): the blocks in the order of the forward's work items, in
  // sections of heads and the longest walk (keys 0..) first in each.
  const wgmma_layout::WorkItem w = wgmma_layout::work_item(
      int(blockIdx.x + blockIdx.y * gridDim.x), int(gridDim.x), int(gridDim.y), section);
  const unsigned head = unsigned(w.head);
  const int k0 = (int(gridDim.y) - 1 - w.tile) * kBK, kw0 = k0 + wg * kWgRows;  // block's, group's
  const int64_t base = head_base(in, head);
  const int hi = int(head % unsigned(in.heads)), bi = int(head / unsigned(in.heads));
  const int ho = int(head % unsigned(out_heads)), bo = int(head / unsigned(out_heads));
  const float* lse_h = lse + int64_t(head) * T_len;
  const float* D_h = Dvec + int64_t(head) * T_len;
  const int first = k0 / BR, tiles = int(ceil_div(T_len, BR));
  auto load_q_tile = [&](int qi, int buf) {  // Q and dO: one thread
    tma_tile_pair<D, BR>(sQ + buf * BR * D, map_q, hi, bi, sdO + buf * BR * D, map_do, ho, bo,
                         qi * BR, &full[buf]);
  };
  // Query row i's L (log2 units) and D from global memory, 0 past T.
  auto read_l_d = [&](int i, float& l_i, float& d_i) {
    l_i = i < T_len ? lse_h[i] * kLog2e : 0.0f;
    d_i = i < T_len ? D_h[i] : 0.0f;
  };
  // Tile qi's L and D into buffer buf, a row a thread, for the first tile and after a skipped
  // one (a computed tile reads the next tile's into registers under its products and stores them
  // after dS, below). The next iteration's __syncthreads makes them visible.
  auto load_l_d = [&](int qi, int buf) {
    for (int r = threadIdx.x; r < BR; r += kBlock)
      read_l_d(qi * BR + r, sL[buf * BR + r], sD[buf * BR + r]);
  };
  init_buffer_barriers(full);
  if (threadIdx.x == 0) {
    mbar_expect_bytes(&full[0], kKvBytes + kQBytes);
    tma_tile_pair<D, kBK>(sK, map_k, hi, bi, sV, map_v, hi, bi, k0, &full[0]);
    load_q_tile(first, 0);
  }
  load_l_d(first, 0);

  float dk_acc[1][D / 8][4], dv_acc[1][D / 8][4];
  zero(dk_acc);
  zero(dv_acc);
  const int j_base = kw0 + warp * 16 + g;  // this thread's keys: j_base and j_base + 8
  for (int qi = first; qi < tiles; ++qi) {
    const int buf = (qi - first) & 1;
    // The buffer refilled next (tile qi − 1's) is done with, and L and D of tile qi are written.
    __syncthreads();
    const bool next = qi + 1 < tiles;
    if (threadIdx.x == 0 && next) {
      mbar_expect_bytes(&full[buf ^ 1], kQBytes);
      load_q_tile(qi + 1, buf ^ 1);
    }
    mbar_wait(&full[buf], ((qi - first) >> 1) & 1);  // Q and dO of tile qi landed
    const int i0 = qi * BR;
    if (i0 + BR - 1 < kw0) {  // every query of the tile comes before every key
      if (next) load_l_d(qi + 1, buf ^ 1);
      continue;
    }
    const T* Q = sQ + buf * BR * D;
    const T* dO = sdO + buf * BR * D;
    const float* L = sL + buf * BR;
    const float* Dr = sD + buf * BR;

    // Sᵀ and dPᵀ (this warp's 16 keys × BR queries) as two groups: P's exponentials run while
    // dPᵀ's product does. The next tile's L and D are read into registers under both and stored
    // to shared memory after dS (a store could not pass the wait, and would hold the thread on
    // its global read before the exponentials).
    float s[1][BR / 8][4], dp[1][BR / 8][4];
    wg_fence();
    wg_product_nt<T, BR, D, kBK>(s[0], sK + wg * kWgRows * 64, Q);
    wg_product_nt<T, BR, D, kBK>(dp[0], sV + wg * kWgRows * 64, dO);
    static_assert(BR <= kBlock, "a row a thread at most");
    float l_next = 0.0f, d_next = 0.0f;
    if (next && threadIdx.x < BR) read_l_d((qi + 1) * BR + int(threadIdx.x), l_next, d_next);
    const bool edge = i0 < kw0 + kWgRows || i0 + BR > T_len;  // the mask or T cut this tile
    wg_wait_one();  // Sᵀ
    wg_hold(s[0]);
    key_tile_p<BR>(s, L, i0, j_base, t, edge, T_len, scale_log2);
    wg_wait_all();  // dPᵀ
    wg_hold(dp[0]);
    key_tile_ds<BR>(s, dp, Dr, t);
    if (next && threadIdx.x < BR) {  // tile qi − 1's L and D were read before this iteration
      sL[(buf ^ 1) * BR + threadIdx.x] = l_next;
      sD[(buf ^ 1) * BR + threadIdx.x] = d_next;
    }
    uint32_t pa[1][BR / 16][4], dsa[1][BR / 16][4];
    to_a<1, BR, T>(s, pa);
    to_a<1, BR, T>(dp, dsa);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk)  // dV += Pᵀ · dO, 16 queries a k-step
      wg_rs<T, D>(dv_acc[0], pa[0][kk], wg_desc(dO + kk * 16 * 64, BR * 64 * sizeof(T), 1024));
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk)  // dK += dSᵀ · Q
      wg_rs<T, D>(dk_acc[0], dsa[0][kk], wg_desc(Q + kk * 16 * 64, BR * 64 * sizeof(T), 1024));
    wg_commit();
    wg_wait_all();
    wg_hold(dv_acc[0]);
    wg_hold(dk_acc[0]);
  }
  store_rows<1, D, T>(dk + base, in.row, dk_acc, kw0 + warp * 16, T_len, scale);
  store_rows<1, D, T>(dv + base, in.row, dv_acc, kw0 + warp * 16, T_len, 1.0f);
#else
  __trap();  // no sm_90a code in this image: attention_uses_wgmma should have said no
#endif
}

template <class T, int D>
__global__ void __launch_bounds__(128 * wg_bwd_groups<D>())
    dq_wg(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
          const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
          HeadsLayout in, int out_heads, const float* __restrict__ lse,
          const float* __restrict__ Dvec, T* __restrict__ dq, int T_len, float scale,
          float scale_log2, int section) {
#if defined(MT_ATTENTION_WGMMA_BODY)
  constexpr int BC = kWgDqKeys, kBM = kWgRows * wg_bwd_groups<D>();
  constexpr unsigned kQBytes = 2 * kBM * D * sizeof(T), kKvBytes = 2 * BC * D * sizeof(T);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ uint64_t full[2];  // K/V buffer b holds its tile (the first one: Q's and dO's too)
  unsigned char* smem = align_1024(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem);  // [D/64][kBM][64]
  T* sdO = sQ + kBM * D;               // [D/64][kBM][64]
  T* sK = sdO + kBM * D;               // [2][D/64][BC][64]
  T* sV = sK + 2 * BC * D;             // [2][D/64][BC][64]
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // The block's (head, Q tile): the blocks in the order of the forward's work items.
  const wgmma_layout::WorkItem w = wgmma_layout::work_item(
      int(blockIdx.x + blockIdx.y * gridDim.x), int(gridDim.x), int(gridDim.y), section);
  const unsigned head = unsigned(w.head);
  const int q0 = w.tile * kBM;
  const int r0 = q0 + wg * kWgRows, w0 = r0 + warp * 16;
  const int64_t base = head_base(in, head);
  const int hi = int(head % unsigned(in.heads)), bi = int(head / unsigned(in.heads));
  const int ho = int(head % unsigned(out_heads)), bo = int(head / unsigned(out_heads));
  float L[1][2], Dr[1][2];  // rows w0 + g + 8h
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = w0 + g + 8 * h;
    L[0][h] = i < T_len ? lse[int64_t(head) * T_len + i] * kLog2e : 0.0f;
    Dr[0][h] = i < T_len ? Dvec[int64_t(head) * T_len + i] : 0.0f;
  }
  const int tiles = int(ceil_div(min(q0 + kBM, T_len), BC));  // keys up to the last row
  auto load_kv = [&](int kt, int buf) {  // one thread
    tma_tile_pair<D, BC>(sK + buf * BC * D, map_k, hi, bi, sV + buf * BC * D, map_v, hi, bi,
                         kt * BC, &full[buf]);
  };
  init_buffer_barriers(full);
  if (threadIdx.x == 0) {
    mbar_expect_bytes(&full[0], kQBytes + kKvBytes);
    tma_tile_pair<D, kBM>(sQ, map_q, hi, bi, sdO, map_do, ho, bo, q0, &full[0]);
    load_kv(0, 0);
  }

  float dq_acc[1][D / 8][4];
  zero(dq_acc);
  for (int kt = 0; kt < tiles; ++kt) {
    const int buf = kt & 1;
    __syncthreads();  // the buffer refilled next (tile kt − 1's) is done with
    if (threadIdx.x == 0 && kt + 1 < tiles) {
      mbar_expect_bytes(&full[buf ^ 1], kKvBytes);
      load_kv(kt + 1, buf ^ 1);
    }
    mbar_wait(&full[buf], (kt >> 1) & 1);  // tile kt landed
    const int j0 = kt * BC;
    if (j0 > r0 + kWgRows - 1) continue;  // every key of the tile comes after every row
    const T* K = sK + buf * BC * D;
    const T* V = sV + buf * BC * D;
    // S and dP (this warp's 16 rows × BC keys) as two groups: P's exponentials run while dP's
    // product does.
    float s[1][BC / 8][4], dp[1][BC / 8][4];
    wg_fence();
    wg_product_nt<T, BC, D, kBM>(s[0], sQ + wg * kWgRows * 64, K);
    wg_product_nt<T, BC, D, kBM>(dp[0], sdO + wg * kWgRows * 64, V);
    wg_wait_one();  // S
    wg_hold(s[0]);
    row_tile_p<1, BC>(s, L, j0, w0, g, t, scale_log2);
    wg_wait_all();  // dP
    wg_hold(dp[0]);
    row_tile_ds<1, BC>(s, dp, Dr);
    uint32_t dsa[1][BC / 16][4];
    to_a<1, BC, T>(dp, dsa);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk)  // dQ += dS · K, 16 keys a k-step
      wg_rs<T, D>(dq_acc[0], dsa[0][kk], wg_desc(K + kk * 16 * 64, BC * 64 * sizeof(T), 1024));
    wg_commit();
    wg_wait_all();
    wg_hold(dq_acc[0]);
  }
  store_rows<1, D, T>(dq + base, in.row, dq_acc, w0, T_len, scale);
#else
  __trap();  // no sm_90a code in this image: attention_uses_wgmma should have said no
#endif
}

// ---- backward, pass 1: D = rowsum(dO ∘ O) ------------------------------------------------------
// A row is d elements of dO and of O (128 bytes each at d = 64, bf16): too short for a warp. Eight
// lanes share a row, each summing V consecutive elements (one 16-byte pack) at a time, lane l
// taking elements [V·l, V·l + V), then [V·l + 8V, ...); the eight partial sums meet in a fixed
// shuffle tree. kVec loads each chunk as one pack; without it (d not a multiple of V, or heads
// not 16-byte aligned) the same chunks are loaded element by element, so both give the same bits.

constexpr int kRowLanes = 8;

template <class T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    rowdot_kernel(const T* __restrict__ dout, const T* __restrict__ o, HeadsLayout out,
                  float* __restrict__ D_out, int64_t rows, int T_len, int d) {
  constexpr int V = 16 / sizeof(T);
  const int64_t row = int64_t(blockIdx.x) * (kThreads / kRowLanes) + threadIdx.x / kRowLanes;
  const int lane = threadIdx.x % kRowLanes;
  float sum = 0.0f;
  if (row < rows) {  // no early return: every lane of the warp takes part in the shuffles
    const int64_t at = head_base(out, int(row / T_len)) + (row % T_len) * out.row;
    for (int c = V * lane; c < d; c += V * kRowLanes) {
      Pack<T, V> a, b;
      if constexpr (kVec) {
        a = *reinterpret_cast<const Pack<T, V>*>(dout + at + c);
        b = *reinterpret_cast<const Pack<T, V>*>(o + at + c);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) {
          a.v[i] = c + i < d ? dout[at + c + i] : from_float<T>(0.0f);
          b.v[i] = c + i < d ? o[at + c + i] : from_float<T>(0.0f);
        }
      }
#pragma unroll
      for (int i = 0; i < V; ++i) sum += to_float(a.v[i]) * to_float(b.v[i]);
    }
  }
#pragma unroll
  for (int off = 1; off < kRowLanes; off *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (row < rows && lane == 0) D_out[row] = sum;
}

// ---- tensor-core backward, pass 2: dK, dV (and the atomic dQ) ---------------------------------
// On sm_90 at d = 64 the deterministic pass asks for three blocks an SM (the launch bounds'
// second argument; on an sm_90a build this kernel now runs there only with dropout, dkdv_wg
// without): ptxas then fits it in 168 registers with a 40-byte stack frame of spills (48
// with dropout), where on its own it takes 184 registers (236 with dropout) and two blocks fit.
// The latency-bound kernel gains more from the third block's warps than the spills cost: 0.240
// against 0.268 ms at [16, 12, 1024, 64] on an H200 (bf16; 0.932 against 0.968 with dropout
// 0.1). 0 leaves the choice to ptxas: for the other head dimensions (not measured this way) and
// on other architectures (an A100's 164 KiB of shared memory holds only two of these 55 KiB
// blocks, so the spills would buy nothing there).
template <int D, bool kAtomicDq>
constexpr int dkdv_min_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return D == 64 && !kAtomicDq ? 3 : 0;
#else
  return 0;
#endif
}

template <class T, int D, int BR, bool kAtomicDq, bool kDrop>
__global__ void __launch_bounds__(kThreads, dkdv_min_blocks<D, kAtomicDq>())
    dkdv_tc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
            HeadsLayout in, const T* __restrict__ dout, HeadsLayout out,
            const float* __restrict__ lse, const float* __restrict__ Dvec, T* __restrict__ dk,
            T* __restrict__ dv, float* __restrict__ dq_acc, int T_len, float scale,
            float scale_log2, AttentionDropoutArgs dropout) {
  constexpr int kS = D + kPad, kSS = BR + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kTile * kS;
  T* sQ = sV + kTile * kS;    // [2][BR][kS]
  T* sdO = sQ + 2 * BR * kS;  // [2][BR][kS]
  float* sL = reinterpret_cast<float*>(sdO + 2 * BR * kS);  // [2][BR], log2 units
  float* sD = sL + 2 * BR;                                  // [2][BR]
  T* sdS = reinterpret_cast<T*>(sD + 2 * BR);               // [kTile][kSS], atomic dQ only
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned head = blockIdx.x;  // tile_grid: heads in x, the longest walk (keys 0..) first
  const int k0 = int(blockIdx.y) * kTile;
  const int64_t base = head_base(in, head), base_out = head_base(out, head);
  const float* lse_h = lse + int64_t(head) * T_len;
  const float* D_h = Dvec + int64_t(head) * T_len;
  const int first = k0 / BR, tiles = int(ceil_div(T_len, BR));
  [[maybe_unused]] const Drop dr = drop_of<kDrop>(dropout);

  auto load_q_tile = [&](int qi, int buf) {
    load_tile<T, D, BR, kThreads>(sQ + buf * BR * kS, q + base, in.row, qi * BR, T_len);
    load_tile<T, D, BR, kThreads>(sdO + buf * BR * kS, dout + base_out, out.row, qi * BR, T_len);
    if (threadIdx.x < BR) {
      const int i = qi * BR + threadIdx.x;
      sL[buf * BR + threadIdx.x] = i < T_len ? lse_h[i] * kLog2e : 0.0f;
      sD[buf * BR + threadIdx.x] = i < T_len ? D_h[i] : 0.0f;
    }
  };
  load_tile<T, D, kTile, kThreads>(sK, k + base, in.row, k0, T_len);
  load_tile<T, D, kTile, kThreads>(sV, v + base, in.row, k0, T_len);
  load_q_tile(first, 0);
  cp_async_commit();

  float dk_acc[1][D / 8][4], dv_acc[1][D / 8][4];
  zero(dk_acc);
  zero(dv_acc);
  const int j_base = k0 + warp * 16 + g;  // this thread's keys: j_base and j_base + 8
  for (int qi = first; qi < tiles; ++qi) {
    cp_async_wait_all();
    __syncthreads();
    const int buf = (qi - first) & 1;
    if (qi + 1 < tiles) load_q_tile(qi + 1, buf ^ 1);
    cp_async_commit();
    const T* Q = sQ + buf * BR * kS;
    const T* dO = sdO + buf * BR * kS;
    const float* L = sL + buf * BR;
    const float* Dr = sD + buf * BR;

    float s[1][BR / 8][4], dp[1][BR / 8][4];  // Sᵀ and dPᵀ: this warp's 16 keys × BR queries
    zero(s);
    zero(dp);
    mma_smem_nt<1, BR, D>(s, sK + warp * 16 * kS, Q, kS);
    mma_smem_nt<1, BR, D>(dp, sV + warp * 16 * kS, dO, kS);
    const int i0 = qi * BR;
    const bool edge = i0 < k0 + kTile || i0 + BR > T_len;  // the causal mask or T cut this tile
    key_tile_grads<BR, kDrop>(s, dp, L, Dr, i0, j_base, t, edge, T_len, scale_log2, dr, head);
    uint32_t pa[1][BR / 16][4], dsa[1][BR / 16][4];
    to_a<1, BR, T>(s, pa);
    to_a<1, BR, T>(dp, dsa);
    mma_reg<true, 1, D, BR>(dv_acc, pa, dO, kS);  // dV += Pᵀ · dO
    mma_reg<true, 1, D, BR>(dk_acc, dsa, Q, kS);  // dK += dSᵀ · Q

    if constexpr (kAtomicDq) {
      // dSᵀ (as rounded for the product above) to shared memory, then dQ_tile = dS · K.
#pragma unroll
      for (int n = 0; n < BR / 8; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g + 8 * h) * kSS + n * 8 + 2 * t) =
              dsa[0][n / 2][(n % 2) * 2 + h];
      __syncthreads();
      constexpr int kRowGroups = BR / 16, kSplit = kWarps / kRowGroups, kW = D / kSplit;
      const int r0 = (warp % kRowGroups) * 16, c0 = (warp / kRowGroups) * kW;
      float dq_part[kW / 8][4];
#pragma unroll
      for (int n = 0; n < kW / 8; ++n) dq_part[n][0] = dq_part[n][1] = dq_part[n][2] = dq_part[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t a[4];  // dS rows r0.. (queries) × keys kk·16.., from dSᵀ stored [key][query]
        ldmatrix_x4_trans(a, sdS + (kk * 16 + lane % 8 + (lane / 16) * 8) * kSS + r0 +
                                 ((lane / 8) % 2) * 8);
#pragma unroll
        for (int nn = 0; nn < kW / 16; ++nn) {
          uint32_t b[4];
          load_b_nn(b, sK, kS, c0 + nn * 16, kk * 16);
          mma<T>(dq_part[2 * nn], a, b[0], b[1]);
          mma<T>(dq_part[2 * nn + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = i0 + r0 + g + 8 * h;
        if (i >= T_len) continue;
        float* dst = dq_acc + (int64_t(head) * T_len + i) * D + c0 + 2 * t;  // contiguous
#pragma unroll
        for (int n = 0; n < kW / 8; ++n) {
          atomicAdd(dst + n * 8, dq_part[n][2 * h] * scale);
          atomicAdd(dst + n * 8 + 1, dq_part[n][2 * h + 1] * scale);
        }
      }
    }
  }
  store_rows<1, D, T>(dk + base, in.row, dk_acc, k0 + warp * 16, T_len, scale);
  store_rows<1, D, T>(dv + base, in.row, dv_acc, k0 + warp * 16, T_len, kDrop ? dr.scale : 1.0f);
}

// ---- tensor-core backward, pass 3: dQ without atomics -------------------------------------------
// Block: kWarps warps of 16·MT query rows each (kBM rows); K/V tiles of BC keys.

template <class T, int D, int MT, int BC, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    dq_tc(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
          HeadsLayout in, const T* __restrict__ dout, HeadsLayout out,
          const float* __restrict__ lse, const float* __restrict__ Dvec, T* __restrict__ dq,
          int T_len, float scale, float scale_log2, AttentionDropoutArgs dropout) {
  constexpr int kS = D + kPad, kBM = kWarps * 16 * MT;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kBM * kS;
  T* sK = sdO + kBM * kS;     // [2][BC][kS]
  T* sV = sK + 2 * BC * kS;   // [2][BC][kS]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned head = blockIdx.x;                             // tile_grid: heads in x,
  const int q0 = (int(gridDim.y) - 1 - int(blockIdx.y)) * kBM;  // the longest walk first
  const int w0 = q0 + warp * 16 * MT;
  const int64_t base = head_base(in, head);
  float L[MT][2], Dr[MT][2];  // per row 16m + g + 8h
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = w0 + 16 * m + g + 8 * h;
      L[m][h] = i < T_len ? lse[int64_t(head) * T_len + i] * kLog2e : 0.0f;
      Dr[m][h] = i < T_len ? Dvec[int64_t(head) * T_len + i] : 0.0f;
    }
  const int tiles = int(ceil_div(min(q0 + kBM, T_len), BC));  // keys up to the last row
  [[maybe_unused]] const Drop dr = drop_of<kDrop>(dropout);
  load_tile<T, D, kBM, kThreads>(sQ, q + base, in.row, q0, T_len);
  load_tile<T, D, kBM, kThreads>(sdO, dout + head_base(out, head), out.row, q0, T_len);
  load_tile<T, D, BC, kThreads>(sK, k + base, in.row, 0, T_len);
  load_tile<T, D, BC, kThreads>(sV, v + base, in.row, 0, T_len);
  cp_async_commit();

  float dq_acc[MT][D / 8][4];
  zero(dq_acc);
  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait_all();
    __syncthreads();
    const int buf = kt & 1;
    if (kt + 1 < tiles) {
      load_tile<T, D, BC, kThreads>(sK + (buf ^ 1) * BC * kS, k + base, in.row, (kt + 1) * BC,
                                    T_len);
      load_tile<T, D, BC, kThreads>(sV + (buf ^ 1) * BC * kS, v + base, in.row, (kt + 1) * BC,
                                    T_len);
    }
    cp_async_commit();
    const T* K = sK + buf * BC * kS;
    float s[MT][BC / 8][4], dp[MT][BC / 8][4];  // S and dP: this warp's rows × BC keys
    zero(s);
    zero(dp);
    mma_smem_nt<MT, BC, D>(s, sQ + warp * 16 * MT * kS, K, kS);
    mma_smem_nt<MT, BC, D>(dp, sdO + warp * 16 * MT * kS, sV + buf * BC * kS, kS);
    const int j0 = kt * BC;
    row_tile_grads<MT, BC, kDrop>(s, dp, L, Dr, j0, w0, g, t, T_len, scale_log2, dr, head);
    uint32_t dsa[MT][BC / 16][4];
    to_a<MT, BC, T>(dp, dsa);
    mma_reg<true, MT, D, BC>(dq_acc, dsa, K, kS);  // dQ += dS · K
  }
  store_rows<MT, D, T>(dq + base, in.row, dq_acc, w0, T_len, scale);
}

// dq = dq_acc (contiguous [B·H, T, d]) rounded to T, into dq's layout (the atomic variant's last
// pass).
template <class T>
__global__ void round_kernel(const float* __restrict__ acc, T* __restrict__ dq, HeadsLayout in,
                             int T_len, int d, int64_t n) {
  const int64_t per_head = int64_t(T_len) * d;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e % per_head;
    dq[head_base(in, int(e / per_head)) + (r / d) * in.row + r % d] = from_float<T>(acc[e]);
  }
}

// ---- CUDA-core path ---------------------------------------------------------------------------
// Lane ℓ owns columns ℓ, ℓ + 32, ... (U of them, d ≤ 32·U); the warp's own row sits in shared
// memory in fp32, and each lane scores one key (query) of a group of 32 against it.

template <class T, int U, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    forward_simple(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   HeadsLayout in, T* __restrict__ o, HeadsLayout out, float* __restrict__ lse,
                   int T_len, int d, float scale, AttentionDropoutArgs dropout) {
  __shared__ float sq[kWarps][32 * U];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = int(blockIdx.x) * kWarps + warp;
  if (i >= T_len) return;
  const int64_t base = head_base(in, int(blockIdx.y));
  [[maybe_unused]] const Drop dr = drop_of<kDrop>(dropout);
  for (int c = lane; c < d; c += 32) sq[warp][c] = to_float(q[base + i * in.row + c]) * scale;
  __syncwarp();
  float m = -kInf, l = 0.0f, acc[U] = {};
  for (int j0 = 0; j0 <= i; j0 += 32) {
    const int j = j0 + lane;
    float x = -kInf;
    if (j <= i) {
      const T* kr = k + base + j * in.row;
      float dot = 0.0f;
      for (int c = 0; c < d; ++c) dot += sq[warp][c] * to_float(kr[c]);
      x = dot;
    }
    float mx = x;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float m_new = fmaxf(m, mx);  // finite: key j0 ≤ i is always scored
    const float corr = expf(m - m_new);
    const float p = j <= i ? expf(x - m_new) : 0.0f;
    l = l * corr + warp_sum(p);
    float pz = p;  // P·Z into the sum, Z's 1/(1 − p) at the end
    if constexpr (kDrop)
      if (j <= i && !kept(dr, p_row(int(blockIdx.y), i, T_len) + uint64_t(j))) pz = 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u) acc[u] *= corr;
    const int n = min(32, i - j0 + 1);
    for (int jj = 0; jj < n; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, pz, jj);
      const T* vr = v + base + (j0 + jj) * in.row;
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (lane + 32 * u < d) acc[u] += pj * to_float(vr[lane + 32 * u]);
    }
    m = m_new;
  }
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (lane + 32 * u < d)
      o[head_base(out, int(blockIdx.y)) + i * out.row + lane + 32 * u] =
          from_float<T>(kDrop ? acc[u] / l * dr.scale : acc[u] / l);
  if (lane == 0) lse[int64_t(blockIdx.y) * T_len + i] = m + logf(l);
}

// dQ_i for the warp's row i: keys j ≤ i scored by lane.
template <class T, int U, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    dq_simple(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
              HeadsLayout in, const T* __restrict__ dout, HeadsLayout out,
              const float* __restrict__ lse, const float* __restrict__ Dvec, T* __restrict__ dq,
              int T_len, int d, float scale, AttentionDropoutArgs dropout) {
  __shared__ float sq[kWarps][32 * U], sg[kWarps][32 * U];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = int(blockIdx.x) * kWarps + warp;
  if (i >= T_len) return;
  const int64_t base = head_base(in, int(blockIdx.y)), row = int64_t(blockIdx.y) * T_len + i;
  const int64_t g_at = head_base(out, int(blockIdx.y)) + i * out.row;
  [[maybe_unused]] const Drop dr = drop_of<kDrop>(dropout);
  for (int c = lane; c < d; c += 32) {
    sq[warp][c] = to_float(q[base + i * in.row + c]);
    sg[warp][c] = to_float(dout[g_at + c]);
  }
  __syncwarp();
  const float L = lse[row], Di = Dvec[row];
  float acc[U] = {};
  for (int j0 = 0; j0 <= i; j0 += 32) {
    const int j = j0 + lane;
    float ds = 0.0f;
    if (j <= i) {
      const T* kr = k + base + j * in.row;
      const T* vr = v + base + j * in.row;
      float s = 0.0f, dp = 0.0f;
      for (int c = 0; c < d; ++c) {
        s += sq[warp][c] * to_float(kr[c]);
        dp += sg[warp][c] * to_float(vr[c]);
      }
      const float p = expf(s * scale - L);
      if constexpr (kDrop)  // dP = Z ∘ (dO·vᵀ)
        dp = kept(dr, p_row(int(blockIdx.y), i, T_len) + uint64_t(j)) ? dp * dr.scale : 0.0f;
      ds = p * (dp - Di);
    }
    const int n = min(32, i - j0 + 1);
    for (int jj = 0; jj < n; ++jj) {
      const float dsj = __shfl_sync(0xffffffffu, ds, jj);
      const T* kr = k + base + (j0 + jj) * in.row;
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (lane + 32 * u < d) acc[u] += dsj * to_float(kr[lane + 32 * u]);
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (lane + 32 * u < d) dq[base + i * in.row + lane + 32 * u] = from_float<T>(acc[u] * scale);
}

// dK_j, dV_j for the warp's key j: queries i ≥ j scored by lane.
template <class T, int U, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    dkdv_simple(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                HeadsLayout in, const T* __restrict__ dout, HeadsLayout out,
                const float* __restrict__ lse, const float* __restrict__ Dvec, T* __restrict__ dk,
                T* __restrict__ dv, int T_len, int d, float scale, AttentionDropoutArgs dropout) {
  __shared__ float sk[kWarps][32 * U], sv[kWarps][32 * U];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j = int(blockIdx.x) * kWarps + warp;
  if (j >= T_len) return;
  const int64_t base = head_base(in, int(blockIdx.y)), rows = int64_t(blockIdx.y) * T_len;
  const int64_t base_out = head_base(out, int(blockIdx.y));
  [[maybe_unused]] const Drop dr = drop_of<kDrop>(dropout);
  for (int c = lane; c < d; c += 32) {
    sk[warp][c] = to_float(k[base + j * in.row + c]);
    sv[warp][c] = to_float(v[base + j * in.row + c]);
  }
  __syncwarp();
  float dk_acc[U] = {}, dv_acc[U] = {};
  for (int i0 = j; i0 < T_len; i0 += 32) {
    const int i = i0 + lane;
    float p = 0.0f, ds = 0.0f;  // p: P·Z for dV (Z's 1/(1 − p) at the store)
    if (i < T_len) {
      const T* qr = q + base + i * in.row;
      const T* gr = dout + base_out + i * out.row;
      float s = 0.0f, dp = 0.0f;
      for (int c = 0; c < d; ++c) {
        s += to_float(qr[c]) * sk[warp][c];
        dp += to_float(gr[c]) * sv[warp][c];
      }
      p = expf(s * scale - lse[rows + i]);
      if constexpr (kDrop) {
        const bool keep = kept(dr, p_row(int(blockIdx.y), i, T_len) + uint64_t(j));
        ds = p * ((keep ? dp * dr.scale : 0.0f) - Dvec[rows + i]);  // dP = Z ∘ (dO·vᵀ)
        p = keep ? p : 0.0f;
      } else {
        ds = p * (dp - Dvec[rows + i]);
      }
    }
    const int n = min(32, T_len - i0);
    for (int ii = 0; ii < n; ++ii) {
      const float pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
      const T* qr = q + base + (i0 + ii) * in.row;
      const T* gr = dout + base_out + (i0 + ii) * out.row;
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (lane + 32 * u < d) {
          dv_acc[u] += pi * to_float(gr[lane + 32 * u]);
          dk_acc[u] += dsi * to_float(qr[lane + 32 * u]);
        }
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (lane + 32 * u < d) {
      dk[base + j * in.row + lane + 32 * u] = from_float<T>(dk_acc[u] * scale);
      dv[base + j * in.row + lane + 32 * u] =
          from_float<T>(kDrop ? dv_acc[u] * dr.scale : dv_acc[u]);
    }
}

// ---- launchers ------------------------------------------------------------------------------

// Raises a kernel's dynamic shared-memory limit when it needs more than the default 48 KiB.
template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(bytes)));
}

template <class F>
void with_head_dim(int64_t d, F&& f) {
  if (d == 32) return f(std::integral_constant<int, 32>{});
  if (d == 64) return f(std::integral_constant<int, 64>{});
  return f(std::integral_constant<int, 128>{});
}

// Calls f(U) with the columns per lane of the CUDA-core path: d ≤ 32·U, U a power of two.
template <class F>
void with_lane_cols(int64_t d, F&& f) {
  if (d <= 32) return f(std::integral_constant<int, 1>{});
  if (d <= 64) return f(std::integral_constant<int, 2>{});
  if (d <= 128) return f(std::integral_constant<int, 4>{});
  return f(std::integral_constant<int, 8>{});
}

// Calls f(kDrop): the kernels with dropout on P, or without (today's, unchanged).
template <class F>
void with_dropout(bool on, F&& f) {
  if (on) return f(std::true_type{});
  return f(std::false_type{});
}

// The tensor-core tiles move 16-byte chunks: every buffer and stride must keep them aligned.
// Whether every head of the layout starts, and every row is, 16-byte aligned in each buffer.
bool aligned(const HeadsLayout& l, size_t elem, std::initializer_list<const void*> buffers) {
  bool ok = (l.batch * elem) % 16 == 0 && (l.head * elem) % 16 == 0 && (l.row * elem) % 16 == 0;
  for (const void* p : buffers) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  return ok;
}

void check_aligned(const char* op, const HeadsLayout& l, size_t elem,
                   std::initializer_list<const void*> buffers) {
  MT_CHECK(aligned(l, elem, buffers), op, ": the tensor-core kernels need 16-byte aligned heads "
           "(buffers and the strides ", l.batch, ", ", l.head, ", ", l.row, " of ", elem, "-byte elements)");
}

void check_shape(const char* op, int64_t heads, int64_t T, int64_t d) {
  MT_CHECK(heads >= 0 && T >= 0 && d >= 1 && d <= kAttentionMaxD, op, ": bad shape [", heads,
           ", ", T, ", ", d, "] (d must be in [1, ", kAttentionMaxD, "])");
  // 65535 blocks in a grid's y: the CUDA-core kernels' heads, the tile kernels' tiles (tile_grid;
  // none has fewer than kTile rows).
  MT_CHECK(heads <= 65535 && T <= int64_t(65535) * kTile, op, ": ", heads, " heads of T = ", T,
           " are more than one launch takes (at most 65535 heads and ", 65535 * kTile,
           " positions)");
}

// cuTensorMapEncodeTiled, a driver function, found through the runtime once: the build links the
// runtime only, as everywhere else.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    MT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                   cudaEnableDefault, &found));
#else
    MT_CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found));
#endif
    MT_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
             "attention: the CUDA driver has no cuTensorMapEncodeTiled (Hopper kernels need it)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// The tensor map of `heads` heads laid out as l from base (wgmma_layout.h's heads_tensor_map),
// read in boxes of 64 columns × rows rows, 128-byte swizzled, zeros past T. check_aligned has
// made the base and the strides 16-byte multiples, as the map needs.
template <class T>
CUtensorMap heads_map(const T* base, const HeadsLayout& l, int64_t heads, int64_t T_len,
                      int64_t d, int rows) {
  MT_CHECK(l.heads >= 1 && heads % l.heads == 0, "attention: ", heads, " heads are not whole "
           "batches of ", l.heads);
  const auto shape = wgmma_layout::heads_tensor_map(l.heads, l.batch, l.head, l.row, heads, T_len,
                                                    d, int64_t(sizeof(T)));
  const cuuint32_t box[4] = {64, cuuint32_t(rows), 1, 1}, step[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = tensor_map_encoder()(
      &map, std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      4, const_cast<T*>(base), shape.dims, shape.strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MT_CHECK(r == CUDA_SUCCESS, "attention: cuTensorMapEncodeTiled failed (", int(r), ") for ",
           heads, " heads of [", T_len, ", ", d, "], strides ", l.batch, ", ", l.head, ", ", l.row);
  return map;
}

// The tile kernels' grid, (heads, tiles): a block's walk is longer the farther its tile lies
// from the end of the causal diagonal, and the kernels make tile 0 the longest. The hardware
// starts a grid's blocks in the order of their linear index, x fastest, so every head's longest
// walk starts before any head's second-longest, and the short walks fill the last wave (longest
// first). With the heads in y, the last heads' longest walks would start last and run on alone.
// The kernels keep the head unsigned, as blockIdx is: their 64-bit offsets then zero-extend it (a
// signed head made ptxas spill 128 bytes more in the dK/dV pass with dropout).
dim3 tile_grid(int64_t heads, int64_t tiles) { return dim3(unsigned(heads), unsigned(tiles)); }

// Tile shapes of the mma.sync kernels per head dimension, chosen by the registers they need (no
// spills, at most 255) and by time on an H200 before the Hopper kernels took its place there (an
// sm_90a build runs these with dropout, or on other GPUs): the forward's warps take 32 query rows against K/V tiles of 64 keys (32
// at d = 128): 192 TFLOP/s at [16, 12, 1024, 64] against 166 with 16 rows (and the library's
// exp2f). The dK/dV pass takes 16 keys a warp against Q tiles of 64 rows (32 at d = 128); the dQ
// pass, 16 query rows against K/V tiles of 64 keys (32 at d = 128): with 32 rows against 32 keys
// the backward took 0.480 ms against 0.442 ms.
constexpr int kFwdMT = 2;
template <int D>
constexpr int fwd_keys() { return D == 128 ? 32 : 64; }
template <int D>
constexpr int dkdv_rows() { return D == 128 ? 32 : 64; }
constexpr int kDqMT = 1;
template <int D>
constexpr int dq_keys() { return D == 128 ? 32 : 64; }

}  // namespace

bool attention_uses_tensor_cores(DType dt, int64_t d) {
  return (dt == DType::bf16 || dt == DType::f16) && (d == 32 || d == 64 || d == 128);
}

bool attention_uses_wgmma(DType dt, int64_t d) {
#if defined(MT_CUDA_SM90A)
  if ((dt != DType::bf16 && dt != DType::f16) || (d != 64 && d != 128)) return false;
  return compute_capability(current_device()) == 90;
#else
  (void)dt, (void)d;
  return false;
#endif
}

namespace testing {

std::array<int, 2> attention_forward_counters() {
  std::array<int, 2> values{};
  const cudaStream_t s = stream(current_device());
  MT_CUDA_CHECK(cudaMemcpyFromSymbolAsync(values.data(), forward_wg_counters, sizeof(values), 0,
                                          cudaMemcpyDeviceToHost, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  return values;
}

void set_attention_forward_counters(const std::array<int, 2>& values) {
  const cudaStream_t s = stream(current_device());
  MT_CUDA_CHECK(cudaMemcpyToSymbolAsync(forward_wg_counters, values.data(), sizeof(values), 0,
                                        cudaMemcpyHostToDevice, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace testing

void attention_forward(const void* q, const void* k, const void* v, const HeadsLayout& in, void* o,
                       const HeadsLayout& out, float* lse, int64_t heads, int64_t T, int64_t d,
                       DType dt, cudaStream_t s, const AttentionDropoutArgs& dropout) {
  check_shape("attention_forward", heads, T, d);
  if (heads == 0 || T == 0) return;
  const float scale = float(1.0 / std::sqrt(double(d)));
  dispatch_float</*kWithF64=*/false>(dt, "attention_forward", [&](auto tag) {
    with_dropout(dropout.on, [&](auto drop) {
      using Tp = decltype(tag);
      constexpr bool kDrop = decltype(drop)::value;
      auto qp = static_cast<const Tp*>(q), kp = static_cast<const Tp*>(k),
           vp = static_cast<const Tp*>(v);
      auto op = static_cast<Tp*>(o);
      if constexpr (!std::is_same_v<Tp, float>) {
        if (attention_uses_tensor_cores(dt, d)) {
          check_aligned("attention_forward", in, sizeof(Tp), {q, k, v});
          check_aligned("attention_forward", out, sizeof(Tp), {o});
          with_head_dim(d, [&](auto dim) {
            constexpr int D = decltype(dim)::value;
            if constexpr (D >= 64) {
              if (attention_uses_wgmma(dt, d)) {
                if constexpr (kDrop) {
                  auto kernel = forward_wg_dropout<Tp, D>;
                  constexpr size_t bytes = wg_dropout_smem<Tp, D>();
                  allow_shared(kernel, bytes);
                  const dim3 grid = tile_grid(heads, ceil_div(T, 2 * kWgRows));
                  kernel<<<grid, 256, bytes, s>>>(
                      heads_map(qp, in, heads, T, d, 2 * kWgRows),
                      heads_map(kp, in, heads, T, d, kWgKeys),
                      heads_map(vp, in, heads, T, d, kWgKeys), int(in.heads), op, out, lse,
                      int(T), scale * kLog2e, dropout);
                  MT_CUDA_CHECK_LAUNCH();
                } else {
                  // Persistent: a block an SM, each taking work items from a counter that
                  // starts at 0. On the framework's stream, the kernel's own counters, which
                  // every launch leaves at zero (launches there run one after another, graph
                  // replays too). Any other stream might run a launch beside one of those: it
                  // gets counters of its own, zeroed here in stream order (a capture records the
                  // memset, so a replay zeroes them too).
                  auto kernel = forward_wg<Tp, D>;
                  constexpr size_t bytes = wg_forward_smem<Tp, D>();
                  allow_shared(kernel, bytes);
                  const int device = current_device();
                  const int64_t items = heads * ceil_div(T, 2 * kWgRows);
                  const unsigned blocks = unsigned(std::min<int64_t>(items, sm_count(device)));
                  // The kernel counts items in int, up to items + blocks (check_shape's limits
                  // keep that about 32K below INT_MAX).
                  MT_CHECK(items + blocks <= INT32_MAX, "attention_forward: ", items,
                           " work items are more than the Hopper forward counts");
                  const int section = wgmma_layout::section_heads(2 * T * d * int64_t(sizeof(Tp)),
                                                                  l2_bytes(device), int(heads));
                  int* counters = nullptr;
                  if (s != stream(device)) {
                    counters = static_cast<int*>(alloc_on(s, 2 * sizeof(int), device));
                    MT_CUDA_CHECK(cudaMemsetAsync(counters, 0, 2 * sizeof(int), s));
                  }
                  kernel<<<blocks, 384, bytes, s>>>(
                      heads_map(qp, in, heads, T, d, 2 * kWgRows),
                      heads_map(kp, in, heads, T, d, kWgKeys),
                      heads_map(vp, in, heads, T, d, kWgKeys), int(in.heads), op, out, lse,
                      int(T), scale * kLog2e, int(heads), section, counters);
                  MT_CUDA_CHECK_LAUNCH();
                  free_on(s, counters);
                }
                return;
              }
            }
            constexpr int BC = fwd_keys<D>(), kBM = kWarps * 16 * kFwdMT;
            auto kernel = forward_tc<Tp, D, kFwdMT, BC, kDrop>;
            const size_t bytes = size_t(kBM + 4 * BC) * (D + kPad) * sizeof(Tp);
            allow_shared(kernel, bytes);
            const dim3 grid = tile_grid(heads, ceil_div(T, kBM));
            kernel<<<grid, kThreads, bytes, s>>>(qp, kp, vp, in, op, out, lse, int(T),
                                                 scale * kLog2e, dropout);
            MT_CUDA_CHECK_LAUNCH();
          });
          return;
        }
      }
      with_lane_cols(d, [&](auto cols) {
        constexpr int U = decltype(cols)::value;
        const dim3 grid(unsigned(ceil_div(T, kWarps)), unsigned(heads));
        forward_simple<Tp, U, kDrop><<<grid, kThreads, 0, s>>>(qp, kp, vp, in, op, out, lse,
                                                              int(T), int(d), scale, dropout);
        MT_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

void attention_backward(const void* q, const void* k, const void* v, const HeadsLayout& in,
                        const void* o, const void* dout, const HeadsLayout& out, const float* lse,
                        void* dq, void* dk, void* dv, int64_t heads, int64_t T, int64_t d, DType dt,
                        bool deterministic, cudaStream_t s, const AttentionDropoutArgs& dropout) {
  check_shape("attention_backward", heads, T, d);
  if (heads == 0 || T == 0) return;
  const float scale = float(1.0 / std::sqrt(double(d)));
  const int device = current_device();
  float* Dvec = static_cast<float*>(alloc_on(s, size_t(heads * T) * sizeof(float), device));
  dispatch_float</*kWithF64=*/false>(dt, "attention_backward", [&](auto tag) {
    with_dropout(dropout.on, [&](auto drop) {
      using Tp = decltype(tag);
      constexpr bool kDrop = decltype(drop)::value;
      auto qp = static_cast<const Tp*>(q), kp = static_cast<const Tp*>(k),
           vp = static_cast<const Tp*>(v), gp = static_cast<const Tp*>(dout);
      auto dqp = static_cast<Tp*>(dq), dkp = static_cast<Tp*>(dk), dvp = static_cast<Tp*>(dv);
      const unsigned row_blocks = unsigned(ceil_div(heads * T, kThreads / kRowLanes));
      if (d % (16 / sizeof(Tp)) == 0 && aligned(out, sizeof(Tp), {o, dout}))
        rowdot_kernel<Tp, true><<<row_blocks, kThreads, 0, s>>>(
            gp, static_cast<const Tp*>(o), out, Dvec, heads * T, int(T), int(d));
      else
        rowdot_kernel<Tp, false><<<row_blocks, kThreads, 0, s>>>(
            gp, static_cast<const Tp*>(o), out, Dvec, heads * T, int(T), int(d));
      MT_CUDA_CHECK_LAUNCH();
      if constexpr (!std::is_same_v<Tp, float>) {
        if (attention_uses_tensor_cores(dt, d)) {
          check_aligned("attention_backward", in, sizeof(Tp), {q, k, v, dq, dk, dv});
          check_aligned("attention_backward", out, sizeof(Tp), {dout});
          with_head_dim(d, [&](auto dim) {
            constexpr int D = decltype(dim)::value, BR = dkdv_rows<D>();
            const size_t tiles_bytes = size_t(2 * kTile + 4 * BR) * (D + kPad) * sizeof(Tp) +
                                       size_t(4 * BR) * sizeof(float);
            const dim3 kgrid = tile_grid(heads, ceil_div(T, kTile));
            if (deterministic) {
              // The two passes need only D, not each other: dQ's runs on a side branch beside
              // dK/dV's (SideBranch), in a graph capture and eager, which fills each one's last
              // wave with the other's blocks. The kernels are the same either way, and so are
              // the bits.
              SideBranch branch(s, /*wanted=*/true, /*eager=*/true);
              if constexpr (!kDrop && D >= 64) {
                if (attention_uses_wgmma(dt, d)) {
                  constexpr int G = wg_bwd_groups<D>(), kRows = kWgRows * G;
                  auto dkdv = dkdv_wg<Tp, D>;
                  constexpr size_t kv_bytes = wg_dkdv_smem<Tp, D>();
                  allow_shared(dkdv, kv_bytes);
                  const dim3 grid = tile_grid(heads, ceil_div(T, kRows));
                  constexpr int BRw = wg_dkdv_rows<D>();
                  // The kernels count blocks in int (wgmma_layout's work_item).
                  MT_CHECK(int64_t(grid.x) * grid.y <= INT32_MAX, "attention_backward: ",
                           int64_t(grid.x) * grid.y, " blocks are more than the Hopper passes count");
                  const int bsection = wgmma_layout::backward_section_heads(
                      int(grid.y), sm_count(device), int(heads));
                  dkdv<<<grid, 128 * G, kv_bytes, s>>>(
                      heads_map(qp, in, heads, T, d, BRw), heads_map(kp, in, heads, T, d, kRows),
                      heads_map(vp, in, heads, T, d, kRows), heads_map(gp, out, heads, T, d, BRw),
                      in, int(out.heads), lse, Dvec, dkp, dvp, int(T), scale, scale * kLog2e,
                      bsection);
                  MT_CUDA_CHECK_LAUNCH();
                  auto dqk = dq_wg<Tp, D>;
                  constexpr size_t q_bytes = wg_dq_smem<Tp, D>();
                  allow_shared(dqk, q_bytes);
                  dqk<<<grid, 128 * G, q_bytes, branch.stream()>>>(
                      heads_map(qp, in, heads, T, d, kRows),
                      heads_map(kp, in, heads, T, d, kWgDqKeys),
                      heads_map(vp, in, heads, T, d, kWgDqKeys),
                      heads_map(gp, out, heads, T, d, kRows), in, int(out.heads), lse, Dvec, dqp,
                      int(T), scale, scale * kLog2e, bsection);
                  MT_CUDA_CHECK_LAUNCH();
                  branch.join();  // before Dvec goes back to the pool on s
                  return;
                }
              }
              auto dkdv = dkdv_tc<Tp, D, BR, false, kDrop>;
              allow_shared(dkdv, tiles_bytes);
              dkdv<<<kgrid, kThreads, tiles_bytes, s>>>(qp, kp, vp, in, gp, out, lse, Dvec, dkp, dvp,
                                                        nullptr, int(T), scale, scale * kLog2e,
                                                        dropout);
              MT_CUDA_CHECK_LAUNCH();
              constexpr int MT = kDqMT, kBM = kWarps * 16 * MT;
              auto dqk = dq_tc<Tp, D, MT, dq_keys<D>(), kDrop>;
              const size_t dq_bytes = size_t(2 * kBM + 4 * dq_keys<D>()) * (D + kPad) * sizeof(Tp);
              allow_shared(dqk, dq_bytes);
              const dim3 qgrid = tile_grid(heads, ceil_div(T, kBM));
              dqk<<<qgrid, kThreads, dq_bytes, branch.stream()>>>(
                  qp, kp, vp, in, gp, out, lse, Dvec, dqp, int(T), scale, scale * kLog2e, dropout);
              MT_CUDA_CHECK_LAUNCH();
              branch.join();  // before Dvec goes back to the pool on s
            } else {
              const int64_t n = heads * T * d;
              float* dq_acc = static_cast<float*>(alloc_on(s, size_t(n) * sizeof(float), device));
              MT_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, size_t(n) * sizeof(float), s));
              auto dkdv = dkdv_tc<Tp, D, BR, true, kDrop>;
              const size_t bytes = tiles_bytes + size_t(kTile) * (BR + kPad) * sizeof(Tp);
              allow_shared(dkdv, bytes);
              dkdv<<<kgrid, kThreads, bytes, s>>>(qp, kp, vp, in, gp, out, lse, Dvec, dkp, dvp,
                                                  dq_acc, int(T), scale, scale * kLog2e, dropout);
              MT_CUDA_CHECK_LAUNCH();
              round_kernel<Tp><<<unsigned(std::min<int64_t>(ceil_div(n, 256), 65535)), 256, 0, s>>>(
                  dq_acc, dqp, in, int(T), int(d), n);
              MT_CUDA_CHECK_LAUNCH();
              free_on(s, dq_acc);
            }
          });
          return;
        }
      }
      with_lane_cols(d, [&](auto cols) {
        constexpr int U = decltype(cols)::value;
        const dim3 grid(unsigned(ceil_div(T, kWarps)), unsigned(heads));
        dq_simple<Tp, U, kDrop><<<grid, kThreads, 0, s>>>(qp, kp, vp, in, gp, out, lse, Dvec, dqp,
                                                          int(T), int(d), scale, dropout);
        MT_CUDA_CHECK_LAUNCH();
        dkdv_simple<Tp, U, kDrop><<<grid, kThreads, 0, s>>>(qp, kp, vp, in, gp, out, lse, Dvec,
                                                            dkp, dvp, int(T), int(d), scale,
                                                            dropout);
        MT_CUDA_CHECK_LAUNCH();
      });
    });
  });
  free_on(s, Dvec);  // stream-ordered: released after the passes that read it
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for attention on CUDA -----------------------------------
namespace mt {
namespace {

// The op's dropout as the launchers take it: the threshold, 1/(1 − p) in fp32, the base's address.
cuda::AttentionDropoutArgs dropout_args(const AttentionDropout& d) {
  if (d.p == 0) return {};
  return {.on = true, .threshold = dropout_threshold(d.p), .scale = float(1.0 / (1.0 - d.p)),
          .seed = d.seed, .offset = d.offset,
          .base = d.base.defined() ? static_cast<const uint64_t*>(d.base.data_ptr()) : nullptr};
}

// The layout of [B, H, T, d] views (attention.h's kernel contract): the strides of `first`,
// which every other tensor given must share; a row's d elements contiguous.
// A tensor of at most one element may carry any strides (it counts as contiguous), and none is
// ever used: its layout is not checked.
cuda::HeadsLayout layout_of(const Tensor& first, std::initializer_list<const Tensor*> others) {
  const Shape& st = first.strides();
  if (first.numel() <= 1) return {.heads = first.size(1), .batch = 0, .head = 0, .row = 0};
  MT_CHECK(first.size(3) == 1 || st[3] == 1, "attention: a head's row must be contiguous, got "
           "strides ", shape_str(st));
  for (const Tensor* t : others)
    MT_CHECK(t->strides() == st, "attention: tensors meant to share strides ", shape_str(st),
             " have ", shape_str(t->strides()));
  return {.heads = first.size(1), .batch = st[0], .head = st[1], .row = st[2]};
}

void attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                            const Tensor& lse, const AttentionDropout& dropout) {
  cuda::attention_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), layout_of(q, {&k, &v}),
                          o.data_ptr(), layout_of(o, {}), cuda::ptr<float>(lse),
                          q.size(0) * q.size(1), q.size(2), q.size(3), q.dtype(),
                          cuda::stream_of(q), dropout_args(dropout));
}

void attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, const Tensor& dout, const Tensor& dq,
                             const Tensor& dk, const Tensor& dv, const AttentionDropout& dropout) {
  cuda::attention_backward(q.data_ptr(), k.data_ptr(), v.data_ptr(),
                           layout_of(q, {&k, &v, &dq, &dk, &dv}), o.data_ptr(), dout.data_ptr(),
                           layout_of(o, {&dout}), cuda::ptr<const float>(lse), dq.data_ptr(),
                           dk.data_ptr(), dv.data_ptr(), q.size(0) * q.size(1), q.size(2),
                           q.size(3), q.dtype(), deterministic(), cuda::stream_of(q),
                           dropout_args(dropout));
}

}  // namespace

MT_REGISTER_KERNEL(attention, Forward, CUDA, attention_forward_cuda);
MT_REGISTER_KERNEL(attention, Backward, CUDA, attention_backward_cuda);

}  // namespace mt
