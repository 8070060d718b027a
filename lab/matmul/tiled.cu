// GEMM (a): shared-memory tiles on the fp32 units.
//
// Block (bx, by) computes the 64 x 64 tile C[by·64 .., bx·64 ..]. It walks K in steps of 16: the
// 256 threads copy A's 64 x 16 and B's 16 x 64 slices into shared memory (converted to fp32,
// stored k-major: As[k][m], Bs[k][n], whatever the layout in global memory), wait, and each thread
// adds the 16 rank-one updates of its own 4 x 4 outputs from registers. Every element loaded from
// global memory is used 64 times from shared memory and every shared load 4 times from registers:
// that reuse is the whole idea of tiling. What limits it: fp32 FMAs (the H200 has ~67 TFLOP/s of
// them, against ~990 of dense bf16 tensor-core math) and the shared-memory traffic of the inner
// loop, so it reaches a few percent of cuBLAS. Any size, any alignment: loads are bounds-checked.
#include "core/cuda/check.h"
#include "lab/common.cuh"
#include "lab/matmul/gemm.h"

namespace mt::lab {
namespace {

constexpr int kTile = 64, kStep = 16, kMicro = 4;  // 16 x 16 threads, 4 x 4 outputs each

// Element (row, col) of a logical [rows, cols] operand stored row-major, or as its transpose.
__device__ __forceinline__ float operand(const bf16* p, bool stored_t, int64_t row, int64_t col,
                                         int64_t rows, int64_t cols) {
  if (row >= rows || col >= cols) return 0.0f;  // outside the matrix: adds nothing
  return to_float(stored_t ? p[col * rows + row] : p[row * cols + col]);
}

template <class TC>
__global__ void __launch_bounds__(kThreads)
    tiled_kernel(const bf16* a, const bf16* b, TC* c, int64_t M, int64_t N, int64_t K, bool a_t,
                 bool b_t, float beta) {
  __shared__ float As[kStep][kTile + 4];  // +4: the k-fast stores of a row-major A spread banks
  __shared__ float Bs[kStep][kTile + 4];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t m0 = int64_t(blockIdx.y) * kTile, n0 = int64_t(blockIdx.x) * kTile;
  float acc[kMicro][kMicro] = {};

  for (int64_t k0 = 0; k0 < K; k0 += kStep) {
    // 1024 elements of each slice, 4 a thread; consecutive threads take consecutive addresses
    // in global memory (k for a row-major A, m for a stored-transposed one).
    for (int e = threadIdx.x; e < kTile * kStep; e += kThreads) {
      const int i = a_t ? e % kTile : e / kStep, k = a_t ? e / kTile : e % kStep;
      As[k][i] = operand(a, a_t, m0 + i, k0 + k, M, K);
      const int j = b_t ? e / kStep : e % kTile, kb = b_t ? e % kStep : e / kTile;
      Bs[kb][j] = operand(b, b_t, k0 + kb, n0 + j, K, N);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kStep; ++k) {
      float av[kMicro], bv[kMicro];
#pragma unroll
      for (int i = 0; i < kMicro; ++i) av[i] = As[k][ty * kMicro + i], bv[i] = Bs[k][tx * kMicro + i];
#pragma unroll
      for (int i = 0; i < kMicro; ++i)
#pragma unroll
        for (int j = 0; j < kMicro; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();  // before the next slice overwrites the tiles
  }

#pragma unroll
  for (int i = 0; i < kMicro; ++i)
#pragma unroll
    for (int j = 0; j < kMicro; ++j) {
      const int64_t m = m0 + ty * kMicro + i, n = n0 + tx * kMicro + j;
      if (m >= M || n >= N) continue;
      if constexpr (sizeof(TC) == 4)  // fp32 C: beta = 1 is the '+=' into .grad
        c[m * N + n] = acc[i][j] + (beta == 0.0f ? 0.0f : beta * c[m * N + n]);
      else
        c[m * N + n] = from_float<TC>(acc[i][j]);
    }
}

}  // namespace

void gemm_tiled(const GemmArgs& g, cudaStream_t s) {
  check_gemm_args(g, "gemm_tiled");
  const GemmShape& sh = g.shape;
  const dim3 grid(unsigned((sh.N + kTile - 1) / kTile), unsigned((sh.M + kTile - 1) / kTile));
  const auto* a = static_cast<const bf16*>(g.a);
  const auto* b = static_cast<const bf16*>(g.b);
  if (g.c_fp32)
    tiled_kernel<float><<<grid, kThreads, 0, s>>>(a, b, static_cast<float*>(g.c), sh.M, sh.N, sh.K,
                                                  sh.a_t, sh.b_t, g.beta);
  else
    tiled_kernel<bf16><<<grid, kThreads, 0, s>>>(a, b, static_cast<bf16*>(g.c), sh.M, sh.N, sh.K,
                                                 sh.a_t, sh.b_t, 0.0f);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::lab
