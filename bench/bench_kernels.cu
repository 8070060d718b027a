// Kernel benchmark: every CUDA op (scaled-SiLU, RMSNorm, cross-entropy, the elementwise ops and
// the sum, the bias gradient, AdamW and the gradient norm) against the device's own
// device-to-device copy bandwidth, measured in the same run (docs/kernels.md reads the table).
//
// A kernel's bytes are the fewest it must move: every input read once, every output written
// once (the copy counts its read and its write). Each figure is the median of kReps timed calls
// after kWarmup untimed ones, on random inputs in [-3, 3], with every buffer far larger than L2,
// so nothing is served from cache between repetitions. Missing a target is reported, not an
// error: the exit code is non-zero only when a CUDA call fails.
//
//   bench_kernels           every row and the goal lines
//   bench_kernels gpt       the GPT ops' rows alone (a short run to put under Nsight Compute)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/dtype.h"
#include "ops/cross_entropy/cross_entropy_cuda.h"
#include "ops/dropout/dropout.h"  // dropout_threshold
#include "ops/dropout/dropout_cuda.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/embedding/embedding_cuda.h"
#include "ops/gelu/gelu_cuda.h"
#include "ops/layer_norm/layer_norm_cuda.h"
#include "ops/linear/linear_cuda.h"
#include "ops/rms_norm/rms_norm_cuda.h"
#include "ops/scaled_silu/scaled_silu_cuda.h"
#include "optim/adamw_cuda.h"

namespace {

using mt::DType;

constexpr int kWarmup = 3;
constexpr int kReps = 25;
constexpr size_t kCopyBytes = size_t(2) << 30;  // 2 GiB each way
constexpr int64_t kSiluN = int64_t(1) << 28;
constexpr int64_t kRmsRows = 65536;
constexpr int64_t kRmsTargetD[] = {1024, 4096, 8192};  // the widths with targets (bf16)
// RMSNorm targets, fractions of copy: forward, deterministic backward, forward + backward.
constexpr double kRmsFwd = 0.95, kRmsBwd = 0.92, kRmsFwdBwd = 0.93;

// Owns one allocation from the framework's pool.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t nbytes, int device)
      : ptr_(mt::cuda::alloc(nbytes, device)), device_(device) {}
  ~DeviceBuffer() { mt::cuda::free(ptr_, device_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T = void>
  T* get() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_;
  int device_;
};

// splitmix64's finalizer: a well-mixed 32-bit value for every (index, seed).
__device__ uint32_t hash(uint64_t i, uint32_t seed) {
  uint64_t z = i + 0x9e3779b97f4a7c15ull * (uint64_t(seed) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return uint32_t((z ^ (z >> 31)) >> 32);
}

template <class T>
__global__ void fill_kernel(T* out, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float u = float(hash(uint64_t(i), seed) >> 8) * (1.0f / 16777216.0f);  // [0, 1)
    out[i] = T(-3.0f + 6.0f * u);
  }
}

template <class T>
void fill(void* out, int64_t n, uint32_t seed, cudaStream_t s) {
  fill_kernel<T><<<1024, 256, 0, s>>>(static_cast<T*>(out), n, seed);
  MT_CUDA_CHECK_LAUNCH();
}

void fill(void* out, int64_t n, DType dt, uint32_t seed, cudaStream_t s) {
  switch (dt) {
    case DType::f32: return fill<float>(out, n, seed, s);
    case DType::bf16: return fill<__nv_bfloat16>(out, n, seed, s);
    case DType::f16: return fill<__half>(out, n, seed, s);
    default: MT_THROW("bench: cannot fill dtype ", mt::dtype_name(dt));
  }
}

// Median time of `body` in milliseconds. Every repetition sits between its own pair of events,
// and all are queued before the host waits, so the GPU never idles between them and no launch
// latency is counted.
template <class F>
double median_ms(cudaStream_t s, F&& body) {
  for (int i = 0; i < kWarmup; ++i) body();
  std::vector<cudaEvent_t> events(2 * kReps);
  for (cudaEvent_t& e : events) MT_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < kReps; ++i) {
    MT_CUDA_CHECK(cudaEventRecord(events[2 * i], s));
    body();
    MT_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], s));
  }
  MT_CUDA_CHECK(cudaEventSynchronize(events.back()));
  std::vector<float> ms(kReps);
  for (int i = 0; i < kReps; ++i)
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]));
  for (cudaEvent_t& e : events) MT_CUDA_CHECK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[kReps / 2];
}

