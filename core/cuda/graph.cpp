#include "core/cuda/graph.h"

#include <exception>
#include <string>
#include <utility>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/error.h"

namespace mt::cuda {

Graph Graph::capture(int device, const std::function<void()>& body) {
  set_device(device);
  cudaStream_t s = stream(device);
  // Thread-local mode: a call of this thread that is unsafe during a capture (a cudaMalloc, a
  // synchronous copy) fails, instead of silently running outside the graph.
  MT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  std::string failure;
  try {
    body();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Ending the capture is what returns the stream to normal, even after a failure.
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  (void)cudaGetLastError();  // a refused call during the capture is not a sticky error
  if (failure.empty() && end != cudaSuccess)
    failure = detail::concat(cudaGetErrorName(end), ": ", cudaGetErrorString(end));
  if (!failure.empty()) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    MT_THROW("CUDA graph capture on cuda:", device, " failed: ", failure);
  }
  Graph g;
  g.device_ = device;
  g.graph_ = graph;
  MT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &g.nodes_));
  MT_CUDA_CHECK(cudaGraphInstantiate(&g.exec_, graph, 0));
  MT_CUDA_CHECK(cudaGraphUpload(g.exec_, s));  // the first replay costs no more than the others
  return g;
}

Graph::Graph(Graph&& other) noexcept { *this = std::move(other); }

Graph& Graph::operator=(Graph&& other) noexcept {
  std::swap(device_, other.device_);
  std::swap(graph_, other.graph_);
  std::swap(exec_, other.exec_);
  std::swap(nodes_, other.nodes_);
  return *this;
}

Graph::~Graph() {
  // Destructors must not throw; CUDA keeps the executable alive until a pending launch is done.
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
}

void Graph::replay() const {
  MT_CHECK(exec_ != nullptr, "Graph::replay: the graph is empty (moved from)");
  MT_CUDA_CHECK(cudaGraphLaunch(exec_, stream(device_)));
}

}  // namespace mt::cuda
