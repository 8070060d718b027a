// Asks the op registry, and nothing else, for the kernels named on the command line, each as
// op:Phase:Device (e.g. linear:Forward:CUDA; scripts/check-package.sh lists every
// MT_REGISTER_KERNEL in the sources). Exits non-zero if any is missing: the op's objects were
// dropped at link time, or the build lacks the backend.
#include <cstdio>
#include <string>

#include "core/registry.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: consumer_registry op:Phase:Device...\n");
    return 2;
  }
  int missing = 0, cuda = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string entry = argv[i];
    const size_t a = entry.find(':'), b = entry.rfind(':');
    if (a == std::string::npos || a == b) {
      std::fprintf(stderr, "consumer_registry: bad entry '%s' (expected op:Phase:Device)\n", argv[i]);
      return 2;
    }
    const std::string op = entry.substr(0, a), phase = entry.substr(a + 1, b - a - 1),
                      device = entry.substr(b + 1);
    const mt::Phase ph = phase == "Forward" ? mt::Phase::Forward : mt::Phase::Backward;
    const mt::DeviceType dev = device == "CUDA" ? mt::DeviceType::CUDA : mt::DeviceType::CPU;
    cuda += dev == mt::DeviceType::CUDA;
    if (mt::OpRegistry::instance().find(op, ph, dev) == nullptr) {
      std::fprintf(stderr, "consumer_registry: no %s kernel registered for %s on %s\n",
                   phase.c_str(), op.c_str(), device.c_str());
      ++missing;
    }
  }
#ifndef MT_WITH_CUDA
  if (cuda > 0) {
    std::fprintf(stderr, "consumer_registry: CUDA kernels expected but MT_WITH_CUDA did not reach "
                         "the consumer\n");
    return 1;
  }
#endif
  // And the registry's own startup check: every defined op complete for this build.
  try {
    mt::verify_ops();
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "consumer_registry: %s\n", e.what());
    return 1;
  }
  std::printf("consumer_registry: %d of %d kernels registered (%d CUDA), verify_ops ok\n",
              argc - 1 - missing, argc - 1, cuda);
  return missing == 0 ? 0 : 1;
}
