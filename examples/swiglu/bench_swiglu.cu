// swiglu's kernels against the GPU's copy bandwidth, measured in the same run:
//
//   bench_swiglu        n = 2^28 elements of bf16 and of f16
//
// A map's floor is the bytes it moves (read + write) at the rate cudaMemcpy moves bytes device to
// device (also counted read + write): forward 3 tensors, backward 5. Each time is the median of
// 20 launches after 3 warm-ups, on the framework stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "core/cuda/runtime.h"
#include "minitrain.h"
#include "swiglu.h"

using namespace mt;

namespace {

double median_ms(cudaStream_t s, const std::function<void()>& f) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(start, s);
    f();
    cudaEventRecord(stop, s);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main() try {
  if (!cuda_available()) {
    std::printf("bench_swiglu: no CUDA device, nothing to measure\n");
    return 0;
  }
  const Device dev = cuda_device(0);
  const cudaStream_t s = cuda::stream(0);
  const int64_t n = int64_t(1) << 28;
  for (DType dt : {DType::bf16, DType::f16}) {
    const double bytes = double(n) * double(dtype_size(dt));
    Tensor a = randn({n}, dt, dev), b = randn({n}, dt, dev), dy = randn({n}, dt, dev);
    Tensor y = empty({n}, dt, dev), da = empty({n}, dt, dev), db = empty({n}, dt, dev);
    auto* fwd = kernel<swiglu_example::SwiGLUForwardFn>("swiglu", Phase::Forward, dev);
    auto* bwd = kernel<swiglu_example::SwiGLUBackwardFn>("swiglu", Phase::Backward, dev);
    const double copy_ms = median_ms(s, [&] {
      cudaMemcpyAsync(y.data_ptr(), a.data_ptr(), size_t(bytes), cudaMemcpyDeviceToDevice, s);
    });
    const double copy_gbs = 2 * bytes / copy_ms / 1e6;  // read + write
    const double fwd_ms = median_ms(s, [&] { fwd(a, b, y); });
    const double bwd_ms = median_ms(s, [&] { bwd(a, b, dy, da, db); });
    const double fwd_frac = 3 * bytes / fwd_ms / 1e6 / copy_gbs;
    const double bwd_frac = 5 * bytes / bwd_ms / 1e6 / copy_gbs;
    std::printf("bench_swiglu %s n=2^28: copy %.0f GB/s; forward %.3f ms = %.1f%% of copy, "
                "backward %.3f ms = %.1f%% of copy (target >= 90%%): %s\n",
                dtype_name(dt), copy_gbs, fwd_ms, 100 * fwd_frac, bwd_ms, 100 * bwd_frac,
                fwd_frac >= 0.9 && bwd_frac >= 0.9 ? "PASS" : "MISS");
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_swiglu: %s\n", e.what());
  return 1;
}
