// `train`: the command-line entry point. (The trainer lands on top of this; for now it lists the
// registered ops.)
#include <cstdio>
#include <cstring>

#include "core/registry.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--version")) {
      std::printf("minitrain %s\n", MT_VERSION);
      return 0;
    }
  std::fputs(mt::OpRegistry::instance().table().c_str(), stdout);
  return 0;
}
