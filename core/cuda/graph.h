#pragma once
// A CUDA graph of the work on the framework stream: recorded once, replayed many times, so a
// whole training step costs one launch on the host instead of a few hundred.
//
//   optimizer.step();                               // one eager step first: state, grads, plans
//   optimizer.zero_grad(/*set_to_none=*/false);     // .grad stays allocated: the graph adds into it
//   cuda::Graph g = cuda::Graph::capture(0, [&] { forward/backward...; optimizer.apply_step();
//                                                  optimizer.zero_grad(false); });
//   for (each step) { copy the batch into the inputs; optimizer.prepare_step(); g.replay(); }
//
// capture() runs body() with the framework stream of `device` in capture mode: nothing executes;
// each kernel, copy, cuBLAS call and stream-ordered allocation it enqueues is recorded in order,
// with its arguments and pointers. replay() launches all of it again on that stream.
//
// What body() must respect. The first rule is enforced (capture() throws, and no device work has
// run); breaking the others gives wrong replays or a failing second replay:
//  - no host synchronization and no synchronous copy (CUDA refuses them during a capture);
//  - whatever outlives a replay (parameters, .grad, optimizer state, input buffers, the loss
//    accumulator) exists before the capture: memory allocated inside body() is carved from a
//    block the graph reserves just before the capture (core/cuda/runtime.h, GraphMemory), and
//    bytes freed inside body() are reused by later allocations of the same capture;
//  - what changes from step to step is read from device memory written before each replay (the
//    batch, copied into the same input tensors; AdamW's lr and bias corrections, prepare_step).
// body()'s host-side effects (autograd bookkeeping, counters) happen once, at capture.
#include <cstddef>
#include <functional>
#include <string>

#include <cuda_runtime.h>

namespace mt::cuda {

struct GraphMemory;  // core/cuda/runtime.h

class Graph {
 public:
  // Records body() on device `device`'s framework stream and instantiates it. A failure (body()
  // threw, or did something a capture refuses) is an mt::Error that names it; the stream is
  // usable again afterwards.
  static Graph capture(int device, const std::function<void()>& body);

  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();

  // Launches the recorded work on the framework stream; returns without waiting for it.
  void replay() const;
  size_t num_nodes() const { return nodes_; }
  // The nodes by kind, most first: "kernel 175, mem alloc 120, mem free 120, memset 12, ...".
  // Stream-ordered allocations made and freed inside the body are two nodes each.
  const std::string& node_kinds() const { return kinds_; }
  // The nodes on its longest chain of dependencies: what a replay must run one after another.
  // Equal to num_nodes() when everything was recorded on one stream; less where an op ran part
  // of its work on a side branch (core/cuda/runtime.h, SideBranch).
  size_t longest_chain() const { return chain_; }

 private:
  Graph() = default;
  int device_ = 0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
  std::string kinds_;
  size_t chain_ = 0;
  GraphMemory* memory_ = nullptr;  // the block the capture's allocations were carved from
};

}  // namespace mt::cuda
