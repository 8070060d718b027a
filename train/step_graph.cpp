// cuda_graph: true — the step (microbatches, clipping, the update, zero_grad) recorded once in a
// CUDA graph and replayed on every step that is neither logged nor saved (train/trainer.h): which
// runs can be captured, the capture, and a replay.
#include <cmath>

#include <spdlog/spdlog.h>

#include "train/step_graph.h"
#include "train/trainer.h"

namespace mt::train {

std::string Trainer::graph_blocker() const {
  if (!device_.is_cuda()) return "the device is " + device_.str() + ", and CUDA graphs need a GPU";
  if (reducer_) return "data parallelism all-reduces on a stream of its own, outside the graph";
  if (!optimizer_->capturable())
    return "optimizer " + options_.optimizer.name + " keeps its per-step values on the host (adamw does not)";
  if (scaler_.enabled()) return "f16 loss scaling decides on the host whether each step is applied";
  if (step_callback_) return "a step callback is set, and it runs between the backward and the update";
  return "";
}

bool Trainer::capture_step(const Tensor& loss_sum, const Tensor& grad_norm) {
#ifdef MT_WITH_CUDA
  const std::vector<Tensor> params = model_->parameters();
  const double max_norm = options_.optimizer.clip_norm > 0 ? options_.optimizer.clip_norm : INFINITY;
  std::vector<data::Batch> inputs = data_->step_batches(step_, device_);
  try {
    // apply_step() records the update prepare_step() laid out in the previous (eager) step: the
    // same parameters, state and device scalars, which is all a replay needs.
    cuda::Graph graph = cuda::Graph::capture(device_.index, [&] {
      microbatch_passes(inputs, loss_sum, nullptr);
      clip_gradients(params, max_norm, grad_norm);  // as the eager step: the same kernels
      optimizer_->apply_step();
      optimizer_->zero_grad(/*set_to_none=*/false);
    });
    if (lead())
      spdlog::info("cuda_graph: step {} captured ({} nodes, {} on the longest chain); replayed "
                   "on every step not logged or saved", step_ + 1, graph.num_nodes(),
                   graph.longest_chain());
    graph_ = std::make_unique<StepGraph>(StepGraph{std::move(inputs), std::move(graph)});
    return true;
  } catch (const Error& e) {
    spdlog::warn("cuda_graph: {}; every step runs eagerly", e.what());
    return false;
  }
#else
  (void)loss_sum, (void)grad_norm;
  return false;
#endif
}

void Trainer::replay_step() {
#ifdef MT_WITH_CUDA
  const auto batches = data_->step_batches(step_, device_);
  for (size_t i = 0; i < batches.size(); ++i) {
    graph_->inputs[i].x.copy_(batches[i].x);
    graph_->inputs[i].y.copy_(batches[i].y);
  }
  optimizer_->prepare_step();  // this step's lr and bias corrections, to the device
  graph_->graph.replay();
#endif
}

}  // namespace mt::train