struct Result {
  std::string kernel;
  std::string dtype;
  double ms;
  double bytes;
  double target;  // fraction of copy bandwidth; 0 = reported for comparison only
};

double gbps(const Result& r) { return r.bytes / (r.ms * 1e-3) / 1e9; }

class Table {
 public:
  explicit Table(double copy_gbps) : copy_gbps_(copy_gbps) {}

  void add(Result r) {
    results_.push_back(std::move(r));
    print(results_.back());
  }
  double fraction(const std::string& kernel, const std::string& dtype) const {
    for (const Result& r : results_)
      if (r.kernel == kernel && r.dtype == dtype) return gbps(r) / copy_gbps_;
    MT_THROW("bench: no result for ", kernel, " ", dtype);
  }
  bool passed(const std::string& kernel, const std::string& dtype) const {
    for (const Result& r : results_)
      if (r.kernel == kernel && r.dtype == dtype) return gbps(r) / copy_gbps_ >= r.target;
    MT_THROW("bench: no result for ", kernel, " ", dtype);
  }
  static void header() {
    std::printf("%-34s %-5s %9s %9s %8s %7s  %s\n", "kernel", "dtype", "ms", "GB/s", "% copy",
                "target", "status");
  }

 private:
  void print(const Result& r) const {
    const double pct = 100.0 * gbps(r) / copy_gbps_;
    char target[16] = "-";
    if (r.target > 0) std::snprintf(target, sizeof target, "%.0f%%", 100.0 * r.target);
    const char* status = r.target > 0 ? (pct >= 100.0 * r.target ? "PASS" : "MISS") : "info";
    std::printf("%-34s %-5s %9.3f %9.1f %7.1f%% %7s  %s\n", r.kernel.c_str(), r.dtype.c_str(),
                r.ms, gbps(r), pct, target, status);
    std::fflush(stdout);
  }

  double copy_gbps_;
  std::vector<Result> results_;
};

// cudaMemcpyAsync of 2 GiB device to device: the ceiling every kernel is compared with.
Result bench_copy(int device, cudaStream_t s) {
  DeviceBuffer src(kCopyBytes, device), dst(kCopyBytes, device);
  fill(src.get(), int64_t(kCopyBytes / 4), DType::f32, 1, s);
  const double ms = median_ms(s, [&] {
    MT_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyDeviceToDevice, s));
  });
  return {"copy (d2d, read+write)", "-", ms, 2.0 * double(kCopyBytes), 0.0};
}

void bench_scaled_silu(Table& table, DType dt, int device, cudaStream_t s) {
  const int64_t n = kSiluN;
  const size_t bytes = size_t(n) * mt::dtype_size(dt);
  const double e = double(mt::dtype_size(dt)) * double(n);  // bytes of one tensor
  const std::string name = mt::dtype_name(dt);
  DeviceBuffer x(bytes, device), y(bytes, device), dy(bytes, device), dx(bytes, device);
  DeviceBuffer w(sizeof(float), device), dw(sizeof(float), device);
  fill(x.get(), n, dt, 2, s);
  fill(dy.get(), n, dt, 3, s);
  const float w_host = 1.5f, zero = 0.0f;
  mt::cuda::copy_h2d(w.get(), &w_host, sizeof w_host, device);
  mt::cuda::copy_h2d(dw.get(), &zero, sizeof zero, device);

  auto forward = [&] { mt::cuda::scaled_silu_forward(x.get(), w.get<float>(), y.get(), n, dt, s); };
  auto backward = [&](bool deterministic) {
    mt::cuda::scaled_silu_backward(x.get(), w.get<float>(), dy.get(), dx.get(), dw.get<float>(),
                                   n, dt, deterministic, s);
  };
  table.add({"scaled_silu fwd", name, median_ms(s, forward), 2 * e, 0.95});
  table.add({"scaled_silu bwd (det)", name, median_ms(s, [&] { backward(true); }), 3 * e, 0.90});
  table.add({"scaled_silu bwd (atomic)", name, median_ms(s, [&] { backward(false); }), 3 * e,
             0.0});
  table.add({"scaled_silu fwd+bwd (det)", name, median_ms(s, [&] {
               forward();
               backward(true);
             }),
             5 * e, 0.0});
}

