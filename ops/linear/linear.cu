// Linear forward / backward on CUDA: three cuBLASLt GEMMs, a bias cast and a column sum; and the
// same GEMMs with GELU in the epilogue for gelu_mlp (at the end of the file).
//
// Row-major through column-major cuBLAS. A row-major [R, C] buffer is, read column-major, the
// [C, R] transpose. So each row-major product is computed as its transpose, C^T = B^T · A^T,
// with the operands swapped and op flags for the rest (m, n, k and leading dims below are the
// column-major view):
//   forward  y^T[N,M]  = W[N,K] · x^T[K,M]   A = W  (op T, stored [K,N]), B = x  (op N, [K,M])
//   dx       dx^T[K,M] = W^T[K,N] · dy^T[N,M] A = W  (op N, [K,N]),        B = dy (op N, [N,M])
//   dW       dW^T[K,N] = x^T[K,M] · dy[M,N]   A = x  (op N, [K,M]),        B = dy (op T, [N,M])
// Each GEMM is 2·M·N·K FLOPs with fp32 accumulation; the floor is cuBLAS's own speed for that
// shape (bench/bench_linear.cu measures it). dx stores ('=', beta 0); dW is fp32 output from
// dt inputs with beta = beta_dW, so beta 1 accumulates into .grad inside the GEMM in fp32.
//
// Bias. The cuBLASLt BIAS epilogue adds the bias to the fp32 accumulator before the one rounding
// to the output, at no extra memory traffic. Its bias elements must have the output's type
// (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: Dtype, except for IMMA and fp8 kernels).
// For f32 output that is our fp32 bias. For bf16/f16 output cast_bias_kernel first rounds the
// N-element fp32 bias to dt in pool scratch (as PyTorch autocast does), which costs 6·N bytes
// instead of the 4·M·N-byte read and rewrite of y that a separate bias-add pass would. A
// Linear under mixed precision keeps that rounded bias as its compute copy (refreshed by the
// optimizer with the weight's), and then no cast runs at all: linear_forward_dt_bias.
//
// db, two passes, deterministic (no atomics). (cuBLASLt's BGRADB epilogue on the dW GEMM was
// measured instead: on the H200 it runs a separate kernel of its own, slower than these two.)
//   1. colsum_partials_kernel: grid (ceil(N/32), chunks), block (32, 8). A block owns 32 columns
//      and a fixed range of rows; thread (c, r) adds rows r, r+8, ... of its column in fp32, the
//      8 row-threads are added in order, partials[chunk, col] = ('=').
//   2. colsum_final_kernel: one thread per column adds the chunks in order, db[col] += total.
//   With at most kOneChunkRows rows there is one chunk, and pass 1 adds its column sums straight
//   into db (one launch: a small step counts launches, and 8 row-threads reach every row).
// Bytes: M·N·sizeof(dt) read once (+ 2·chunks·N·4 of partials). Floor: dy read at copy bandwidth.
#include "ops/linear/linear_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda/glue.h"
#include "core/cuda/runtime.h"
#include "core/cuda/vec.cuh"
#include "core/registry.h"
#include "core/switches.h"
#include "ops/linear/linear.h"

namespace mt::cuda {
namespace {

// ---- cuBLASLt plans ----------------------------------------------------------------------------

cudaDataType_t cuda_type(DType dt, const char* op) {
  switch (dt) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: MT_THROW(op, ": unsupported dtype ", dtype_name(dt), " (expected f32, bf16, f16)");
  }
}

// One column-major GEMM D = alpha · op(A) · op(B) + beta · C with C = D. aux_ld: the leading
// dimension of the GELU epilogues' auxiliary matrix (the pre-activation), 0 for the others.
struct Gemm {
  cublasOperation_t ta, tb;
  int64_t m, n, k;
  cudaDataType_t ab_type, cd_type;
  int64_t lda, ldb, ldc;
  cublasLtEpilogue_t epilogue;
  int64_t aux_ld = 0;
};

// What cuBLASLt chose for one GEMM, built once and kept for the life of the process.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// Largest power of two dividing the address, capped at cuBLASLt's default assumption of 256:
// an algorithm that needs more alignment than a pointer has must not be chosen for it.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t low = a & (~a + 1);  // lowest set bit; 0 for nullptr
  return low == 0 || low > 256 ? 256u : uint32_t(low);
}

