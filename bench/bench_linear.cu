// bench_linear: the linear launchers against bare cuBLAS, and the fused AdamW against the
// device's copy bandwidth, measured in the same run (docs/kernels.md, the method).
//
//   linear, bf16, x[32768, 8192] · W[8192, 8192]^T: forward, dx, dW (fp32, beta 1) through
//   mt::cuda::linear_* vs cublasGemmEx of the same three shapes. TFLOP/s = 2·M·N·K / time.
//   Target: each within 5% of cuBLAS. The (+bias) rows compare against cuBLAS without a bias:
//   their ratio is what the bias / db costs.
//   A spot check recomputes 32 entries of each output with an fp64 dot product on the device.
//
//   GELU in the epilogue (gelu_mlp), at GPT-2 124M's MLP shapes for 16 × 1024 tokens: c_fc's
//   forward with GELU_AUX_BIAS (pre and h written by the GEMM) against the bias GEMM followed by
//   gelu's own kernel, and mlp.c_proj's dx with DGELU against the dx GEMM followed by gelu's
//   backward kernel. Each pair computes the same h and dpre (checked first, normwise within two
//   bf16 roundings); the difference in time is what fusing saves a layer.
//
//   AdamW on ~100M fp32 params (50 tensors of 2M and 50 of 4099), bf16 copy refreshed:
//   bytes = 16 read (p, g, m, v) + 12 written (p, m, v) + 2 written (lowp) per param, over the
//   cudaMemcpy device-to-device bandwidth (2 bytes moved per byte copied). One step is checked
//   against the update rule computed on the host for a few elements.
//
// Every time is the median of 15 runs after 3 warm-ups, cudaEvents on the framework stream; the
// two sides of a comparison alternate run by run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <cuda_bf16.h>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/switches.h"
#include "ops/gelu/gelu_cuda.h"
#include "ops/linear/linear_cuda.h"
#include "optim/adamw_cuda.h"

namespace {

using bf16 = __nv_bfloat16;

// ---- inputs -------------------------------------------------------------------------------------

__device__ uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27; x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// p[i] = lo + (hi - lo) * u(seed, i), u uniform in [0, 1) from a hash: reproducible, non-zero.
template <class T>
__global__ void random_fill(T* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float u = float(mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i)) >> 40) * 0x1p-24f;
    p[i] = T(lo + (hi - lo) * u);
  }
}

template <class T>
void randomize(T* p, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s) {
  random_fill<T><<<2048, 256, 0, s>>>(p, n, seed, lo, hi);
  MT_CUDA_CHECK_LAUNCH();
}

template <class T>
T* device_alloc(int64_t n) {
  void* p = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&p, size_t(n) * sizeof(T)));
  return static_cast<T*>(p);
}

// ---- spot check ---------------------------------------------------------------------------------

// ref[s] = sum_t A[a_off[s] + t·a_stride] · B[b_off[s] + t·b_stride] in fp64 (B == nullptr: 1),
// absdot[s] = the same over |products|, the scale a rounding error is measured against.
__global__ void dot_check(const bf16* A, int64_t a_stride, const int64_t* a_off, const bf16* B,
                          int64_t b_stride, const int64_t* b_off, int64_t len, double* ref,
                          double* absdot) {
  __shared__ double sum[256], abs_sum[256];
  double acc = 0, acc_abs = 0;
  for (int64_t t = threadIdx.x; t < len; t += blockDim.x) {
    const double a = __bfloat162float(A[a_off[blockIdx.x] + t * a_stride]);
    const double b = B ? double(__bfloat162float(B[b_off[blockIdx.x] + t * b_stride])) : 1.0;
    acc += a * b;
    acc_abs += fabs(a * b);
  }
  sum[threadIdx.x] = acc, abs_sum[threadIdx.x] = acc_abs;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < blockDim.x; ++i) acc += sum[i], acc_abs += abs_sum[i];
    ref[blockIdx.x] = acc, absdot[blockIdx.x] = acc_abs;
  }
}

