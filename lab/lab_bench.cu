// lab_bench: every lab version timed on the reader's GPU (docs/lab.md).
//
//   lab_bench [--markdown FILE]
//
// Prints, for each numbered version of the scaled-SiLU and RMSNorm backward, its time, GB/s and
// share of the same run's device-to-device copy bandwidth (bytes read + written, the convention
// of bench/bench_kernels.cu: a kernel's bytes are the fewest it must move); then the hand-written
// GEMMs of the linear layer as a fraction of cuBLAS on the forward-, dX- and dW-shaped problems
// at 8192 and at the small models' sizes. --markdown also writes the tables to FILE (the book's
// docs/lab_results.md is that file, from an H200). The last lines, "lab: ...", are the summary.
// Each figure is the median of timed calls queued back to back after warm-up calls, on random
// inputs far larger than L2. Correctness is the test's job (tests/test_lab_cuda.cpp).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_bf16.h>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/error.h"
#include "lab/attention/attention.h"
#include "lab/lab.h"
#include "lab/matmul/gemm.h"
#include "ops/rms_norm/rms_norm_cuda.h"

namespace {

using namespace mt;
using namespace mt::lab;

constexpr int64_t kSiluN = int64_t(1) << 28;
constexpr int64_t kRmsRows = 65536, kRmsD = 4096;
constexpr size_t kCopyBytes = size_t(1) << 30;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t nbytes) : ptr_(cuda::alloc(nbytes, 0)) {}
  ~DeviceBuffer() { cuda::free(ptr_, 0); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  float* f() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_;
};

// splitmix64's finalizer, uniform in [lo, hi).
__global__ void fill_kernel(__nv_bfloat16* bf, float* f32, int64_t n, uint32_t seed, float lo, float hi) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = uint64_t(i) + 0x9e3779b97f4a7c15ull * (uint64_t(seed) + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    const float v = lo + (hi - lo) * float(uint32_t((z ^ (z >> 31)) >> 40)) * (1.0f / 16777216.0f);
    if (bf) bf[i] = __float2bfloat16_rn(v);
    else f32[i] = v;
  }
}
void fill_bf16(const DeviceBuffer& b, int64_t n, uint32_t seed, float lo = -3, float hi = 3) {
  fill_kernel<<<1024, 256, 0, cuda::stream(0)>>>(static_cast<__nv_bfloat16*>(b.get()), nullptr, n, seed, lo, hi);
  MT_CUDA_CHECK_LAUNCH();
}
void fill_f32(const DeviceBuffer& b, int64_t n, uint32_t seed, float lo, float hi) {
  fill_kernel<<<1024, 256, 0, cuda::stream(0)>>>(nullptr, b.f(), n, seed, lo, hi);
  MT_CUDA_CHECK_LAUNCH();
}

// Median milliseconds of `body`: one untimed call, then as many timed ones as fit in about half
// a second (3 to 25), each between its own pair of events, all queued before the host waits.
template <class F>
double median_ms(F&& body) {
  cudaStream_t s = cuda::stream(0);
  cudaEvent_t e0, e1;
  MT_CUDA_CHECK(cudaEventCreate(&e0));
  MT_CUDA_CHECK(cudaEventCreate(&e1));
  MT_CUDA_CHECK(cudaEventRecord(e0, s));
  body();
  MT_CUDA_CHECK(cudaEventRecord(e1, s));
  MT_CUDA_CHECK(cudaEventSynchronize(e1));
  float first = 0;
  MT_CUDA_CHECK(cudaEventElapsedTime(&first, e0, e1));
  MT_CUDA_CHECK(cudaEventDestroy(e0));
  MT_CUDA_CHECK(cudaEventDestroy(e1));
  const int reps = std::clamp(int(500.0 / std::max(first, 1e-3f)), 3, 25);
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) MT_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    MT_CUDA_CHECK(cudaEventRecord(ev[2 * i], s));
    body();
    MT_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], s));
  }
  MT_CUDA_CHECK(cudaEventSynchronize(ev.back()));
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) MT_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) MT_CUDA_CHECK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Markdown, printed as it grows and kept for --markdown.
struct Report {
  std::ostringstream md;
  std::vector<std::string> summary;
  void line(const std::string& l) {
    std::printf("%s\n", l.c_str());
    std::fflush(stdout);
    md << l << "\n";
  }
};

double copy_gbps() {
  DeviceBuffer a(kCopyBytes), b(kCopyBytes);
  fill_bf16(a, int64_t(kCopyBytes / 2), 99);
  const double ms = median_ms([&] {
    MT_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), kCopyBytes, cudaMemcpyDeviceToDevice, cuda::stream(0)));
  });
  return 2.0 * double(kCopyBytes) / (ms * 1e-3) / 1e9;
}