// RMSNorm over [rows, d]; the row names carry d ("rms_norm fwd d=4096"). targets false: the
// widths and dtypes reported to show there is no regression (no target).
void bench_rms_norm(Table& table, DType dt, int64_t rows, int64_t d, bool targets, int device,
                    cudaStream_t s) {
  const int64_t n = rows * d;
  const size_t bytes = size_t(n) * mt::dtype_size(dt);
  const double e = double(bytes);  // bytes of one [rows, d] tensor
  const double fwd_small = 4.0 * rows + 4.0 * d;          // rstd written, weight read
  const double bwd_small = 4.0 * rows + 4.0 * d + 8.0 * d;  // rstd, weight, dweight read+write
  const std::string name = mt::dtype_name(dt), at = " d=" + std::to_string(d);
  DeviceBuffer x(bytes, device), y(bytes, device), dy(bytes, device), dx(bytes, device);
  DeviceBuffer weight(d * sizeof(float), device), dweight(d * sizeof(float), device);
  DeviceBuffer rstd(rows * sizeof(float), device);
  fill(x.get(), n, dt, 4, s);
  fill(dy.get(), n, dt, 5, s);
  fill(weight.get(), d, DType::f32, 6, s);
  MT_CUDA_CHECK(cudaMemsetAsync(dweight.get(), 0, d * sizeof(float), s));

  auto forward = [&] {
    mt::cuda::rms_norm_forward(x.get(), weight.get<float>(), y.get(), rstd.get<float>(), rows, d,
                               1e-6f, dt, s);
  };
  auto backward = [&](bool deterministic) {
    mt::cuda::rms_norm_backward(x.get(), weight.get<float>(), rstd.get<float>(), dy.get(),
                                dx.get(), dweight.get<float>(), rows, d, dt, deterministic, s);
  };
  // A copy of one [rows, d] tensor moves the forward's bytes: what a kernel of this size can
  // reach, launch and ramp included (the targets are against the 2 GiB copy).
  if (targets)
    table.add({"copy, the fwd's bytes" + at, name, median_ms(s, [&] {
                 MT_CUDA_CHECK(cudaMemcpyAsync(y.get(), x.get(), bytes, cudaMemcpyDeviceToDevice, s));
               }),
               2 * e, 0.0});
  table.add({"rms_norm fwd" + at, name, median_ms(s, forward), 2 * e + fwd_small,
             targets ? kRmsFwd : 0.0});
  table.add({"rms_norm bwd (det)" + at, name, median_ms(s, [&] { backward(true); }),
             3 * e + bwd_small, targets ? kRmsBwd : 0.0});
  table.add({"rms_norm bwd (atomic)" + at, name, median_ms(s, [&] { backward(false); }),
             3 * e + bwd_small, 0.0});
  table.add({"rms_norm fwd+bwd (det)" + at, name, median_ms(s, [&] {
               forward();
               backward(true);
             }),
             5 * e + fwd_small + bwd_small, targets ? kRmsFwdBwd : 0.0});
}

