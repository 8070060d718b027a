// GEMM (b): the tensor cores, through wmma (bf16 x bf16 -> fp32, 16 x 16 x 16 fragments).
//
// Block tile 128 x 128 of C, 8 warps as 2 x 4, each warp a 64 x 32 tile = 4 x 2 accumulator
// fragments (64 fp32 registers a thread). K is walked in steps of 32 through a 3-stage ring of
// shared-memory buffers filled with cp.async (16-byte copies that bypass the registers): while
// the warps multiply step t, the copies of steps t + 1 and t + 2 are in flight, so the tensor
// cores do not wait on HBM. One barrier per step: the buffer refilled at step t is the one every
// warp finished at step t − 1.
//
// Layouts: each operand's tile is copied as it lies in global memory (that is what keeps the
// copies 16 bytes wide) and the fragment is told its layout: A row-major [128][32] or, stored
// transposed (dW's dYᵀ), [32][128] read as col_major; B [32][128] row-major or, stored [N, K]
// (the forward's Wᵀ), [128][32] read as col_major. Rows are padded by 8 elements (16 bytes) so
// the fragment loads of consecutive rows fall in different banks.
//
// Epilogue: each warp stages one fragment at a time in shared memory and writes it out with bounds
// checks: bf16 C rounded once from fp32, or fp32 C = acc + beta·C (beta = 1: the '+=' into .grad).
// Blocks are numbered in groups of 8 block-rows (the order Triton uses) so that the blocks
// running at once share A and B tiles in L2.
//
// What limits it: wmma compiles to the mma.sync instructions of sm_80. The H200's fastest path
// (sm_90's wgmma, fed by the TMA, with warp-specialized producers) is what cuBLAS uses; mma.sync
// from registers, with ldmatrix-style fragment loads and address arithmetic on every thread,
// cannot reach its peak. Edges: any M, N, K; a tile chunk that is not 16 bytes wide and aligned
// (a leading dimension not a multiple of 8, the matrix's edge) is copied element by element.
#include <mma.h>

#include <type_traits>

#include "core/cuda/check.h"
#include "core/error.h"
#include "lab/common.cuh"
#include "lab/matmul/gemm.h"

namespace mt::lab {
namespace {

using namespace nvcuda;

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 3, kPad = 8;
constexpr int kWarpM = 64, kWarpN = 32, kFragM = kWarpM / 16, kFragN = kWarpN / 16;
constexpr int kGroup = 8;  // block-rows per group of the launch order

// A's tile: [kBM][kBK] (m rows) or, stored transposed, [kBK][kBM] (k rows).
template <bool AT>
struct ATile {
  static constexpr int rows = AT ? kBK : kBM, cols = AT ? kBM : kBK, ld = cols + kPad;
  static constexpr int elems = rows * ld;
  using layout = std::conditional_t<AT, wmma::col_major, wmma::row_major>;
  __device__ static const bf16* at(const bf16* t, int m, int k) { return AT ? t + k * ld + m : t + m * ld + k; }
};
// B's tile: [kBK][kBN] (k rows) or, stored as [N, K], [kBN][kBK] (n rows).
template <bool BT>
struct BTile {
  static constexpr int rows = BT ? kBN : kBK, cols = BT ? kBK : kBN, ld = cols + kPad;
  static constexpr int elems = rows * ld;
  using layout = std::conditional_t<BT, wmma::col_major, wmma::row_major>;
  __device__ static const bf16* at(const bf16* t, int k, int n) { return BT ? t + n * ld + k : t + k * ld + n; }
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned dst = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Rows [r0, r0 + ROWS) x columns [c0, c0 + COLS) of the row-major [R, C] buffer g into the tile
// (row stride LD), zeros outside the matrix. `vec`: C % 8 == 0 and g 16-byte aligned.
template <int ROWS, int COLS, int LD>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* g, int64_t R, int64_t C,
                                          int64_t r0, int64_t c0, bool vec) {
  constexpr int kChunksPerRow = COLS / kPack;
  for (int q = threadIdx.x; q < ROWS * kChunksPerRow; q += kThreads) {
    const int r = q / kChunksPerRow, c = (q % kChunksPerRow) * kPack;
    bf16* dst = tile + r * LD + c;
    const int64_t gr = r0 + r, gc = c0 + c;
    if (vec && gr < R && gc + kPack <= C) {
      cp_async16(dst, g + gr * C + gc);
    } else {
#pragma unroll
      for (int e = 0; e < kPack; ++e)
        dst[e] = gr < R && gc + e < C ? g[gr * C + gc + e] : from_float<bf16>(0.0f);
    }
  }
}

template <bool AT, bool BT, class TC>
__global__ void __launch_bounds__(kThreads)
    tensor_core_kernel(const bf16* a, const bf16* b, TC* c, int64_t M, int64_t N, int64_t K,
                       float beta, bool a_vec, bool b_vec) {
  using TA = ATile<AT>;
  using TB = BTile<BT>;
  constexpr int kStage = TA::elems + TB::elems;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);