// The key holds everything the choice depends on: device, shape, ops, types, leading dims,
// epilogue, the pointers' alignment (the bias and aux pointers' too, which the heuristic reads)
// and whether the algorithm is measured (gemm_autotune()).
using PlanKey = std::array<int64_t, 19>;

std::mutex g_plans_mutex;
std::map<PlanKey, std::unique_ptr<Plan>> g_plans;

constexpr int kCandidates = 8;  // heuristic candidates timed when gemm_autotune() is on
constexpr int kTimedRuns = 5;   // back-to-back runs per candidate, after one untimed

GemmPlanStats g_stats;

// Times each candidate on the call's own A, B and bias into a zeroed scratch D (never the real
// one: with beta 1 that is a .grad being accumulated; a GELU_AUX epilogue still writes the real
// aux matrix, which the call itself then overwrites, and DGELU only reads it), kTimedRuns runs back to back between two
// events, and returns the index of the fastest (the earlier on a tie). Waits for the device. The
// scratch is a plain cudaMalloc, not the pool, because s need not be the framework stream; this
// runs once per shape, on the first call.
int fastest(cublasLtHandle_t h, const Plan& p, const cublasLtMatmulHeuristicResult_t* cand, int n,
            const void* A, const void* B, float beta, void* ws, size_t ws_bytes, const Gemm& g,
            cudaStream_t s) {
  const size_t d_bytes = size_t(g.ldc) * g.n * (g.cd_type == CUDA_R_32F ? 4 : 2);
  void* D = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&D, d_bytes));
  MT_CUDA_CHECK(cudaMemsetAsync(D, 0, d_bytes, s));
  cudaEvent_t start, stop;
  MT_CUDA_CHECK(cudaEventCreate(&start));
  MT_CUDA_CHECK(cudaEventCreate(&stop));
  const float alpha = 1.f;
  int best = 0;
  float best_ms = -1.f;
  for (int i = 0; i < n; ++i) {
    auto run = [&] {
      return cublasLtMatmul(h, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.c, D, p.c, &cand[i].algo,
                            ws, ws_bytes, s);
    };
    // Offered but not usable, or refused at launch: not a candidate.
    if (cand[i].state != CUBLAS_STATUS_SUCCESS || run() != CUBLAS_STATUS_SUCCESS) continue;
    MT_CUDA_CHECK(cudaEventRecord(start, s));
    for (int r = 0; r < kTimedRuns; ++r) MT_CUBLAS_CHECK(run());
    MT_CUDA_CHECK(cudaEventRecord(stop, s));
    MT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (best_ms < 0.f || ms < best_ms) best = i, best_ms = ms;
  }
  MT_CUDA_CHECK(cudaEventDestroy(start));
  MT_CUDA_CHECK(cudaEventDestroy(stop));
  MT_CUDA_CHECK(cudaFree(D));
  return best;
}

