#pragma once
// The op registry: every op registers its kernels by name, {forward, backward} x {cpu, cuda}.
//
// An op's kernels share one Tensor-level signature per phase (declared in the op's header), so
// the Function looks its kernel up by the input's device and calls it the same way on any device:
//
//   auto* fwd = kernel<ScaledSiLUForwardFn>("scaled_silu", Phase::Forward, x.device());
//   fwd(x, w, y);
//
// Registration is static (MT_REGISTER_KERNEL at namespace scope of the op's .cpp or .cu), so
// adding a backend means adding a file, not editing a switch.
#include <any>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"

namespace mt {

enum class Phase : uint8_t { Forward, Backward };

class OpRegistry {
 public:
  static OpRegistry& instance();

  void add(const std::string& op, Phase phase, DeviceType device, std::any fn);
  // Registers the one-line math an op computes, for the table.
  void describe(const std::string& op, const std::string& math);
  const std::any* find(const std::string& op, Phase phase, DeviceType device) const;
  std::vector<std::string> ops() const;
  // The table `train --list-ops` prints: op, math, and which kernels exist.
  std::string table() const;

 private:
  struct Entry {
    std::string math;
    std::map<std::pair<Phase, DeviceType>, std::any> kernels;
  };
  std::map<std::string, Entry> entries_;
};

// The kernel `op` registered for `phase` on `device`'s type, or an mt::Error saying which is
// missing (a CUDA kernel in a build without CUDA, say).
template <class Fn>
Fn* kernel(const std::string& op, Phase phase, Device device) {
  const std::any* a = OpRegistry::instance().find(op, phase, device.type);
  MT_CHECK(a, op, ": no ", phase == Phase::Forward ? "forward" : "backward", " kernel registered for ",
           device.is_cpu() ? "cpu" : "cuda",
           device.is_cuda() ? " (is this build compiled with CUDA?)" : "");
  Fn* const* fn = std::any_cast<Fn*>(a);
  MT_CHECK(fn, op, ": registered kernel has a different signature than the caller expects");
  return *fn;
}

struct KernelRegistrar {
  template <class Fn>
  KernelRegistrar(const char* op, Phase phase, DeviceType device, Fn* fn) {
    OpRegistry::instance().add(op, phase, device, std::any(fn));
  }
  KernelRegistrar(const char* op, const char* math) { OpRegistry::instance().describe(op, math); }
};

#define MT_CONCAT_INNER(a, b) a##b
#define MT_CONCAT(a, b) MT_CONCAT_INNER(a, b)
// MT_REGISTER_KERNEL(scaled_silu, Forward, CPU, scaled_silu_forward_cpu);
#define MT_REGISTER_KERNEL(op, phase, device, fn)                                   \
  static const ::mt::KernelRegistrar MT_CONCAT(mt_registrar_, __LINE__)(            \
      #op, ::mt::Phase::phase, ::mt::DeviceType::device, fn)
// MT_DESCRIBE_OP(scaled_silu, "y = w * x * sigmoid(x)");
#define MT_DESCRIBE_OP(op, math) \
  static const ::mt::KernelRegistrar MT_CONCAT(mt_registrar_, __LINE__)(#op, math)

// Reductions over the batch (dW of RMSNorm, dw of scaled-SiLU, db) use fixed-order two-pass
// partials by default: the same bits on every run. false allows the atomic variants.
bool deterministic();
void set_deterministic(bool on);

}  // namespace mt
