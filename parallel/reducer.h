#pragma once
// GradReducer: data parallelism's gradient all-reduce, bucketed and started from inside the
// last backward of an optimizer step (the design of PyTorch DDP, with gradient_as_bucket_view).
//
// The contract: k microbatches on each of N ranks give the gradient of N·k microbatches on one
// rank. Each rank divides its loss by the GLOBAL batch size, so after the last backward rank r
// holds g_r = ∂(its share of the global loss)/∂θ, and the full-batch gradient is g = Σ_r g_r: the
// reduction is a plain sum, no division by N.
//
// Layout. The parameters are grouped into buckets in REVERSE order, because the backward produces
// gradients roughly from the last layer back: bucket 0 is complete first. A bucket holds
// parameters up to `bucket_bytes` (a larger parameter gets a bucket of its own). Each bucket owns
// one flat, zero-filled gradient buffer, and every parameter's .grad is a view of its slice
// (offsets padded to 16 elements, so vectorized kernels stay aligned). Backward passes add into
// those views, and one all_reduce_sum per bucket reduces them in place: no copies.
//
// Timing. Gradients are all-reduced ONCE per optimizer step, never per microbatch:
//
//   for each microbatch i of k:
//     if (i == k - 1) reducer.prepare_for_last_backward();  // arms the hooks
//     loss_i.backward();   // earlier ones only accumulate; the last one launches bucket b as
//                          // soon as every parameter of b has its final gradient
//   reducer.finish();      // the buckets no gradient reached, then comm->wait()
//   optimizer.step(); zero_grad(/*set_to_none=*/false);
//
// Buckets are launched strictly in index order (a bucket that completes early waits for the ones
// before it), so every rank issues the same collectives in the same order.
//
// The buckets live on the parameters' device at construction: build the reducer after moving
// the model (Module::to), and after anything else that replaces parameters or their .grad.
//
// Sharded (ZeRO-1, train/zero.h): each bucket is reduce-scattered instead of all-reduced, so rank
// r holds the global gradient only in chunk r of every bucket, the part of the parameters whose
// optimizer state it keeps. Buffers are then padded to a multiple of 16 · N elements, so every
// chunk is equal and starts aligned.
//
// zero_grad should keep the views (set_to_none=false, which fills them with zeros). If .grad
// was freed or replaced anyway, prepare_for_last_backward() puts the view back, carrying over the
// values the earlier microbatches accumulated.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/communicator.h"

namespace mt::parallel {

class GradReducer {
 public:
  // `params`: leaves that require grad, all on one device with one gradient dtype.
  GradReducer(std::vector<Tensor> params, std::shared_ptr<Communicator> comm,
              size_t bucket_bytes = size_t(25) << 20, bool shard = false);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Call just before the last microbatch's backward of an optimizer step.
  void prepare_for_last_backward();
  // Call after that backward: reduces every bucket not reduced yet, then waits for the
  // communicator. Every rank then holds the global-batch gradient.
  void finish();

  // true (the default): each bucket is all-reduced as soon as its gradients are final, while the
  // rest of the backward runs; false: every bucket in finish(), after the backward. Which is
  // faster depends on how much the collectives slow the backward's kernels down
  // (docs/distributed.md has the measurement).
  void set_overlap(bool overlap);

  struct Bucket {
    std::vector<size_t> params;    // indices into the constructor's `params`, in bucket order
    std::vector<int64_t> offsets;  // each one's first element in the buffer (a multiple of 16)
    int64_t numel = 0;             // the buffer's length, padding included
    Tensor buffer;                 // the flat gradient buffer the parameters' .grad views
  };
  bool sharded() const;
  const std::vector<Tensor>& params() const;  // the constructor's, which Bucket::params index
  int num_buckets() const;
  const std::vector<Bucket>& buckets() const;
  std::string layout_str() const;  // one line per bucket, for logs

  struct State;  // shared with the grad-ready hooks, which outlive the reducer

 private:
  std::shared_ptr<State> state_;
};

}  // namespace mt::parallel