// Builds the descriptor and layouts, then picks the algorithm: the heuristic's first, or with
// gemm_autotune() the fastest of its first kCandidates measured here (not while the stream is
// being captured into a graph: timing would wait on a stream that runs nothing yet).
std::unique_ptr<Plan> make_plan(cublasLtHandle_t h, const Gemm& g, const void* A, const void* B,
                                const void* C, const void* bias, const void* aux, float beta,
                                void* ws, size_t ws_bytes, cudaStream_t s) {
  auto p = std::make_unique<Plan>();
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.ta, sizeof(g.ta)));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &g.tb, sizeof(g.tb)));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue,
                                                 sizeof(g.epilogue)));
  if (bias != nullptr)
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof(bias)));
  if (aux != nullptr) {
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                   &aux, sizeof(aux)));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                   &g.aux_ld, sizeof(g.aux_ld)));
  }
  // Stored shapes: op N keeps (rows, cols) = (m, k) for A and (k, n) for B; op T swaps them.
  const bool at = g.ta != CUBLAS_OP_N, bt = g.tb != CUBLAS_OP_N;
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, g.ab_type, at ? g.k : g.m, at ? g.m : g.k, g.lda));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, g.ab_type, bt ? g.n : g.k, bt ? g.k : g.n, g.ldb));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, g.cd_type, g.m, g.n, g.ldc));

  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MT_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  const bool measure = gemm_autotune() && capture == cudaStreamCaptureStatusNone;

  cublasLtMatmulPreference_t pref = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws_max = ws_bytes;
  const uint32_t al_a = alignment(A), al_b = alignment(B), al_c = alignment(C);
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max, sizeof(ws_max)));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  std::array<cublasLtMatmulHeuristicResult_t, kCandidates> cand{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      h, p->desc, p->a, p->b, p->c, p->c, pref, measure ? kCandidates : 1, cand.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  MT_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0 && cand[0].state == CUBLAS_STATUS_SUCCESS,
           "linear: cuBLASLt has no algorithm for m=", g.m, " n=", g.n, " k=", g.k, " (",
           cublasGetStatusName(st), ", alignments A/B/C ", al_a, "/", al_b, "/", al_c, ")");
  int pick = 0;
  if (measure && found > 1) {
    pick = fastest(h, *p, cand.data(), found, A, B, beta, ws, ws_bytes, g, s);
    ++g_stats.measured;
    if (pick != 0) ++g_stats.not_first;
  }
  ++g_stats.plans;
  p->algo = cand[pick].algo;
  return p;
}

// D = alpha · op(A) · op(B) + beta · D (+ bias, and the epilogue's aux matrix: written by
// GELU_AUX, read by DGELU; const here because cuBLASLt takes both through one void* attribute),
// planned once per key, on stream s.
void lt_matmul(const Gemm& g, const void* A, const void* B, void* D, float alpha, float beta,
               const void* bias, cudaStream_t s, const void* aux = nullptr) {
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  cublasLtHandle_t h = cublaslt(dev);
  size_t ws_bytes = 0;
  void* ws = cublaslt_workspace(dev, s, &ws_bytes);
  const PlanKey key{dev,        g.ta,       g.tb,         g.m,          g.n,        g.k,
                    g.ab_type,  g.cd_type,  g.lda,        g.ldb,        g.ldc,      g.epilogue,
                    alignment(A), alignment(B), alignment(D), alignment(bias), gemm_autotune(),
                    g.aux_ld,   alignment(aux)};
  // One lock for lookup and launch: the bias and aux pointers are written into the shared
  // descriptor.
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  auto it = g_plans.find(key);
  if (it == g_plans.end())
    it = g_plans.emplace(key, make_plan(h, g, A, B, D, bias, aux, beta, ws, ws_bytes, s)).first;
  Plan& p = *it->second;
  if (bias != nullptr)
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof(bias)));
  if (aux != nullptr)
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                   &aux, sizeof(aux)));
  MT_CUBLAS_CHECK(cublasLtMatmul(h, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.c, D, p.c, &p.algo,
                                 ws, ws_bytes, s));
}

// ---- small kernels -----------------------------------------------------------------------------

template <class T>
__global__ void cast_bias_kernel(const float* bias, T* out, int64_t N) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < N) out[i] = from_float<T>(bias[i]);
}

constexpr int kColBlock = 32;  // columns per block (one warp across)
constexpr int kRowThreads = 8;  // row-threads per column
constexpr int64_t kOneChunkRows = 512;