// The fused rms_norm_scaled_silu over [rows, d]: the same bytes as rms_norm alone (x read, y
// written; x, dy read, dx written), plus w's scalar. Reported beside rms_norm's rows, no target;
// the row names carry d, and the row count too when it is not kRmsRows.
void bench_rms_norm_scaled_silu(Table& table, DType dt, int64_t rows, int64_t d, int device,
                                cudaStream_t s) {
  const int64_t n = rows * d;
  const size_t bytes = size_t(n) * mt::dtype_size(dt);
  const double e = double(bytes);
  const std::string name = mt::dtype_name(dt),
                    at = (rows == kRmsRows ? "" : " rows=" + std::to_string(rows)) +
                         " d=" + std::to_string(d);
  DeviceBuffer x(bytes, device), y(bytes, device), dy(bytes, device), dx(bytes, device);
  DeviceBuffer weight(d * sizeof(float), device), dweight(d * sizeof(float), device);
  DeviceBuffer w(sizeof(float), device), dw(sizeof(float), device);
  DeviceBuffer rstd(rows * sizeof(float), device);
  fill(x.get(), n, dt, 4, s);
  fill(dy.get(), n, dt, 5, s);
  fill(weight.get(), d, DType::f32, 6, s);
  fill(w.get(), 1, DType::f32, 7, s);
  MT_CUDA_CHECK(cudaMemsetAsync(dweight.get(), 0, d * sizeof(float), s));
  MT_CUDA_CHECK(cudaMemsetAsync(dw.get(), 0, sizeof(float), s));
  auto forward = [&] {
    mt::cuda::rms_norm_scaled_silu_forward(x.get(), weight.get<float>(), w.get<float>(), y.get(),
                                           rstd.get<float>(), rows, d, 1e-6f, dt, s);
  };
  auto backward = [&] {
    mt::cuda::rms_norm_scaled_silu_backward(x.get(), weight.get<float>(), w.get<float>(),
                                            rstd.get<float>(), dy.get(), dx.get(),
                                            dweight.get<float>(), dw.get<float>(), rows, d, dt,
                                            /*deterministic=*/true, s);
  };
  table.add({"rms_norm_scaled_silu fwd" + at, name, median_ms(s, forward), 2 * e + 4.0 * rows, 0.0});
  table.add({"rms_norm_scaled_silu bwd (det)" + at, name, median_ms(s, backward),
             3 * e + 4.0 * rows + 12.0 * d, 0.0});
}

// Cross-entropy over [rows, C] logits in dt, the first `valid` columns classes, every 16th target
// ignored if `ignore` (their rows' bytes are counted all the same: that row's figures are compared
// across versions). Forward reads the logits once (plus targets, lse written); backward reads
// them and writes dlogits.
void bench_cross_entropy(Table& table, DType dt, int device, cudaStream_t s, int64_t rows,
                         int64_t C, int64_t valid, bool ignore, const std::string& shape) {
  const int64_t n = rows * C;
  const double e = double(n) * mt::dtype_size(dt);
  const std::string name = mt::dtype_name(dt);
  DeviceBuffer logits(size_t(e), device), dlogits(size_t(e), device);
  DeviceBuffer targets(rows * sizeof(int64_t), device), lse(rows * sizeof(float), device);
  DeviceBuffer loss(sizeof(float), device), dloss(sizeof(float), device);
  fill(logits.get(), n, dt, 7, s);
  std::vector<int64_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[r] = ignore && r % 16 == 15 ? -100 : (r * 7919) % valid;
  mt::cuda::copy_h2d(targets.get(), t.data(), rows * sizeof(int64_t), device);
  const float one = 1.0f;
  mt::cuda::copy_h2d(dloss.get(), &one, sizeof one, device);
  const float normalizer = float(ignore ? rows - rows / 16 : rows);
  const double small = 12.0 * rows;  // targets read, lse written (or read)
  table.add({"cross_entropy fwd " + shape, name, median_ms(s, [&] {
               mt::cuda::cross_entropy_forward(logits.get(), targets.get<int64_t>(),
                                               loss.get<float>(), lse.get<float>(), nullptr, rows,
                                               C, valid, -100, normalizer, dt, s);
             }),
             e + small, 0.0});
  table.add({"cross_entropy bwd " + shape, name, median_ms(s, [&] {
               mt::cuda::cross_entropy_backward(logits.get(), targets.get<int64_t>(),
                                                lse.get<float>(), dloss.get<float>(),
                                                dlogits.get(), rows, C, valid, -100, normalizer,
                                                dt, s);
             }),
             2 * e + small, 0.0});
}

