#include "core/device.h"

#include <charconv>
#include <string>

#include "core/error.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace mt {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return kCPU;
  if (s == "cuda") return cuda_device(0);
  int index = 0;
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s[5] != '+' && s[5] != '-') {
    const auto [end, ec] = std::from_chars(s.data() + 5, s.data() + s.size(), index);
    MT_CHECK(ec != std::errc::result_out_of_range, "Device::parse: device index in '", s,
             "' is out of range");
    if (ec == std::errc() && end == s.data() + s.size()) return cuda_device(index);
  }
  MT_THROW("Device::parse: expected 'cpu', 'cuda' or 'cuda:N', got '", s, "'");
}

bool cuda_available() { return cuda_device_count() > 0; }

void check_device_errors(Device device, const std::string& context) {
#ifdef MT_WITH_CUDA
  if (!device.is_cuda()) return;
  try {
    cuda::synchronize(device.index);
  } catch (const Error& e) {
    if (context.empty()) throw;
    throw Error(context + ": " + e.what());
  }
#else
  (void)device, (void)context;  // CPU kernels throw at once: nothing is ever waiting
#endif
}

int cuda_device_count() {
#ifdef MT_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

}  // namespace mt
