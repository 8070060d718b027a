// `train`: the command-line program (app/cli.h), with what this build was configured with for
// --version (CMakeLists.txt passes these definitions to this file only).
#include <string>

#include "app/cli.h"

#ifndef MT_GIT_COMMIT
#define MT_GIT_COMMIT "unknown"
#endif
#ifndef MT_BUILD_TYPE
#define MT_BUILD_TYPE "unknown"
#endif
#ifndef MT_CUDA_ARCHS
#define MT_CUDA_ARCHS "none"
#endif

int main(int argc, char** argv) {
  const std::string version = std::string("minitrain ") + MT_VERSION + "\ncommit " + MT_GIT_COMMIT +
                              "\nbuild type " + MT_BUILD_TYPE + "\nCUDA " +
#ifdef MT_WITH_CUDA
                              "on, architectures " MT_CUDA_ARCHS
#else
                              "off (a CPU-only build)"
#endif
                              + "\nNCCL " +
#ifdef MT_WITH_NCCL
                              "on"
#else
                              "off"
#endif
                              + "\n";
  return mt::app::run_cli(argc, argv, version);
}