// The ops a GPT adds, at GPT-2 small's activation shape [65536, 768] (64 sequences of 1024
// tokens, C = 768). Targets (fractions of copy): the maps (GELU, dropout) 90%, the row
// reductions (LayerNorm) and the scatter-add (embedding backward) 85%.
constexpr int64_t kGptRows = 65536, kGptC = 768, kGptVocab = 50304;
constexpr double kGptMap = 0.90, kGptReduce = 0.85;

void bench_gpt_ops(Table& table, DType dt, int device, cudaStream_t s) {
  const int64_t n = kGptRows * kGptC;
  const double e = double(n) * mt::dtype_size(dt);  // bytes of one [rows, C] tensor
  const double stats = 8.0 * kGptRows;              // LayerNorm's mean and rstd
  const std::string name = mt::dtype_name(dt);
  DeviceBuffer x(size_t(e), device), y(size_t(e), device), dy(size_t(e), device),
      dx(size_t(e), device), r(size_t(e), device), sum(size_t(e), device);
  DeviceBuffer w(kGptC * sizeof(float), device), b(kGptC * sizeof(float), device),
      dw(kGptC * sizeof(float), device), db(kGptC * sizeof(float), device);
  DeviceBuffer mean(kGptRows * sizeof(float), device), rstd(kGptRows * sizeof(float), device);
  fill(x.get(), n, dt, 11, s);
  fill(dy.get(), n, dt, 12, s);
  fill(r.get(), n, dt, 17, s);
  fill(w.get(), kGptC, DType::f32, 13, s);
  fill(b.get(), kGptC, DType::f32, 14, s);
  fill(dw.get(), kGptC, DType::f32, 15, s);
  fill(db.get(), kGptC, DType::f32, 16, s);
  // The copy at this size: a 100 MB tensor is short work for the GPU (about 50 µs), so the ramp
  // at its start and the tail at its end weigh more than in the 1 GiB copy the table divides by.
  table.add({"copy [65536, 768] (d2d)", name, median_ms(s, [&] {
               MT_CUDA_CHECK(cudaMemcpyAsync(y.get(), x.get(), size_t(e), cudaMemcpyDeviceToDevice, s));
             }),
             2 * e, 0.0});
  table.add({"layer_norm fwd [65536, 768]", name, median_ms(s, [&] {
               mt::cuda::layer_norm_forward(x.get(), nullptr, w.get<float>(), b.get<float>(),
                                            nullptr, y.get(), mean.get<float>(),
                                            rstd.get<float>(), kGptRows, kGptC, 1e-5f, dt, s);
             }),
             2 * e + stats, kGptReduce});
  table.add({"layer_norm bwd [65536, 768]", name, median_ms(s, [&] {
               mt::cuda::layer_norm_backward(x.get(), w.get<float>(), mean.get<float>(),
                                             rstd.get<float>(), dy.get(), nullptr, dx.get(),
                                             dw.get<float>(), db.get<float>(), kGptRows, kGptC,
                                             dt, s);
             }),
             3 * e + stats, kGptReduce});
  // The residual add fused in (add_layer_norm): x and r read, s and y written; the backward
  // reads the residual's gradient too and writes their sum.
  table.add({"add_layer_norm fwd [65536, 768]", name, median_ms(s, [&] {
               mt::cuda::layer_norm_forward(x.get(), r.get(), w.get<float>(), b.get<float>(),
                                            sum.get(), y.get(), mean.get<float>(),
                                            rstd.get<float>(), kGptRows, kGptC, 1e-5f, dt, s);
             }),
             4 * e + stats, kGptReduce});
  table.add({"add_layer_norm bwd [65536, 768]", name, median_ms(s, [&] {
               mt::cuda::layer_norm_backward(x.get(), w.get<float>(), mean.get<float>(),
                                             rstd.get<float>(), dy.get(), r.get(), dx.get(),
                                             dw.get<float>(), db.get<float>(), kGptRows, kGptC,
                                             dt, s);
             }),
             4 * e + stats, kGptReduce});
  table.add({"gelu fwd [65536, 768]", name, median_ms(s, [&] {
               mt::cuda::gelu_forward(x.get(), y.get(), n, true, dt, s);
             }),
             2 * e, kGptMap});
  table.add({"gelu bwd [65536, 768]", name, median_ms(s, [&] {
               mt::cuda::gelu_backward(x.get(), dy.get(), dx.get(), n, true, dt, s);
             }),
             3 * e, kGptMap});
  // The backward is the same kernel on dy. The offset's step part read from device memory, as a
  // training step (and a CUDA graph replay of one) does.
  DeviceBuffer base(sizeof(uint64_t), device);
  MT_CUDA_CHECK(cudaMemsetAsync(base.get(), 0, sizeof(uint64_t), s));
  table.add({"dropout p=0.1 [65536, 768]", name, median_ms(s, [&] {
               mt::cuda::dropout_apply(x.get(), y.get(), n, mt::dropout_threshold(0.1),
                                       1.0 / 0.9, 1234, 5, base.get<uint64_t>(), dt, s);
             }),
             2 * e, kGptMap});

  // Embedding backward: 65536 token ids over GPT-2's padded vocabulary, drawn like the fill's
  // hash; bytes = dy and the ids read once, each touched row of dW read and written in fp32.
  std::vector<int64_t> ids(kGptRows);
  std::vector<char> seen(kGptVocab, 0);
  int64_t unique = 0;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int64_t& id : ids) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    id = int64_t((state >> 33) % kGptVocab);
    unique += !seen[id];
    seen[id] = 1;
  }
  DeviceBuffer d_ids(kGptRows * sizeof(int64_t), device);
  DeviceBuffer dW(size_t(kGptVocab) * kGptC * sizeof(float), device);
  mt::cuda::copy_h2d(d_ids.get(), ids.data(), ids.size() * sizeof(int64_t), device);
  fill(dW.get(), kGptVocab * kGptC, DType::f32, 17, s);
  table.add({"embedding bwd [65536, 768] V=50304", name, median_ms(s, [&] {
               mt::cuda::embedding_backward(d_ids.get<int64_t>(), dy.get(), dW.get<float>(),
                                            kGptRows, kGptVocab, kGptC, dt, s);
             }),
             e + 8.0 * kGptRows + 8.0 * double(unique) * kGptC, kGptReduce});
  table.add({"embedding fwd [65536, 768] V=50304", name, median_ms(s, [&] {
               mt::cuda::embedding_forward(d_ids.get<int64_t>(), x.get(), y.get(), nullptr,
                                           kGptRows, kGptVocab, kGptC, dt, s);
             }),
             2 * e + 8.0 * kGptRows, 0.0});
  // The classifier of one microbatch of 16 × 1024 tokens: the step's logits.
  bench_cross_entropy(table, dt, device, s, 16384, kGptVocab, 50257, false, "[16384, 50304]");
}

