#pragma once
// Where a tensor's memory lives: the host (cpu) or GPU number N (cuda:N).
#include <cstdint>
#include <string>

namespace mt {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

  // "cpu", "cuda" (= cuda:0) or "cuda:N"; throws mt::Error on anything else.
  static Device parse(const std::string& s);
};

inline const Device kCPU{};
inline Device cuda_device(int index = 0) { return {DeviceType::CUDA, index}; }

// True when this build has CUDA and at least one GPU is visible (never throws).
bool cuda_available();
// Number of visible GPUs (0 in a build without CUDA).
int cuda_device_count();

// Waits for `device`'s work, then raises what its kernels recorded as bad input (a CUDA
// cross_entropy target out of range; core/cuda/runtime.h, "device-side error reports") as an
// mt::Error whose message starts with `context` (the trainer passes the step). item(), to(kCPU)
// and every other read back check the same way; this is for a place that waits anyway. A no-op
// on the CPU, whose kernels throw at once.
void check_device_errors(Device device, const std::string& context = "");

}  // namespace mt
