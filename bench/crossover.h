#pragma once
// Save or recompute? The arithmetic behind the rule that decides it (docs/README.md, "The
// crossover"), for any GPU.
//
// A backward kernel needs a per-element value v that the forward also computed (σ(x) in
// scaled-SiLU, x̂ = x·rstd in RMSNorm). It can have it two ways:
//   save       the forward writes v, B bytes per element, and the backward reads it back:
//              2·B bytes per element, moved at the copy bandwidth (which counts reads and writes);
//   recompute  the backward computes v again from what it reads anyway: F flops per element.
// Per element, the two extra costs are
//   t_save = 2·B / bandwidth        t_recompute = F / flop_rate
// and they are equal at the crossover F* = 2·B · (flop_rate / bandwidth). flop_rate / bandwidth
// is the machine's balance point: how many flops it can do in the time it moves one byte. Below
// F* recomputing is cheaper, above it saving is.
//
// This is the simplest model: it charges each cost in full, as if nothing overlapped. In a
// memory-bound kernel the recompute's flops also hide under loads the kernel waits for anyway,
// which only moves the verdict further toward recomputing. Which rate applies matters more: an
// elementwise recompute runs on the fp32 units; only a recompute that is itself a matrix product
// runs on the tensor cores at the bf16 rate.
//
// Units throughout: bandwidth in GB/s (1e9 bytes), rates in TFLOP/s (1e12 flops), an FMA = 2
// flops. docs/crossover.js is the same arithmetic for the page docs/crossover.html; the test
// tests/crossover_page.test.js holds the two to each other.

namespace mt::crossover {

// The H200 figures, measured by bench/bench_crossover.cu on 2026-11-30: device-to-device copy
// bandwidth (read + write counted), an fp32 FMA kernel and an 8192³ bf16 cuBLAS GEMM.
struct Gpu {
  double bandwidth_gbs = 4264;
  double fp32_tflops = 65.0;
  double bf16_tflops = 788.6;
};

// Flops the GPU does in the time it moves one byte.
inline double balance_flops_per_byte(double tflops, double bandwidth_gbs) {
  return tflops * 1e12 / (bandwidth_gbs * 1e9);
}

// Bytes moved to save a value of `bytes_per_element` and read it back.
inline double round_trip_bytes(double bytes_per_element) { return 2 * bytes_per_element; }

// The recompute cost, in flops per element, at which saving and recomputing take the same time.
inline double crossover_flops_per_element(double tflops, double bandwidth_gbs,
                                          double bytes_per_element) {
  return round_trip_bytes(bytes_per_element) * balance_flops_per_byte(tflops, bandwidth_gbs);
}

// Seconds to write `elements` values and read them back.
inline double save_seconds(double elements, double bytes_per_element, double bandwidth_gbs) {
  return elements * round_trip_bytes(bytes_per_element) / (bandwidth_gbs * 1e9);
}

// Seconds to recompute `elements` values at `flops_per_element` each.
inline double recompute_seconds(double elements, double flops_per_element, double tflops) {
  return elements * flops_per_element / (tflops * 1e12);
}

enum class Choice { recompute, save, either };

// The cheaper side for a recompute of `flops_per_element`, against the crossover.
inline Choice cheaper(double flops_per_element, double crossover) {
  if (flops_per_element < crossover) return Choice::recompute;
  if (flops_per_element > crossover) return Choice::save;
  return Choice::either;
}

inline const char* choice_name(Choice c) {
  switch (c) {
    case Choice::recompute: return "recompute";
    case Choice::save: return "save";
    default: return "either";
  }
}

}  // namespace mt::crossover