// The elementwise ops and the deterministic sum on 2^28 elements.
void bench_elementwise(Table& table, DType dt, int device, cudaStream_t s) {
  const int64_t n = kSiluN;
  const double e = double(n) * mt::dtype_size(dt);
  const std::string name = mt::dtype_name(dt);
  DeviceBuffer a(size_t(e), device), b(size_t(e), device), out(size_t(e), device);
  DeviceBuffer total(sizeof(float), device);
  fill(a.get(), n, dt, 8, s);
  fill(b.get(), n, dt, 9, s);
  auto add = [&] { mt::cuda::add(a.get(), b.get(), out.get(), n, dt, s); };
  auto mul = [&] { mt::cuda::mul(a.get(), b.get(), out.get(), n, dt, s); };
  table.add({"add", name, median_ms(s, add), 3 * e, 0.0});
  table.add({"mul", name, median_ms(s, mul), 3 * e, 0.0});
  table.add({"scale", name,
             median_ms(s, [&] { mt::cuda::scale(a.get(), 0.5f, out.get(), n, dt, s); }), 2 * e,
             0.0});
  table.add({"sum (det)", name, median_ms(s, [&] {
               mt::cuda::sum_to_f32(a.get(), n, dt, total.get<float>(), false, s);
             }),
             e, 0.0});
}