// out = partials (out[chunk, col] '='), or with kIntoDb, db itself (out[col] '+=', one chunk).
template <class T, bool kIntoDb>
__global__ void colsum_partials_kernel(const T* dy, int64_t M, int64_t N, int64_t rows_per_chunk,
                                       float* out) {
  const int64_t col = int64_t(blockIdx.x) * kColBlock + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < M ? r0 + rows_per_chunk : M;
  float acc = 0.f;
  if (col < N) {
    const T* p = dy + col;
    int64_t r = r0 + threadIdx.y;
    // Four rows loaded before they are added (in row order, as the plain loop would).
    for (; r + 3 * kRowThreads < r1; r += 4 * kRowThreads) {
      const float a = to_float(p[r * N]), b = to_float(p[(r + kRowThreads) * N]);
      const float c = to_float(p[(r + 2 * kRowThreads) * N]), d = to_float(p[(r + 3 * kRowThreads) * N]);
      acc += a, acc += b, acc += c, acc += d;
    }
    for (; r < r1; r += kRowThreads) acc += to_float(p[r * N]);
  }
  __shared__ float part[kRowThreads][kColBlock + 1];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < N) {
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < kRowThreads; ++i) t += part[i][threadIdx.x];
    if constexpr (kIntoDb)
      out[col] += t;
    else
      out[int64_t(blockIdx.y) * N + col] = t;
  }
}

__global__ void colsum_final_kernel(const float* partials, int chunks, int64_t N, float* db) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= N) return;
  float t = 0.f;
  for (int c = 0; c < chunks; ++c) t += partials[int64_t(c) * N + col];
  db[col] += t;
}

// The framework pool orders scratch on the framework stream; kernels using it must run there.
int scratch_device(cudaStream_t s, const char* what) {
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CHECK(s == mt::cuda::stream(dev), what, " must run on the framework stream of device ", dev,
           " (its scratch is ordered there)");
  return dev;
}