  // Grouped launch order: block ids run down kGroup block-rows before moving one block-column.
  const int grid_m = int((M + kBM - 1) / kBM), grid_n = int((N + kBN - 1) / kBN);
  const int per_group = kGroup * grid_n, first = int(blockIdx.x) / per_group * kGroup;
  const int group_rows = min(grid_m - first, kGroup), in_group = int(blockIdx.x) % per_group;
  const int64_t m0 = int64_t(first + in_group % group_rows) * kBM;
  const int64_t n0 = int64_t(in_group / group_rows) * kBN;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 4, wn = warp % 4;  // this warp's 64 x 32 tile inside the block's tile
  const int steps = int((K + kBK - 1) / kBK);

  auto load_step = [&](int t) {
    bf16* ta = smem + (t % kStages) * kStage;
    bf16* tb = ta + TA::elems;
    const int64_t k0 = int64_t(t) * kBK;
    if constexpr (AT) load_tile<TA::rows, TA::cols, TA::ld>(ta, a, K, M, k0, m0, a_vec);
    else load_tile<TA::rows, TA::cols, TA::ld>(ta, a, M, K, m0, k0, a_vec);
    if constexpr (BT) load_tile<TB::rows, TB::cols, TB::ld>(tb, b, N, K, n0, k0, b_vec);
    else load_tile<TB::rows, TB::cols, TB::ld>(tb, b, K, N, k0, n0, b_vec);
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFragM][kFragN];
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  // Prologue: steps 0 .. kStages - 2 in flight. Every step commits one group (maybe empty), so
  // "all but kStages - 2 groups done" always means "step t has landed".
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < steps) load_step(t);
    cp_async_commit();
  }
  for (int t = 0; t < steps; ++t) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // step t visible to all; every warp is done with step t - 1's buffer
    if (t + kStages - 1 < steps) load_step(t + kStages - 1);  // into step t - 1's buffer
    cp_async_commit();

    const bf16* ta = smem + (t % kStages) * kStage;
    const bf16* tb = ta + TA::elems;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, typename TA::layout> fa[kFragM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, typename TB::layout> fb[kFragN];
#pragma unroll
      for (int i = 0; i < kFragM; ++i)
        wmma::load_matrix_sync(fa[i], TA::at(ta, wm * kWarpM + i * 16, kk), TA::ld);
#pragma unroll
      for (int j = 0; j < kFragN; ++j)
        wmma::load_matrix_sync(fb[j], TB::at(tb, kk, wn * kWarpN + j * 16), TB::ld);
#pragma unroll
      for (int i = 0; i < kFragM; ++i)
#pragma unroll
        for (int j = 0; j < kFragN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: reuse it as each warp's 16 x 16 fp32 staging area

  float* stage = reinterpret_cast<float*>(smem_raw) + warp * 256;
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j) {
      wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int64_t m = m0 + wm * kWarpM + i * 16 + e / 16, n = n0 + wn * kWarpN + j * 16 + e % 16;
        if (m >= M || n >= N) continue;
        if constexpr (sizeof(TC) == 4)
          c[m * N + n] = stage[e] + (beta == 0.0f ? 0.0f : beta * c[m * N + n]);
        else
          c[m * N + n] = from_float<TC>(stage[e]);
      }
      __syncwarp();  // before the next fragment overwrites the staging area
    }
}

template <bool AT, bool BT, class TC>
void launch(const GemmArgs& g, cudaStream_t s) {
  constexpr size_t bytes = size_t(kStages) * (ATile<AT>::elems + BTile<BT>::elems) * sizeof(bf16);
  static_assert(bytes >= kThreads / 32 * 256 * sizeof(float), "the epilogue's staging must fit");
  auto* kernel = tensor_core_kernel<AT, BT, TC>;
  static const bool opted_in = [&] {  // more than 48 KB of shared memory needs an opt-in
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    return true;
  }();
  (void)opted_in;
  const GemmShape& sh = g.shape;
  const int64_t blocks = ((sh.M + kBM - 1) / kBM) * ((sh.N + kBN - 1) / kBN);
  // A's stored row length is K (M when transposed), B's is N (K when stored as [N, K]).
  const bool a_vec = (AT ? sh.M : sh.K) % kPack == 0 && cuda::aligned(g.a, 16);
  const bool b_vec = (BT ? sh.K : sh.N) % kPack == 0 && cuda::aligned(g.b, 16);
  kernel<<<unsigned(blocks), kThreads, bytes, s>>>(static_cast<const bf16*>(g.a),
                                                   static_cast<const bf16*>(g.b),
                                                   static_cast<TC*>(g.c), sh.M, sh.N, sh.K, g.beta,
                                                   a_vec, b_vec);
  MT_CUDA_CHECK_LAUNCH();
}

template <class TC>
void launch_for(const GemmArgs& g, cudaStream_t s) {
  const bool at = g.shape.a_t, bt = g.shape.b_t;
  if (!at && bt) return launch<false, true, TC>(g, s);    // forward
  if (!at && !bt) return launch<false, false, TC>(g, s);  // dX
  if (at && !bt) return launch<true, false, TC>(g, s);    // dW
  MT_THROW("gemm_tensor_core: ", g.shape.str(), " (both operands transposed) is not one of the "
           "linear layer's GEMMs");
}

}  // namespace

void gemm_tensor_core(const GemmArgs& g, cudaStream_t s) {
  check_gemm_args(g, "gemm_tensor_core");
  if (g.c_fp32) launch_for<float>(g, s);
  else launch_for<bf16>(g, s);
}

}  // namespace mt::lab