constexpr int kSamples = 32;

struct Check {
  std::vector<int64_t> a_off, b_off, out_idx;
  std::vector<double> extra;  // added to the reference (the bias), per sample
};

float value_at(const void* p, int64_t i, bool is_bf16) {
  if (is_bf16) {
    bf16 h;
    MT_CUDA_CHECK(cudaMemcpy(&h, static_cast<const bf16*>(p) + i, 2, cudaMemcpyDeviceToHost));
    return __bfloat162float(h);
  }
  float f;
  MT_CUDA_CHECK(cudaMemcpy(&f, static_cast<const float*>(p) + i, 4, cudaMemcpyDeviceToHost));
  return f;
}

// Max over samples of |ours - ref| / absdot.
double spot_error(const bf16* A, int64_t a_stride, const bf16* B, int64_t b_stride, int64_t len,
                  const Check& c, const void* out, bool out_bf16) {
  int64_t* d_off = device_alloc<int64_t>(2 * kSamples);
  double* d_res = device_alloc<double>(2 * kSamples);
  MT_CUDA_CHECK(cudaMemcpy(d_off, c.a_off.data(), kSamples * 8, cudaMemcpyHostToDevice));
  MT_CUDA_CHECK(cudaMemcpy(d_off + kSamples, c.b_off.data(), kSamples * 8, cudaMemcpyHostToDevice));
  dot_check<<<kSamples, 256>>>(A, a_stride, d_off, B, b_stride, d_off + kSamples, len, d_res,
                               d_res + kSamples);
  MT_CUDA_CHECK_LAUNCH();
  std::vector<double> res(2 * kSamples);
  MT_CUDA_CHECK(cudaMemcpy(res.data(), d_res, res.size() * 8, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int s = 0; s < kSamples; ++s) {
    const double ref = res[s] + c.extra[s];
    const double err = std::fabs(value_at(out, c.out_idx[s], out_bf16) - ref) /
                       (res[kSamples + s] + std::fabs(c.extra[s]) + 1e-30);
    worst = std::max(worst, err);
  }
  MT_CUDA_CHECK(cudaFree(d_off));
  MT_CUDA_CHECK(cudaFree(d_res));
  return worst;
}

// ---- timing -------------------------------------------------------------------------------------

template <class F>
double time_ms(cudaStream_t s, cudaEvent_t start, cudaEvent_t stop, F&& f) {
  MT_CUDA_CHECK(cudaEventRecord(start, s));
  f();
  MT_CUDA_CHECK(cudaEventRecord(stop, s));
  MT_CUDA_CHECK(cudaEventSynchronize(stop));
  float t = 0;
  MT_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Medians of a and b, run alternately so that both see the same clocks (a GPU near its power
// limit slows down over seconds; timing one after the other would charge that to whichever ran
// second).
template <class A, class B>
std::pair<double, double> median_ms_pair(cudaStream_t s, A&& a, B&& b) {
  cudaEvent_t start, stop;
  MT_CUDA_CHECK(cudaEventCreate(&start));
  MT_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) a(), b();
  std::vector<double> ta, tb;
  for (int i = 0; i < 15; ++i) {
    ta.push_back(time_ms(s, start, stop, a));
    tb.push_back(time_ms(s, start, stop, b));
  }
  MT_CUDA_CHECK(cudaEventDestroy(start));
  MT_CUDA_CHECK(cudaEventDestroy(stop));
  return {median(ta), median(tb)};
}

template <class F>
double median_ms(cudaStream_t s, F&& f) {
  return median_ms_pair(s, f, [] {}).first;
}

// ---- linear -------------------------------------------------------------------------------------

bool bench_linear(cudaStream_t s) {
  const int64_t M = 32768, N = 8192, K = 8192;
  const double flop = 2.0 * M * N * K;
  bf16 *x = device_alloc<bf16>(M * K), *W = device_alloc<bf16>(N * K), *dy = device_alloc<bf16>(M * N);
  bf16 *y = device_alloc<bf16>(M * N), *dx = device_alloc<bf16>(M * K);
  float *dW = device_alloc<float>(N * K), *bias = device_alloc<float>(N), *db = device_alloc<float>(N);
  randomize(x, M * K, 1, -1.f, 1.f, s);
  randomize(W, N * K, 2, -1.f, 1.f, s);
  randomize(dy, M * N, 3, -1.f, 1.f, s);
  randomize(bias, N, 4, -1.f, 1.f, s);
  MT_CUDA_CHECK(cudaMemsetAsync(db, 0, N * sizeof(float), s));

  // Correctness first: one call of each, checked against fp64 dot products.
  mt::cuda::linear_forward(x, W, bias, y, M, N, K, mt::DType::bf16, s);
  mt::cuda::linear_backward(x, W, dy, dx, dW, 0.f, db, M, N, K, mt::DType::bf16, s);
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> h_bias(N);
  MT_CUDA_CHECK(cudaMemcpy(h_bias.data(), bias, N * 4, cudaMemcpyDeviceToHost));
  Check cy, cdx, cdw, cdb;
  uint64_t state = 12345;
  auto next = [&](int64_t mod) { state = state * 6364136223846793005ull + 1442695040888963407ull; return int64_t((state >> 33) % uint64_t(mod)); };
  for (int i = 0; i < kSamples; ++i) {
    const int64_t m = next(M), n = next(N), k = next(K);
    cy.a_off.push_back(m * K), cy.b_off.push_back(n * K), cy.out_idx.push_back(m * N + n), cy.extra.push_back(h_bias[n]);
    cdx.a_off.push_back(m * N), cdx.b_off.push_back(k), cdx.out_idx.push_back(m * K + k), cdx.extra.push_back(0);
    cdw.a_off.push_back(n), cdw.b_off.push_back(k), cdw.out_idx.push_back(n * K + k), cdw.extra.push_back(0);
    cdb.a_off.push_back(n), cdb.b_off.push_back(0), cdb.out_idx.push_back(n), cdb.extra.push_back(0);
  }
  const double err_y = spot_error(x, 1, W, 1, K, cy, y, true);
  const double err_dx = spot_error(dy, 1, W, K, N, cdx, dx, true);
  const double err_dw = spot_error(dy, N, x, K, M, cdw, dW, false);
  const double err_db = spot_error(dy, N, nullptr, 0, M, cdb, db, false);
  // bf16 outputs carry one bf16 rounding (at most 2^-8 relative) of a value at most absdot; the
  // fp32 outputs only fp32 summation error.
  const bool ok = err_y < 1e-2 && err_dx < 1e-2 && err_dw < 1e-4 && err_db < 1e-4;
  std::printf("linear spot check (max |ours - fp64| / sum|a*b|): y %.2e  dx %.2e  dW %.2e  db %.2e  %s\n",
              err_y, err_dx, err_dw, err_db, ok ? "ok" : "FAILED");

  cublasHandle_t h = mt::cuda::cublas(0);  // bound to the framework stream; made sure below
  cudaStream_t hs = nullptr;
  MT_CUBLAS_CHECK(cublasGetStream(h, &hs));
  if (hs != s) MT_CUBLAS_CHECK(cublasSetStream(h, s));
  const float one = 1.f, zero = 0.f;
  auto gemm = [&](cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                  const void* A, int64_t lda, const void* B, int64_t ldb, const float* beta, void* C,
                  cudaDataType_t ct, int64_t ldc) {
    MT_CUBLAS_CHECK(cublasGemmEx(h, ta, tb, int(m), int(n), int(k), &one, A, CUDA_R_16BF, int(lda), B,
                                 CUDA_R_16BF, int(ldb), beta, C, ct, int(ldc), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
  };
  using mt::DType;
  auto ours_fwd = [&](const float* b) { mt::cuda::linear_forward(x, W, b, y, M, N, K, DType::bf16, s); };
  auto ours_bwd = [&](void* dx_, float* dW_, float* db_) {
    mt::cuda::linear_backward(x, W, dy, dx_, dW_, 1.f, db_, M, N, K, DType::bf16, s);
  };
  auto ref_fwd = [&] { gemm(CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, W, K, x, K, &zero, y, CUDA_R_16BF, N); };
  auto ref_dx = [&] { gemm(CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, W, K, dy, N, &zero, dx, CUDA_R_16BF, K); };
  auto ref_dw = [&] { gemm(CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, x, K, dy, N, &one, dW, CUDA_R_32F, K); };
  auto ref_bwd = [&] { ref_dx(), ref_dw(); };
  const auto [fwd, fwd_ref] = median_ms_pair(s, [&] { ours_fwd(nullptr); }, ref_fwd);
  const auto [bdx, bdx_ref] = median_ms_pair(s, [&] { ours_bwd(dx, nullptr, nullptr); }, ref_dx);
  const auto [bdw, bdw_ref] = median_ms_pair(s, [&] { ours_bwd(nullptr, dW, nullptr); }, ref_dw);
  const auto [bwd, bwd_ref] = median_ms_pair(s, [&] { ours_bwd(dx, dW, nullptr); }, ref_bwd);
  const auto [fwd_b, fwd_b_ref] = median_ms_pair(s, [&] { ours_fwd(bias); }, ref_fwd);
  const auto [bwd_b, bwd_b_ref] = median_ms_pair(s, [&] { ours_bwd(dx, dW, db); }, ref_bwd);

  auto tf = [&](double ms, double f) { return f / (ms * 1e-3) / 1e12; };
  std::printf("\n%-34s %9s %9s %11s %11s %7s\n", "linear bf16 M=32768 N=8192 K=8192", "ms", "TFLOP/s",
              "cuBLAS ms", "cuBLAS TF/s", "ratio");
  auto row = [&](const char* name, double ms, double ref_ms, double f) {
    std::printf("%-34s %9.3f %9.1f %11.3f %11.1f %7.3f\n", name, ms, tf(ms, f), ref_ms, tf(ref_ms, f), ref_ms / ms);
  };
  row("forward  y = x W^T", fwd, fwd_ref, flop);
  row("backward dx = dy W", bdx, bdx_ref, flop);
  row("backward dW += dy^T x (fp32)", bdw, bdw_ref, flop);
  row("backward dx + dW", bwd, bwd_ref, 2 * flop);
  row("forward  (+bias) vs no bias", fwd_b, fwd_b_ref, flop);
  row("backward dx + dW (+db) vs no db", bwd_b, bwd_b_ref, 2 * flop);
  const double r_fwd = fwd_ref / fwd, r_bwd = bwd_ref / bwd;
  const bool fast = r_fwd >= 0.95 && r_bwd >= 0.95;
  std::printf("linear: forward %.3fx, backward %.3fx of cuBLAS (target >= 0.95): %s\n", r_fwd, r_bwd,
              fast ? "met" : "MISSED");

  for (void* p : {(void*)x, (void*)W, (void*)dy, (void*)y, (void*)dx, (void*)dW, (void*)bias, (void*)db})
    MT_CUDA_CHECK(cudaFree(p));
  return ok;
}

// ---- GELU in the epilogue --------------------------------------------------------------------------

// max |a - b| / max |b| over n bf16 elements on the device.
double normwise_error(const bf16* a, const bf16* b, int64_t n) {
  std::vector<bf16> ha(n), hb(n);
  MT_CUDA_CHECK(cudaMemcpy(ha.data(), a, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  MT_CUDA_CHECK(cudaMemcpy(hb.data(), b, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  double err = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = __bfloat162float(ha[i]), y = __bfloat162float(hb[i]);
    err = std::max(err, std::abs(x - y));
    scale = std::max(scale, std::abs(y));
  }
  return err / scale;
}

bool bench_gelu_epilogue(cudaStream_t s) {
  const int64_t M = 16384, C = 768, H = 4 * C;
  using mt::DType;
  bf16 *x = device_alloc<bf16>(M * C), *W1 = device_alloc<bf16>(H * C), *b1 = device_alloc<bf16>(H);
  bf16 *pre = device_alloc<bf16>(M * H), *h = device_alloc<bf16>(M * H), *g = device_alloc<bf16>(M * H);
  bf16* dpre = device_alloc<bf16>(M * H);
  bf16 *W2 = device_alloc<bf16>(C * H), *dy = device_alloc<bf16>(M * C);
  randomize(x, M * C, 5, -1.f, 1.f, s);
  randomize(W1, H * C, 6, -0.05f, 0.05f, s);
  randomize(b1, H, 7, -0.5f, 0.5f, s);
  randomize(W2, C * H, 8, -0.05f, 0.05f, s);
  randomize(dy, M * C, 9, -1.f, 1.f, s);
  // The same results both ways: h from the fused forward against the split one, then dpre.
  bf16 *h_split = device_alloc<bf16>(M * H), *dpre_split = device_alloc<bf16>(M * H);
  mt::cuda::linear_forward_dt_bias(x, W1, b1, pre, M, H, C, DType::bf16, s);
  mt::cuda::gelu_forward(pre, h_split, M * H, true, DType::bf16, s);
  mt::cuda::linear_backward(h_split, W2, dy, g, nullptr, 0.f, nullptr, M, C, H, DType::bf16, s);
  mt::cuda::gelu_backward(pre, g, dpre_split, M * H, true, DType::bf16, s);
  mt::cuda::linear_gelu_forward(x, W1, b1, h, pre, M, H, C, DType::bf16, s);
  mt::cuda::linear_dgelu_backward(W2, dy, pre, dpre, M, C, H, DType::bf16, s);
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  const double err_h = normwise_error(h, h_split, M * H), err_d = normwise_error(dpre, dpre_split, M * H);
  const bool ok = err_h < 0x1p-7 && err_d < 0x1p-7;
  std::printf("\ngelu epilogue check (fused against split, normwise): h %.2e  dpre %.2e  %s\n", err_h,
              err_d, ok ? "ok" : "FAILED");
  MT_CUDA_CHECK(cudaFree(h_split));
  MT_CUDA_CHECK(cudaFree(dpre_split));
  // Each pair with cuBLASLt's first heuristic candidate (the default), then with the algorithms
  // timed (gemm_autotune, for both sides): the epilogue kernels are where the two differ most.
  for (bool timed : {false, true}) {
    mt::set_gemm_autotune(timed);
    const auto [fwd_fused, fwd_split] = median_ms_pair(
        s, [&] { mt::cuda::linear_gelu_forward(x, W1, b1, h, pre, M, H, C, DType::bf16, s); },
        [&] {
          mt::cuda::linear_forward_dt_bias(x, W1, b1, pre, M, H, C, DType::bf16, s);
          mt::cuda::gelu_forward(pre, h, M * H, true, DType::bf16, s);
        });
    const auto [bwd_fused, bwd_split] = median_ms_pair(
        s, [&] { mt::cuda::linear_dgelu_backward(W2, dy, pre, dpre, M, C, H, DType::bf16, s); },
        [&] {
          mt::cuda::linear_backward(h, W2, dy, g, nullptr, 0.f, nullptr, M, C, H, DType::bf16, s);
          mt::cuda::gelu_backward(pre, g, dpre, M * H, true, DType::bf16, s);
        });
    const char* how = timed ? "timed" : "heuristic";
    std::printf("\n%-52s %9s %9s %9s\n",
                (std::string("GELU in the epilogue, bf16, M=16384 C=768 H=3072, ") + how).c_str(),
                "fused ms", "split ms", "saved us");
    std::printf("%-52s %9.3f %9.3f %9.1f\n", "c_fc forward (GELU_AUX_BIAS | bias GEMM + gelu)",
                fwd_fused, fwd_split, 1e3 * (fwd_split - fwd_fused));
    std::printf("%-52s %9.3f %9.3f %9.1f\n", "mlp.c_proj dx (DGELU | dx GEMM + gelu backward)",
                bwd_fused, bwd_split, 1e3 * (bwd_split - bwd_fused));
    std::printf("gelu epilogue, %s algorithms: %.1f us saved a layer (forward %.1f, backward %.1f)\n",
                how, 1e3 * (fwd_split - fwd_fused + bwd_split - bwd_fused),
                1e3 * (fwd_split - fwd_fused), 1e3 * (bwd_split - bwd_fused));
  }
  mt::set_gemm_autotune(false);
  for (void* p : {(void*)x, (void*)W1, (void*)b1, (void*)pre, (void*)h, (void*)g, (void*)dpre, (void*)W2, (void*)dy})
    MT_CUDA_CHECK(cudaFree(p));
  return ok;
}

// ---- AdamW --------------------------------------------------------------------------------------

bool bench_adamw(cudaStream_t s) {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 50; ++i) sizes.push_back(2000000), sizes.push_back(4099);
  std::vector<int64_t> offset;  // each tensor starts 256-byte aligned inside one big buffer
  int64_t total = 0, n_params = 0;
  for (int64_t n : sizes) offset.push_back(total), total += (n + 63) / 64 * 64, n_params += n;
  float *p = device_alloc<float>(total), *g = device_alloc<float>(total);
  float *m = device_alloc<float>(total), *v = device_alloc<float>(total);
  bf16* lowp = device_alloc<bf16>(total);
  float *scale = device_alloc<float>(1), *norm_sq = device_alloc<float>(1);

  // Copy bandwidth first, while p and g hold nothing we need.
  const size_t copy_bytes = size_t(total) * sizeof(float);
  const double copy_ms = median_ms(s, [&] {
    MT_CUDA_CHECK(cudaMemcpyAsync(g, p, copy_bytes, cudaMemcpyDeviceToDevice, s));
  });
  const double copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;

  randomize(p, total, 5, -1.f, 1.f, s);
  randomize(g, total, 6, -1.f, 1.f, s);
  randomize(m, total, 7, -0.1f, 0.1f, s);
  randomize(v, total, 8, 0.f, 0.01f, s);
  randomize(scale, 1, 9, 0.5f, 0.5f, s);  // a grad scale of exactly 0.5

  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  const float bc1 = 1.f - b1, bc2 = 1.f - b2;  // step 1
  float* hyper = device_alloc<float>(3);
  const float hyper_host[3] = {lr, bc1, bc2};
  mt::cuda::write_floats(hyper, hyper_host, 3, s);
  std::vector<mt::cuda::AdamWTensor> tensors;
  std::vector<const float*> grads;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t o = offset[i];
    tensors.push_back({p + o, g + o, m + o, v + o, lowp + o, hyper, sizes[i], i % 2 ? 0.f : 0.1f});
    grads.push_back(g + o);
  }
  auto step = [&] {
    mt::cuda::adamw_step(tensors.data(), int(tensors.size()), b1, b2, eps, scale,
                         mt::DType::bf16, s);
  };

  // One step checked on the host, at the start, middle and end of a large and a small tensor.
  const int64_t probes[] = {0, 1, 999999, 1999999, offset[1], offset[1] + 2050, offset[1] + 4098};
  struct State { float p, g, m, v; };
  std::vector<State> before;
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  for (int64_t i : probes)
    before.push_back({value_at(p, i, false), value_at(g, i, false), value_at(m, i, false), value_at(v, i, false)});
  step();
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  double worst = 0, worst_lowp = 0;
  for (size_t k = 0; k < before.size(); ++k) {
    const State b = before[k];
    const float wd = probes[k] < offset[1] ? 0.1f : 0.f;
    const double gg = double(b.g) * 0.5;
    const double mm = b1 * double(b.m) + (1 - double(b1)) * gg;
    const double vv = b2 * double(b.v) + (1 - double(b2)) * gg * gg;
    const double update = lr * (mm / bc1) / (std::sqrt(vv / bc2) + eps);
    const double pp = double(b.p) * (1 - double(lr) * wd) - update;
    const double got_p = value_at(p, probes[k], false);
    // Errors relative to the size of the terms that were combined.
    worst = std::max({worst, std::fabs(got_p - pp) / (std::fabs(b.p) + std::fabs(update)),
                      std::fabs(value_at(m, probes[k], false) - mm) / (std::fabs(b.m) + std::fabs(gg)),
                      std::fabs(value_at(v, probes[k], false) - vv) / (b.v + gg * gg + 1e-30)});
    worst_lowp = std::max(worst_lowp, std::fabs(value_at(lowp, probes[k], true) - got_p) / (std::fabs(got_p) + 1e-30));
  }
  // fp32 arithmetic: a few ulps; the bf16 copy: one rounding, at most 2^-8 relative.
  const bool ok = worst < 1e-5 && worst_lowp <= 0x1p-8;
  std::printf("\nadamw check vs fp64 host update (%zu probes): p/m/v %.2e, bf16 copy %.2e  %s\n",
              before.size(), worst, worst_lowp, ok ? "ok" : "FAILED");

  const double adamw_ms = median_ms(s, step);
  const double adamw_bytes = double(n_params) * (16 + 12 + 2);
  const double adamw_gbs = adamw_bytes / (adamw_ms * 1e-3) / 1e9;
  const double norm_ms = median_ms(s, [&] {
    mt::cuda::grad_norm_sq(grads.data(), sizes.data(), int(sizes.size()), norm_sq, s);
  });
  const double norm_gbs = double(n_params) * 4 / (norm_ms * 1e-3) / 1e9;

  std::printf("\n%-40s %9s %10s %9s %9s\n", "fp32 params = 100.2M (100 tensors)", "ms", "GB moved", "GB/s",
              "of copy");
  std::printf("%-40s %9.3f %10.3f %9.0f %9s\n", "cudaMemcpy device-to-device", copy_ms, 2.0 * copy_bytes / 1e9,
              copy_gbs, "1.000");
  std::printf("%-40s %9.3f %10.3f %9.0f %9.3f\n", "adamw_step (p,g,m,v -> p,m,v,bf16)", adamw_ms,
              adamw_bytes / 1e9, adamw_gbs, adamw_gbs / copy_gbs);
  std::printf("%-40s %9.3f %10.3f %9.0f %9.3f\n", "grad_norm_sq (g)", norm_ms, n_params * 4 / 1e9, norm_gbs,
              norm_gbs / copy_gbs);
  std::printf("adamw: %.3f ms per step for %.1fM params, %.0f%% of copy bandwidth\n", adamw_ms,
              n_params / 1e6, 100 * adamw_gbs / copy_gbs);

  for (void* ptr : {(void*)p, (void*)g, (void*)m, (void*)v, (void*)lowp, (void*)scale, (void*)norm_sq, (void*)hyper})
    MT_CUDA_CHECK(cudaFree(ptr));
  return ok;
}

}  // namespace

int main() {
  try {
    if (!mt::cuda::available()) {
      std::printf("bench_linear: no CUDA device\n");
      return 0;
    }
    mt::cuda::set_device(0);
    cudaStream_t s = mt::cuda::stream(0);
    cudaDeviceProp prop{};
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s (%d SMs)\n\n", prop.name, prop.multiProcessorCount);
    const bool ok_linear = bench_linear(s);
    const bool ok_gelu = bench_gelu_epilogue(s);
    const bool ok_adamw = bench_adamw(s);
    return ok_linear && ok_gelu && ok_adamw ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_linear: %s\n", e.what());
    return 1;
  }
}
