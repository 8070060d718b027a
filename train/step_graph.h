#pragma once
// The trainer's captured step (train/step_graph.cpp, cuda_graph: true): the CUDA graph and the
// input buffers each replay's batch is copied into. Internal to the trainer's sources.
#include <vector>

#include "data/source.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/graph.h"
#endif

namespace mt::train {

#ifdef MT_WITH_CUDA
struct StepGraph {
  std::vector<data::Batch> inputs;  // each step's batch is copied into these
  cuda::Graph graph;
};
#else
struct StepGraph {};
#endif

}  // namespace mt::train
