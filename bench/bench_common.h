#pragma once
// What the whole-step benchmarks (train_step.cpp, gpt_step.cpp) share: CUDA-event timing, the
// device's own rates measured in the same run (the bare bf16 GEMM and the device copy), and the
// small text writers of their exports. Header-only: each bench/*.cpp is its own program.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace mt::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A start/stop pair of CUDA events, destroyed with the object.
class EventPair {
 public:
  EventPair() {
    MT_CUDA_CHECK(cudaEventCreate(&start_));
    MT_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventPair() {
    // Destructors must not throw; a failure here would be reported by the next checked call.
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;

  // Milliseconds between the events recorded around f() on stream s. The host waits for the
  // stop event, so the next call starts from an idle GPU.
  double time_ms(cudaStream_t s, const std::function<void()>& f) {
    MT_CUDA_CHECK(cudaEventRecord(start_, s));
    f();
    MT_CUDA_CHECK(cudaEventRecord(stop_, s));
    MT_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// f() run `warmup` times untimed, then `reps` times timed one by one on `device`'s framework
// stream: the times in ms.
inline std::vector<double> time_each(int device, int warmup, int reps, const std::function<void()>& f) {
  cudaStream_t s = cuda::stream(device);
  for (int i = 0; i < warmup; ++i) f();
  cuda::synchronize(device);
  EventPair events;
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) times.push_back(events.time_ms(s, f));
  return times;
}

// TFLOP/s of one n³ cublasGemmEx (bf16 A, B, C; fp32 compute) through the framework's handle,
// median of `reps`, on N(0, 1) data (constant or all-positive data toggles fewer bits, draws less
// power and would flatter the rate at the card's power limit).
inline double cublas_bf16_tflops(int device, int n = 8192, int reps = 10) {
  const Tensor a = mt::randn({n, n}, DType::bf16, cuda_device(device));
  const Tensor c = mt::empty({n, n}, DType::bf16, cuda_device(device));
  cublasHandle_t h = cuda::cublas(device);
  const float alpha = 1.f, beta = 0.f;
  // C = Aᵀ·A in cuBLAS's column-major view; the operands' values do not change the work.
  const double ms = median(time_each(device, 3, reps, [&] {
    MT_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a.data_ptr(),
                                 CUDA_R_16BF, n, a.data_ptr(), CUDA_R_16BF, n, &beta, c.data_ptr(),
                                 CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }));
  return 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3) / 1e12;
}

// TB/s of a device-to-device cudaMemcpy of 1 GiB, counting its read and its write (2 bytes moved
// per byte copied): the yardstick of every memory-bound op.
inline double copy_tbps(int device, int reps = 10) {
  const Tensor src = zeros({int64_t(1) << 28}, DType::f32, cuda_device(device));
  const Tensor dst = mt::empty({int64_t(1) << 28}, DType::f32, cuda_device(device));
  const size_t bytes = src.nbytes();
  cudaStream_t s = cuda::stream(device);
  const double ms = median(time_each(device, 3, reps, [&] {
    MT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToDevice, s));
  }));
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e12;
}

// Clipping as train/trainer.cpp does it with AdamW: the global norm and the clip factor into
// device scalars allocated once (a CUDA graph records their addresses), the factor folded into
// the AdamW update (set_grad_scale) instead of a pass that rescales every gradient.
struct Clip {
  Tensor norm, factor;
  double max_norm;
  Clip(Device dev, double max_norm)
      : norm(zeros({}, DType::f32, dev)), factor(zeros({}, DType::f32, dev)), max_norm(max_norm) {}
  void operator()(const std::vector<Tensor>& params) const {
    optim::grad_norm_and_clip_factor(params, max_norm, norm, factor);
  }
};

// AdamW over the model's decay groups (weight decay on parameters of >= 2 dims), the clip factor
// folded in.
inline std::unique_ptr<optim::AdamW> make_adamw(const nn::Module& model,
                                                const optim::AdamWOptions& options, const Clip& clip) {
  auto adamw = std::make_unique<optim::AdamW>(
      optim::Optimizer::decay_groups(model, options.weight_decay), options);
  adamw->set_grad_scale(clip.factor);
  return adamw;
}

inline void write_text(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  MT_CHECK(f != nullptr, "cannot open '", path, "' for writing: ", std::strerror(errno));
  const bool ok = std::fputs(text.c_str(), f) >= 0;
  const bool closed = std::fclose(f) == 0;
  MT_CHECK(ok && closed, "could not write '", path, "'");
}

inline std::string num(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace mt::bench