// The bias gradient of a linear layer alone (db += column sums of dy [M, N]; dx and dW skipped).
void bench_bias_grad(Table& table, DType dt, int device, cudaStream_t s) {
  const int64_t M = 32768, N = 8192;
  const double e = double(M * N) * mt::dtype_size(dt);
  DeviceBuffer dy(size_t(e), device), db(N * sizeof(float), device);
  fill(dy.get(), M * N, dt, 10, s);
  MT_CUDA_CHECK(cudaMemsetAsync(db.get(), 0, N * sizeof(float), s));
  table.add({"bias grad [32768, 8192]", mt::dtype_name(dt), median_ms(s, [&] {
               mt::cuda::linear_backward(nullptr, nullptr, dy.get(), nullptr, nullptr, 0.0f,
                                         db.get<float>(), M, N, 1, dt, s);
             }),
             e + 8.0 * N, 0.0});
}

// AdamW over one fp32 tensor of 2^26 elements with a bf16 copy rewritten (reads p, g, m, v;
// writes p, m, v, lowp), and the global gradient norm over the same gradient.
void bench_adamw(Table& table, int device, cudaStream_t s) {
  const int64_t n = int64_t(1) << 26;
  const size_t f = size_t(n) * sizeof(float);
  DeviceBuffer p(f, device), g(f, device), m(f, device), v(f, device), lowp(f / 2, device);
  DeviceBuffer hyper(3 * sizeof(float), device), norm(sizeof(float), device);
  fill(p.get(), n, DType::f32, 11, s);
  fill(g.get(), n, DType::f32, 12, s);
  MT_CUDA_CHECK(cudaMemsetAsync(m.get(), 0, f, s));
  MT_CUDA_CHECK(cudaMemsetAsync(v.get(), 0, f, s));
  const float h[3] = {1e-4f, 0.1f, 0.001f};
  mt::cuda::copy_h2d(hyper.get(), h, sizeof h, device);
  const mt::cuda::AdamWTensor t{p.get<float>(), g.get<float>(), m.get<float>(), v.get<float>(),
                                lowp.get(), hyper.get<float>(), n, 0.01f};
  table.add({"adamw (+ bf16 copy) 2^26", "f32", median_ms(s, [&] {
               mt::cuda::adamw_step(&t, 1, 0.9f, 0.95f, 1e-8f, nullptr, DType::bf16, s);
             }),
             7.0 * f + f / 2, 0.0});
  const float* grads[1] = {g.get<float>()};
  const int64_t sizes[1] = {n};
  table.add({"grad norm 2^26", "f32", median_ms(s, [&] {
               mt::cuda::grad_norm_sq(grads, sizes, 1, norm.get<float>(), s);
             }),
             double(f), 0.0});
}

