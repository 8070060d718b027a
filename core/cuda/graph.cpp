#include "core/cuda/graph.h"

#include <algorithm>
#include <exception>
#include <map>
#include <string>
#include <unordered_map>
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

std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t graph) {
  size_t n = 0;
  MT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) MT_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  return nodes;
}

// "kernel 175, mem alloc 120, ...": the nodes counted by kind, most first.
std::string count_kinds(const std::vector<cudaGraphNode_t>& nodes) {
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

// The nodes on the longest path through the graph's dependencies (Kahn's order; a node's depth
// is one more than its deepest dependency's).
size_t count_longest_chain(cudaGraph_t graph, const std::vector<cudaGraphNode_t>& nodes) {
  size_t e = 0;
  std::vector<cudaGraphNode_t> from, to;
#if CUDART_VERSION >= 13000
  // CUDA 13 reports each edge's data too; asking without it fails on an edge that has some (a
  // programmatic launch's), so ask with it.
  MT_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &e));
  std::vector<cudaGraphEdgeData> data(e);
  from.resize(e), to.resize(e);
  if (e > 0) MT_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &e));
#else
  MT_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, &e));
  from.resize(e), to.resize(e);
  if (e > 0) MT_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), &e));
#endif
  std::unordered_map<cudaGraphNode_t, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
  std::vector<std::vector<size_t>> next(nodes.size());
  std::vector<size_t> waiting(nodes.size(), 0), depth(nodes.size(), 1);
  for (size_t i = 0; i < e; ++i) {
    next[index.at(from[i])].push_back(index.at(to[i]));
    ++waiting[index.at(to[i])];
  }
  std::vector<size_t> ready;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (waiting[i] == 0) ready.push_back(i);
  size_t longest = 0;
  while (!ready.empty()) {
    const size_t i = ready.back();
    ready.pop_back();
    longest = std::max(longest, depth[i]);
    for (size_t j : next[i]) {
      depth[j] = std::max(depth[j], depth[i] + 1);
      if (--waiting[j] == 0) ready.push_back(j);
    }
  }
  return longest;
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
  (void)side_stream(device);  // made now: ops may branch onto it during the capture (runtime.h)
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
  const std::vector<cudaGraphNode_t> nodes = nodes_of(graph);
  g.nodes_ = nodes.size();
  g.kinds_ = count_kinds(nodes);
  g.chain_ = count_longest_chain(graph, nodes);
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
  std::swap(chain_, other.chain_);
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