template <class Fn>
void bandwidth_table(Report& r, const char* title, const std::vector<Version<Fn>>& versions,
                     double bytes, double copy, const std::function<void(Fn*)>& call) {
  r.line("");
  r.line(std::string("### ") + title);
  r.line("");
  r.line("| version | what changed | time | GB/s | of copy |");
  r.line("| --- | --- | --- | --- | --- |");
  for (const auto& v : versions) {
    const double ms = median_ms([&] { call(v.fn); });
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    r.line(std::string("| ") + v.name + " | " + v.change + " | " + fmt("%.3f ms", ms) + " | " +
           fmt("%.0f", gbps) + " | " + fmt("%.1f%%", 100 * gbps / copy) + " |");
    r.summary.push_back(std::string("lab: ") + title + ", " + v.name + ": " + fmt("%.1f%% of copy", 100 * gbps / copy));
  }
}

void silu_table(Report& r, double copy) {
  DeviceBuffer x(kSiluN * 2), dy(kSiluN * 2), dx(kSiluN * 2), w(4), dw(4);
  fill_bf16(x, kSiluN, 1);
  fill_bf16(dy, kSiluN, 2);
  fill_f32(w, 1, 3, 0.5f, 1.5f);
  fill_f32(dw, 1, 4, 0, 0);
  const double bytes = 3.0 * kSiluN * 2;  // x and dy read, dx written
  bandwidth_table<SiluBackwardFn>(r, "scaled-SiLU backward, n = 2^28, bf16", silu_versions(), bytes, copy,
                                  [&](SiluBackwardFn* fn) { fn(x.get(), w.f(), dy.get(), dx.get(), dw.f(), kSiluN, cuda::stream(0)); });
}

void rms_table(Report& r, double copy) {
  const int64_t n = kRmsRows * kRmsD;
  DeviceBuffer x(n * 2), dy(n * 2), dx(n * 2), w(kRmsD * 4), rstd(kRmsRows * 4), dw(kRmsD * 4);
  fill_bf16(x, n, 5);
  fill_bf16(dy, n, 6);
  fill_f32(w, kRmsD, 7, 0.5f, 1.5f);
  fill_f32(dw, kRmsD, 8, 0, 0);
  cuda::rms_norm_forward(x.get(), w.f(), dx.get(), rstd.f(), kRmsRows, kRmsD, 1e-5f, DType::bf16, cuda::stream(0));
  const double bytes = 3.0 * n * 2 + 4.0 * kRmsRows;  // x, dy read, dx written; rstd read
  bandwidth_table<RmsBackwardFn>(r, "RMSNorm backward, [65536, 4096], bf16", rms_versions(), bytes, copy,
                                 [&](RmsBackwardFn* fn) {
                                   fn(x.get(), w.f(), rstd.f(), dy.get(), dx.get(), dw.f(), kRmsRows, kRmsD, cuda::stream(0));
                                 });
}

struct Layer {
  const char* name;
  int64_t rows, in, out;
};

void gemm_table(Report& r) {
  // 8192: the large shapes of bench/bench_linear.cu; the others are layers of the small models
  // (bench/train_step.cpp's small size, microbatch 128; configs/mlp.yaml, microbatch 64).
  const Layer layers[] = {{"8192³", 8192, 8192, 8192},
                          {"train_step small, hidden", 128, 1024, 1024},
                          {"train_step small, input", 128, 784, 1024},
                          {"mlp.yaml, hidden", 64, 128, 128}};
  r.line("");
  r.line("### The linear layer's GEMMs by hand, bf16 inputs, fp32 accumulation");
  r.line("");
  r.line("| layer | GEMM | shape | tiled | tensor core | cuBLAS | tiled / cuBLAS | tensor core / cuBLAS |");
  r.line("| --- | --- | --- | --- | --- | --- | --- | --- |");
  for (const Layer& l : layers) {
    DeviceBuffer x(l.rows * l.in * 2), W(l.out * l.in * 2), dy(l.rows * l.out * 2);
    DeviceBuffer out(std::max({l.rows * l.out, l.rows * l.in, l.out * l.in}) * 4);
    fill_bf16(x, l.rows * l.in, 10, -1, 1);
    fill_bf16(W, l.out * l.in, 11, -1, 1);
    fill_bf16(dy, l.rows * l.out, 12, -1, 1);
    fill_f32(out, l.out * l.in, 13, -1, 1);
    for (GemmKind kind : {GemmKind::Forward, GemmKind::DX, GemmKind::DW}) {
      const bool dw = kind == GemmKind::DW;
      const GemmArgs g{linear_gemm(kind, l.rows, l.in, l.out), kind == GemmKind::Forward ? x.get() : dy.get(),
                       dw ? x.get() : W.get(), out.get(), dw, dw ? 1.f : 0.f};
      const double flops = 2.0 * g.shape.M * g.shape.N * g.shape.K;
      double tflops[3];
      int i = 0;
      for (auto gemm : {&gemm_tiled, &gemm_tensor_core, &gemm_cublas})
        tflops[i++] = flops / (median_ms([&] { gemm(g, cuda::stream(0)); }) * 1e-3) / 1e12;
      r.line(std::string("| ") + l.name + " | " + gemm_kind_name(kind) + " | " + g.shape.str() + " | " +
             fmt("%.1f TFLOP/s", tflops[0]) + " | " + fmt("%.1f TFLOP/s", tflops[1]) + " | " +
             fmt("%.1f TFLOP/s", tflops[2]) + " | " + fmt("%.3f", tflops[0] / tflops[2]) + " | " +
             fmt("%.3f", tflops[1] / tflops[2]) + " |");
      r.summary.push_back(std::string("lab: tensor-core GEMM, ") + l.name + ", " + gemm_kind_name(kind) + ": " +
                          fmt("%.3f of cuBLAS", tflops[1] / tflops[2]) +
                          (l.rows == 8192 ? (tflops[1] / tflops[2] >= 0.5 ? " (target >= 0.5: PASS)" : " (target >= 0.5: MISS)") : ""));
    }
  }
}