// sections: the groups of rows to run ("gpt" for bench_gpt_ops' alone, e.g. under a profiler);
// empty runs them all and prints the goal lines.
int run(const std::vector<std::string>& sections) {
  if (!mt::cuda::available()) {
    std::fprintf(stderr, "bench_kernels: no CUDA device\n");
    return 1;
  }
  const int device = 0;
  mt::cuda::set_device(device);
  cudaStream_t s = mt::cuda::stream(device);
  cudaDeviceProp prop;
  MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("%s: %d SMs, %.0f MiB L2, sm_%d%d\n\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1048576.0, prop.major, prop.minor);

  Table::header();
  const Result copy = bench_copy(device, s);
  Table table(gbps(copy));
  table.add(copy);
  if (!sections.empty()) {  // the named groups only, and no goal lines (they need every row)
    for (const std::string& name : sections) {
      if (name == "gpt") bench_gpt_ops(table, DType::bf16, device, s);
      else MT_THROW("unknown section '", name, "' (known: gpt)");
    }
    mt::cuda::synchronize(device);
    return 0;
  }
  for (DType dt : {DType::bf16, DType::f16}) bench_scaled_silu(table, dt, device, s);
  for (int64_t d : kRmsTargetD) bench_rms_norm(table, DType::bf16, kRmsRows, d, true, device, s);
  bench_rms_norm(table, DType::bf16, kRmsRows * 16, 256, false, device, s);  // warp teams
  bench_rms_norm(table, DType::f32, kRmsRows, 4096, false, device, s);
  for (int64_t d : kRmsTargetD)
    bench_rms_norm_scaled_silu(table, DType::bf16, kRmsRows, d, device, s);
  bench_rms_norm_scaled_silu(table, DType::bf16, 8192, 8192, device, s);  // the large step's shape
  bench_cross_entropy(table, DType::bf16, device, s, 32768, 32768, 32768, true, "C=32768");
  bench_elementwise(table, DType::bf16, device, s);
  bench_bias_grad(table, DType::bf16, device, s);
  bench_adamw(table, device, s);
  bench_gpt_ops(table, DType::bf16, device, s);
  mt::cuda::synchronize(device);

  // The goal lines: figure, target, PASS/MISS (scripts/gpu-test.sh prints them in its summary).
  std::printf("\n");
  for (const char* dt : {"bf16", "f16"}) {
    const bool ok =
        table.passed("scaled_silu fwd", dt) && table.passed("scaled_silu bwd (det)", dt);
    std::printf("goal scaled_silu %-4s n=2^28: fwd %.1f%%, bwd det %.1f%%, bwd atomic %.1f%%, "
                "fwd+bwd %.1f%% of copy (targets fwd 95%%, bwd det 90%%): %s\n",
                dt, 100 * table.fraction("scaled_silu fwd", dt),
                100 * table.fraction("scaled_silu bwd (det)", dt),
                100 * table.fraction("scaled_silu bwd (atomic)", dt),
                100 * table.fraction("scaled_silu fwd+bwd (det)", dt), ok ? "PASS" : "MISS");
  }
  for (int64_t d : kRmsTargetD) {
    const std::string at = " d=" + std::to_string(d);
    struct Goal {
      const char* what;
      double target;
    };
    for (const Goal& g : {Goal{"fwd", kRmsFwd}, Goal{"bwd (det)", kRmsBwd},
                          Goal{"fwd+bwd (det)", kRmsFwdBwd}}) {
      const std::string kernel = std::string("rms_norm ") + g.what + at;
      std::printf("goal rms_norm bf16 [%lld, %lld] %-13s %5.1f%% of copy (target %.0f%%): %s\n",
                  (long long)kRmsRows, (long long)d, g.what, 100 * table.fraction(kernel, "bf16"),
                  100 * g.target, table.passed(kernel, "bf16") ? "PASS" : "MISS");
    }
  }
  for (const char* k : {"layer_norm fwd [65536, 768]", "layer_norm bwd [65536, 768]",
                       "gelu fwd [65536, 768]", "gelu bwd [65536, 768]",
                       "dropout p=0.1 [65536, 768]", "embedding bwd [65536, 768] V=50304"})
    std::printf("goal %-36s bf16 %5.1f%% of copy: %s\n", k, 100 * table.fraction(k, "bf16"),
                table.passed(k, "bf16") ? "PASS" : "MISS");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
}
