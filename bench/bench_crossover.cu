// The save-vs-recompute crossover, measured on this GPU (docs/crossover.html shows the same
// arithmetic with sliders). Measures, in one run:
//   copy bandwidth   a device-to-device copy of 2 GiB (bytes read + written), median of 10
//   fp32 FMA rate    a kernel of independent FMA chains in registers, every SM busy, median of 10
//   bf16 rate        an 8192³ bf16 cuBLAS GEMM with fp32 accumulation, median of 10
// then prints the balance points and the crossover for saving a 4-byte (fp32) and a 2-byte
// (bf16) value, with the formula of bench/crossover.h (saving moves the value twice: written,
// then read back). The lesson's H100 figure is about 585 flops per element for a 4-byte round
// trip (a 2-byte value; bf16 tensor-core rate against HBM3 bandwidth).
#include <algorithm>
#include <cstdio>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench/crossover.h"
#include "core/cuda/check.h"

namespace {

constexpr int kChains = 8;      // independent FMA chains per thread, to hide the FMA latency
constexpr int kIters = 1 << 14;

__global__ void fma_kernel(float* sink, float a, float b) {
  float x[kChains];
#pragma unroll
  for (int k = 0; k < kChains; ++k) x[k] = float(threadIdx.x + k);
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int k = 0; k < kChains; ++k) x[k] = fmaf(x[k], a, b);
  float s = 0;
#pragma unroll
  for (int k = 0; k < kChains; ++k) s += x[k];
  if (s == 1234.5f) *sink = s;  // never true: keeps the compiler from deleting the work
}

__global__ void fill_bf16(__nv_bfloat16* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(float((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
}

template <class F>
double median_ms(F&& launch, int reps = 10) {
  cudaEvent_t a, b;
  MT_CUDA_CHECK(cudaEventCreate(&a));
  MT_CUDA_CHECK(cudaEventCreate(&b));
  launch();  // warm-up
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    MT_CUDA_CHECK(cudaEventRecord(a));
    launch();
    MT_CUDA_CHECK(cudaEventRecord(b));
    MT_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main() {
  try {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      std::fprintf(stderr, "bench_crossover: no CUDA device (use the `crossover` program with "
                           "rates as arguments)\n");
      return 1;
    }
    cudaDeviceProp prop{};
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

    const size_t copy_bytes = size_t(2) << 30;
    void *src = nullptr, *dst = nullptr;
    MT_CUDA_CHECK(cudaMalloc(&src, copy_bytes));
    MT_CUDA_CHECK(cudaMalloc(&dst, copy_bytes));
    MT_CUDA_CHECK(cudaMemset(src, 1, copy_bytes));
    const double copy_ms = median_ms([&] {
      MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice));
    });
    const double bandwidth_gbs = 2.0 * double(copy_bytes) / (copy_ms * 1e-3) / 1e9;

    float* sink = nullptr;
    MT_CUDA_CHECK(cudaMalloc(&sink, sizeof(float)));
    const int threads = 256, blocks = prop.multiProcessorCount * 8;
    const double fma_ms = median_ms([&] {
      fma_kernel<<<blocks, threads>>>(sink, 0.9999f, 0.0001f);
      MT_CUDA_CHECK_LAUNCH();
    });
    const double fp32_tflops = 2.0 * kChains * kIters * double(blocks) * threads / (fma_ms * 1e-3) / 1e12;

    const int n = 8192;
    __nv_bfloat16 *A = nullptr, *B = nullptr, *C = nullptr;
    MT_CUDA_CHECK(cudaMalloc(&A, size_t(n) * n * 2));
    MT_CUDA_CHECK(cudaMalloc(&B, size_t(n) * n * 2));
    MT_CUDA_CHECK(cudaMalloc(&C, size_t(n) * n * 2));
    fill_bf16<<<1024, 256>>>(A, size_t(n) * n);
    fill_bf16<<<1024, 256>>>(B, size_t(n) * n);
    MT_CUDA_CHECK_LAUNCH();
    cublasHandle_t h;
    MT_CUBLAS_CHECK(cublasCreate(&h));
    const float one = 1, zero = 0;
    const double gemm_ms = median_ms([&] {
      MT_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, B,
                                   CUDA_R_16BF, n, &zero, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    });
    const double bf16_tflops = 2.0 * double(n) * n * n / (gemm_ms * 1e-3) / 1e12;

    using namespace mt::crossover;
    std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
    std::printf("measured: copy %.0f GB/s (read + write), fp32 FMA %.1f TFLOP/s, bf16 GEMM %.1f TFLOP/s\n",
                bandwidth_gbs, fp32_tflops, bf16_tflops);
    std::printf("balance: fp32 %.1f flops/byte, bf16 %.1f flops/byte\n",
                balance_flops_per_byte(fp32_tflops, bandwidth_gbs),
                balance_flops_per_byte(bf16_tflops, bandwidth_gbs));
    for (double bytes : {4.0, 2.0})
      std::printf("crossover for a %.0f-byte value (%.0f-byte round trip): %.1f flops/element at "
                  "the fp32 rate, %.1f at the bf16 rate (the lesson's H100: ~585 for a 4-byte round "
                  "trip)\n",
                  bytes, round_trip_bytes(bytes),
                  crossover_flops_per_element(fp32_tflops, bandwidth_gbs, bytes),
                  crossover_flops_per_element(bf16_tflops, bandwidth_gbs, bytes));
    std::printf("e.g. scaled-SiLU's sigmoid (~20 flops/element, fp32 units): %s\n",
                choice_name(cheaper(20, crossover_flops_per_element(fp32_tflops, bandwidth_gbs, 4))));
    std::printf("crossover: run `crossover --bandwidth %.0f --fp32-tflops %.1f --bf16-tflops %.1f` "
                "for any width and recompute cost\n", bandwidth_gbs, fp32_tflops, bf16_tflops);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_crossover: %s\n", e.what());
    return 1;
  }
}