// Every attention version at the GPT-2 shape and a long-context one, causal, bf16. TFLOP/s count
// the FLOPs of the unmasked half, as FlashAttention and PyTorch report them: forward
// 2·heads·T²·d (S = q·kᵀ and P·v, 2·T²·d each, halved by the mask), backward 2.5 times that.
void attention_tables(Report& r) {
  struct Shape { const char* name; int64_t B, H, T, d; };
  for (const Shape& sh : {Shape{"[16, 12, 1024, 64]", 16, 12, 1024, 64}, Shape{"[4, 16, 4096, 128]", 4, 16, 4096, 128}}) {
    const AttnShape s{sh.B * sh.H, sh.T, sh.d};
    const int64_t n = s.heads * s.T * s.d, rows = s.heads * s.T;
    DeviceBuffer q(n * 2), k(n * 2), v(n * 2), o(n * 2), dO(n * 2), dq(n * 2), dk(n * 2), dv(n * 2),
        L(rows * 4), P(size_t(s.heads) * s.T * s.T * 4), work(size_t(s.heads) * s.T * (s.T + 1) * 4);
    fill_bf16(q, n, 31, -1, 1);
    fill_bf16(k, n, 32, -1, 1);
    fill_bf16(v, n, 33, -1, 1);
    fill_bf16(dO, n, 34, -1, 1);
    const double fwd_flops = 2.0 * double(s.heads) * s.T * s.T * s.d, bwd_flops = 2.5 * fwd_flops;
    r.line("");
    r.line(std::string("### Causal attention ") + sh.name + " (B, H, T, d), bf16");
    r.line("");
    r.line("| version | what changed | time | TFLOP/s |");
    r.line("| --- | --- | --- | --- |");
    auto row = [&](const char* pass, const char* name, const char* change, double flops, double ms) {
      r.line(std::string("| ") + pass + " " + name + " | " + change + " | " + fmt("%.3f ms", ms) + " | " +
             fmt("%.1f", flops / (ms * 1e-3) / 1e12) + " |");
      r.summary.push_back(std::string("lab: attention ") + sh.name + ", " + pass + " " + name + ": " +
                          fmt("%.1f TFLOP/s", flops / (ms * 1e-3) / 1e12));
    };
    for (const auto& ver : attention_forward_versions()) {
      const double ms = median_ms([&] {
        ver.fn(q.get(), k.get(), v.get(), o.get(), L.f(), ver.uses_P ? P.f() : nullptr, s, cuda::stream(0));
      });
      row("forward", ver.name, ver.change, fwd_flops, ms);
    }
    attn_v1::forward(q.get(), k.get(), v.get(), o.get(), L.f(), P.f(), s, cuda::stream(0));  // P, o, L saved
    for (const auto& ver : attention_backward_versions()) {
      const double ms = median_ms([&] {
        ver.fn(q.get(), k.get(), v.get(), o.get(), L.f(), ver.uses_P ? P.f() : nullptr, dO.get(), dq.get(), dk.get(),
               dv.get(), work.f(), s, cuda::stream(0));
      });
      row("backward", ver.name, ver.change, bwd_flops, ms);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string markdown;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--markdown" && i + 1 < argc) markdown = argv[++i];
      else MT_THROW("usage: lab_bench [--markdown FILE] (unknown argument '", a, "')");
    }
    MT_CHECK(cuda::available(), "no CUDA device");
    cudaDeviceProp prop{};
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));

    Report r;
    r.line("<!-- Written by `lab_bench --markdown` (scripts/gpu-test.sh writes docs/lab_results.md). -->");
    const double copy = copy_gbps();
    r.line(std::string("Measured on ") + prop.name + " (" + std::to_string(prop.multiProcessorCount) + " SMs), " +
           date + ", by `lab_bench`. Copy bandwidth in the same run: " + fmt("%.0f GB/s", copy) +
           " (bytes read + written).");
    silu_table(r, copy);
    rms_table(r, copy);
    gemm_table(r);
    attention_tables(r);
    if (!markdown.empty()) {
      std::ofstream f(markdown);
      f << r.md.str();
      MT_CHECK(f.good(), "lab_bench: cannot write ", markdown);
    }
    std::printf("\n");
    for (const auto& l : r.summary) std::printf("%s\n", l.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lab_bench: %s\n", e.what());
    return 1;
  }
}