void bias_grad(const void* dy, float* db, int64_t M, int64_t N, DType dt, cudaStream_t s) {
  const int64_t col_blocks = (N + kColBlock - 1) / kColBlock;
  if (M <= kOneChunkRows) {  // one chunk: the column sums go straight into db
    dispatch_float<false>(dt, "linear_backward", [&](auto tag) {
      using T = decltype(tag);
      colsum_partials_kernel<T, true><<<dim3(unsigned(col_blocks), 1), dim3(kColBlock, kRowThreads), 0, s>>>(
          static_cast<const T*>(dy), M, N, M, db);
      MT_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  const int dev = scratch_device(s, "linear_backward with db");
  // Enough (column block, row chunk) blocks to fill the GPU, fixed by (M, N) alone.
  const int64_t want = std::max<int64_t>(1, std::min<int64_t>((M + 63) / 64, 2048 / col_blocks));
  const int64_t rows_per_chunk = (M + want - 1) / want;
  const int chunks = int((M + rows_per_chunk - 1) / rows_per_chunk);
  auto* partials = static_cast<float*>(mt::cuda::alloc(size_t(chunks) * N * sizeof(float), dev));
  dispatch_float<false>(dt, "linear_backward", [&](auto tag) {
    using T = decltype(tag);
    colsum_partials_kernel<T, false><<<dim3(unsigned(col_blocks), unsigned(chunks)), dim3(kColBlock, kRowThreads), 0, s>>>(
        static_cast<const T*>(dy), M, N, rows_per_chunk, partials);
    MT_CUDA_CHECK_LAUNCH();
  });
  colsum_final_kernel<<<unsigned((N + 255) / 256), 256, 0, s>>>(partials, chunks, N, db);
  MT_CUDA_CHECK_LAUNCH();
  mt::cuda::free(partials, dev);  // stream-ordered: released after the kernels above have run
}

void check_shape(const char* op, int64_t M, int64_t N, int64_t K) {
  MT_CHECK(M >= 0 && N > 0 && K > 0, op, ": bad shape M=", M, " N=", N, " K=", K,
           " (need M >= 0, N > 0, K > 0)");
}

}  // namespace

GemmPlanStats gemm_plan_stats() {
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  return g_stats;
}

// For 16-bit y the fp32 bias is first rounded to dt in scratch; then the same GEMM.
void linear_forward(const void* x, const void* W, const float* bias, void* y, int64_t M, int64_t N,
                    int64_t K, DType dt, cudaStream_t s) {
  if (bias == nullptr || dt == DType::f32) return linear_forward_dt_bias(x, W, bias, y, M, N, K, dt, s);
  check_shape("linear_forward", M, N, K);
  if (M == 0) return;
  const int dev = scratch_device(s, "linear_forward with a bias");
  void* b = mt::cuda::alloc(size_t(N) * dtype_size(dt), dev);
  const unsigned blocks = unsigned((N + 255) / 256);
  if (dt == DType::bf16) cast_bias_kernel<<<blocks, 256, 0, s>>>(bias, static_cast<__nv_bfloat16*>(b), N);
  else cast_bias_kernel<<<blocks, 256, 0, s>>>(bias, static_cast<__half*>(b), N);
  MT_CUDA_CHECK_LAUNCH();
  linear_forward_dt_bias(x, W, b, y, M, N, K, dt, s);
  mt::cuda::free(b, dev);  // stream-ordered: released after the GEMM has run
}

// The one forward GEMM: y^T = W · x^T with the BIAS epilogue when there is a bias (in dt).
void linear_forward_dt_bias(const void* x, const void* W, const void* bias, void* y, int64_t M,
                            int64_t N, int64_t K, DType dt, cudaStream_t s) {
  check_shape("linear_forward", M, N, K);
  if (M == 0) return;
  const cudaDataType_t t = cuda_type(dt, "linear_forward");
  const Gemm g{CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, t, t, K, K, N,
               bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT};
  lt_matmul(g, W, x, y, 1.f, 0.f, bias, s);
}

// dx '=' in dt (beta 0); dW '+=' (beta_dW 1) or '=' (0) in fp32 inside the GEMM; db '+=' fp32.
// The three need dy, x and W, not each other. In a graph capture of at most kOneChunkRows rows
// (a small step's thin GEMMs, a few microseconds of latency each, and a db that takes no
// scratch) the first of them stays on s and the others go on a side branch, so a replay runs
// them side by side instead of one after another (SideBranch; 0.31 -> 0.30 ms for the small
// train step on an H200). The kernels and their inputs are the same, so the bits are too.
void linear_backward(const void* x, const void* W, const void* dy, void* dx, float* dW,
                     float beta_dW, float* db, int64_t M, int64_t N, int64_t K, DType dt,
                     cudaStream_t s) {
  check_shape("linear_backward", M, N, K);
  const cudaDataType_t t = cuda_type(dt, "linear_backward");
  if (M == 0) {  // an empty batch contributes nothing; a fresh dW is all zeros
    if (dW != nullptr && beta_dW == 0.f)
      MT_CUDA_CHECK(cudaMemsetAsync(dW, 0, size_t(N) * K * sizeof(float), s));
    return;
  }
  // Worth a branch when both sides have work: dx beside dW or db, or dW beside db.
  const bool two_sides =
      dx != nullptr ? dW != nullptr || db != nullptr : dW != nullptr && db != nullptr;
  SideBranch branch(s, M <= kOneChunkRows && two_sides);
  if (dx != nullptr) {
    const Gemm g{CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, t, t, K, N, K, CUBLASLT_EPILOGUE_DEFAULT};
    lt_matmul(g, W, dy, dx, 1.f, 0.f, nullptr, s);
  }
  if (dW != nullptr) {
    const Gemm g{CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, t, CUDA_R_32F, K, N, K, CUBLASLT_EPILOGUE_DEFAULT};
    const cudaStream_t on = dx != nullptr ? branch.stream() : s;  // the branch, if dx took s
    lt_matmul(g, x, dy, dW, 1.f, beta_dW, nullptr, on);
  }
  if (db != nullptr) bias_grad(dy, db, M, N, dt, branch.stream());
  branch.join();
}

// cuBLASLt's GELU epilogues keep the pre-activation as an aux matrix whose leading dimension (the
// hidden width) must be a multiple of 8 (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD).
bool gelu_epilogue_fits(int64_t hidden, DType dt) {
  return hidden % 8 == 0 && (dt == DType::f32 || dt == DType::bf16 || dt == DType::f16);
}

// y^T = W · x^T as in the forward above, with GELU_AUX_BIAS (GELU_AUX without a bias): cuBLASLt
// adds the bias to the fp32 accumulator, writes that as pre (the aux matrix, ld N) and GELU of it
// as h, each rounded once to dt.
void linear_gelu_forward(const void* x, const void* W, const void* bias, void* h, void* pre,
                         int64_t M, int64_t N, int64_t K, DType dt, cudaStream_t s) {
  check_shape("linear_gelu_forward", M, N, K);
  MT_CHECK(gelu_epilogue_fits(N, dt), "linear_gelu_forward: ", N, " features in ",
           dtype_name(dt), " do not fit cuBLASLt's GELU epilogue (a multiple of 8, f32/bf16/f16)");
  if (M == 0) return;
  const cudaDataType_t t = cuda_type(dt, "linear_gelu_forward");
  const Gemm g{CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, t, t, K, K, N,
               bias != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, N};
  lt_matmul(g, W, x, h, 1.f, 0.f, bias, s, pre);
}

// dx^T = W^T · dy^T as in linear_backward, with DGELU: cuBLASLt multiplies the fp32 accumulator by
// GELU's derivative at pre (the aux matrix, ld K) before the one rounding to dt.
void linear_dgelu_backward(const void* W, const void* dy, const void* pre, void* dpre, int64_t M,
                           int64_t N, int64_t K, DType dt, cudaStream_t s) {
  check_shape("linear_dgelu_backward", M, N, K);
  MT_CHECK(gelu_epilogue_fits(K, dt), "linear_dgelu_backward: ", K, " features in ",
           dtype_name(dt), " do not fit cuBLASLt's GELU epilogue (a multiple of 8, f32/bf16/f16)");
  if (M == 0) return;
  const cudaDataType_t t = cuda_type(dt, "linear_dgelu_backward");
  const Gemm g{CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, t, t, K, N, K, CUBLASLT_EPILOGUE_DGELU, K};
  lt_matmul(g, W, dy, dpre, 1.f, 0.f, nullptr, s, pre);
}

}  // namespace mt::cuda

// ---- Tensor-level kernels registered for linear on CUDA -----------------------------------
// (The Function, its checks and the mixed-precision choice of W are in linear.cpp.)
namespace mt {
namespace {

// b is the fp32 bias, or already x's 16-bit dtype (the Linear's compute copy).
void linear_forward_cuda(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& y) {
  if (b.defined() && b.dtype() == x.dtype() && x.dtype() != DType::f32) {
    cuda::linear_forward_dt_bias(x.data_ptr(), W.data_ptr(), b.data_ptr(), y.data_ptr(),
                                 x.size(0), W.size(0), x.size(1), x.dtype(), cuda::stream_of(x));
    return;
  }
  MT_CHECK(!b.defined() || b.dtype() == DType::f32, "linear: the CUDA bias must be f32 or x's "
           "dtype, got ", dtype_name(b.dtype()));
  cuda::linear_forward(x.data_ptr(), W.data_ptr(), cuda::ptr<const float>(b), y.data_ptr(),
                       x.size(0), W.size(0), x.size(1), x.dtype(), cuda::stream_of(x));
}

// dx '=' in x's dtype; dW and db are always added into (beta = 1, fp32): they are the leaves'
// .grad sinks, or fresh zeros.
void linear_backward_cuda(const Tensor& x, const Tensor& W, const Tensor& dy, const Tensor& dx,
                          const Tensor& dW, const Tensor& db) {
  cuda::linear_backward(x.data_ptr(), W.data_ptr(), dy.data_ptr(), cuda::ptr(dx),
                        cuda::ptr<float>(dW), 1.0f, cuda::ptr<float>(db), x.size(0), W.size(0),
                        x.size(1), x.dtype(), cuda::stream_of(x));
}

}  // namespace

MT_REGISTER_KERNEL(linear, Forward, CUDA, linear_forward_cuda);
MT_REGISTER_KERNEL(linear, Backward, CUDA, linear_backward_cuda);

}  // namespace mt
