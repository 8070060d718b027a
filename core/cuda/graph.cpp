#include "core/cuda/graph.h"

#include <algorithm>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/error.h"

namespace mt::cuda {
namespace {

const char* kind_name(cudaGraphNodeType t) {
  switch (t) {
    case cudaGraphNodeTypeKernel: return "kernel";
    case cudaGraphNodeTypeMemcpy: return "memcpy";
    case cudaGraphNodeTypeMemset: return "memset";
    case cudaGraphNodeTypeHost: return "host";
    case cudaGraphNodeTypeGraph: return "child graph";
    case cudaGraphNodeTypeEmpty: return "empty";
    case cudaGraphNodeTypeWaitEvent: return "event wait";
    case cudaGraphNodeTypeEventRecord: return "event record";
    case cudaGraphNodeTypeMemAlloc: return "mem alloc";
    case cudaGraphNodeTypeMemFree: return "mem free";
    default: return "other";
  }
}

// "kernel 175, mem alloc 120, ...": the nodes of `graph` counted by kind, most first.
std::string count_kinds(cudaGraph_t graph, size_t n) {
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) MT_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::map<std::string, size_t> count;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    MT_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    ++count[kind_name(t)];
  }
  std::vector<std::pair<std::string, size_t>> sorted(count.begin(), count.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (const auto& [kind, k] : sorted)
    out += (out.empty() ? "" : ", ") + kind + " " + std::to_string(k);
  return out;
}

}  // namespace

Graph Graph::capture(int device, const std::function<void()>& body) {
  set_device(device);
  cudaStream_t s = stream(device);
  // Thread-local mode: a call of this thread that is unsafe during a capture (a cudaMalloc, a
  // synchronous copy) fails, instead of silently running outside the graph.
  // The graph's own memory, reserved before the capture (runtime.h, GraphMemory). The guard
  // stops the carving on every way out of here, and gives the block back unless a Graph took it.
  struct Carving {
    GraphMemory* memory;
    bool kept = false;
    ~Carving() {
      end_graph_memory();
      try {
        if (!kept) release_graph_memory(memory);
      } catch (const std::exception&) {  // a destructor must not throw; the block is only leaked
      }
    }
  } carving{begin_graph_memory(device, graph_memory_hint(device))};
  MT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  std::string failure;
  try {
    body();
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "body() threw something that is not a std::exception";
  }
  end_graph_memory();
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
  g.memory_ = carving.memory;
  carving.kept = true;
  g.device_ = device;
  g.graph_ = graph;
  MT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &g.nodes_));
  g.kinds_ = count_kinds(graph, g.nodes_);
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
  std::swap(kinds_, other.kinds_);
  std::swap(memory_, other.memory_);
  return *this;
}

Graph::~Graph() {
  // Destructors must not throw; CUDA keeps the executable alive until a pending launch is done.
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
  try {
    release_graph_memory(memory_);  // freed in stream order, after any pending replay
  } catch (const std::exception&) {  // a destructor must not throw; the block is only leaked
  }
}

void Graph::replay() const {
  MT_CHECK(exec_ != nullptr, "Graph::replay: the graph is empty (moved from)");
  MT_CUDA_CHECK(cudaGraphLaunch(exec_, stream(device_)));
}

}  // namespace mt::cuda
