// What one node of a CUDA graph costs on this GPU, before its kernel does any work: the floor
// under a step made of many tiny kernels (the small train step, docs/perf.md).
//
// A graph of kNodes dependent launches of a kernel that copies one float per thread (each reads
// what the previous one wrote), for grids of 16, 128 and 512 blocks of 256 threads, recorded once
// and replayed; the best of kReplays replays, divided by kNodes. Then the same with programmatic
// dependent launch (the cudaLaunchAttributeProgrammaticStreamSerialization attribute, sm_90+):
// each kernel lets the next one launch before it ends, and the next waits
// (griddepcontrol.wait) for it to finish before reading its output.
#include <algorithm>
#include <cstdio>

#include <cuda_runtime.h>

#include "core/cuda/check.h"

namespace {

constexpr int kNodes = 100;
constexpr int kReplays = 20;
constexpr int kThreads = 256;

template <bool kEarlyLaunch>
__global__ void step_kernel(const float* in, float* out, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (kEarlyLaunch) {
    asm volatile("griddepcontrol.wait;" ::: "memory");  // the previous kernel's writes are visible
    asm volatile("griddepcontrol.launch_dependents;");  // the next kernel may start launching
  }
#endif
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * 1.0001f + 1.0f;
}

// Microseconds per node of a replayed graph of kNodes launches of `blocks` blocks each.
float us_per_node(int blocks, bool early_launch, float* a, float* b, cudaStream_t s) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = early_launch ? 1 : 0;
  const int n = blocks * kThreads;
  cudaGraph_t graph;
  MT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < kNodes; ++k) {
    const float* in = k % 2 ? b : a;
    float* out = k % 2 ? a : b;
    if (early_launch) MT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, step_kernel<true>, in, out, n));
    else MT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, step_kernel<false>, in, out, n));
  }
  MT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  MT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  MT_CUDA_CHECK(cudaEventCreate(&start));
  MT_CUDA_CHECK(cudaEventCreate(&stop));
  float best = 1e30f;
  for (int r = 0; r < kReplays; ++r) {
    MT_CUDA_CHECK(cudaEventRecord(start, s));
    MT_CUDA_CHECK(cudaGraphLaunch(exec, s));
    MT_CUDA_CHECK(cudaEventRecord(stop, s));
    MT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, ms);
  }
  MT_CUDA_CHECK(cudaEventDestroy(start));
  MT_CUDA_CHECK(cudaEventDestroy(stop));
  MT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MT_CUDA_CHECK(cudaGraphDestroy(graph));
  return best * 1000.0f / kNodes;
}

}  // namespace

int main() {
  try {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      std::fprintf(stderr, "bench_graph_nodes: no CUDA device\n");
      return 1;
    }
    int device = 0, major = 0;
    MT_CUDA_CHECK(cudaGetDevice(&device));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    const int max_blocks = 512;
    const size_t bytes = size_t(max_blocks) * kThreads * sizeof(float);
    float *a = nullptr, *b = nullptr;
    MT_CUDA_CHECK(cudaMalloc(&a, bytes));
    MT_CUDA_CHECK(cudaMalloc(&b, bytes));
    MT_CUDA_CHECK(cudaMemset(a, 0, bytes));
    cudaStream_t s;
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int blocks : {16, 128, max_blocks}) {
      const float plain = us_per_node(blocks, false, a, b, s);
      if (major >= 9)
        std::printf("bench_graph_nodes: %d dependent kernels of %3d blocks in one graph: %.2f us "
                    "per node; with programmatic dependent launch %.2f us\n",
                    kNodes, blocks, plain, us_per_node(blocks, true, a, b, s));
      else
        std::printf("bench_graph_nodes: %d dependent kernels of %3d blocks in one graph: %.2f us "
                    "per node (programmatic dependent launch needs sm_90)\n", kNodes, blocks, plain);
    }
    MT_CUDA_CHECK(cudaStreamDestroy(s));
    MT_CUDA_CHECK(cudaFree(a));
    MT_CUDA_CHECK(cudaFree(b));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_graph_nodes: %s\n", e.what());
    return 1;
  }
}
