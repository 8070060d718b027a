#pragma once
// ZeRO-1 (Rajbhandari et al., "ZeRO: memory optimizations toward training trillion parameter
// models", stage 1): AdamW's state sharded over the N ranks of a data-parallel job.
//
// Unsharded, every rank holds exp_avg and exp_avg_sq for every parameter (8 bytes per fp32
// parameter), all-reduces every gradient and applies the same update N times. Sharded, rank r
// keeps the state of 1/N of the parameters only, and the step becomes:
//
//   backward      the gradient buckets (parallel::GradReducer, sharded) are REDUCE-SCATTERED as
//                 they become final: rank r gets the global gradient of chunk r of every bucket,
//                 its shard. Bucket b's buffer is padded to a multiple of 16 · N elements, so its
//                 N chunks are equal and aligned; a chunk may cut a parameter in two.
//   clip          Σ g² over this rank's shard, all-reduced (one scalar), gives the global norm;
//                 each rank scales its own shard (optim::clip_grad_norm_ with sum_over_ranks).
//   update        the fused AdamW (optim/adamw.h) on this rank's shard only: each piece of a
//                 parameter inside the shard is a view of that parameter, with a view of the
//                 bucket as its .grad, so the update writes the parameter in place.
//   all-gather    each rank copies its updated pieces into its chunk of the bucket buffers
//                 (their gradients are spent), one all_gather per bucket gives every rank every
//                 chunk, and each parameter is copied out of it; bf16/f16 compute copies are then
//                 refreshed from the fp32 values, so they equal what an unsharded update writes.
//                 The buffers are zeroed for the next step's backward (zero_grad).
//
// Collectives per step: B reduce-scatters + 1 all-reduce (the norm) + B all-gathers, for B
// buckets (the unsharded step: B all-reduces). The update is elementwise, so each element gets
// exactly the arithmetic it gets unsharded: with the same gradient bits the weights match
// bitwise.
//
// Checkpoints hold the FULL state, in the unsharded AdamW's format (optim/optimizer.h):
// state_dict() all-gathers it (a collective: every rank calls it), and load_state_dict() takes
// each rank's pieces out of a full state. So a sharded run resumes with any number of ranks,
// sharded or not, and an unsharded run's checkpoint resumes sharded. Loading builds the full state
// once on each rank for a moment.
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/module.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "parallel/communicator.h"
#include "parallel/reducer.h"

namespace mt::train {

class ShardedAdamW {
 public:
  // `groups`: the parameter groups an unsharded AdamW would get (their order fixes the state's
  // indices); `reducer`: a sharded GradReducer over the same parameters, built on `comm`.
  ShardedAdamW(std::vector<optim::ParamGroup> groups, optim::AdamWOptions options,
               std::shared_ptr<parallel::Communicator> comm, parallel::GradReducer& reducer);

  // The clipped global gradient norm (0-dim, on the parameters' device). A collective.
  Tensor clip_grad_norm_(double max_norm);
  // This rank's update, then the all-gather of the parameters. A collective.
  void step();
  // The bucket buffers, every rank's .grad, to zero.
  void zero_grad();

  // The optimizer over this rank's pieces: set_lr and steps_taken act on it.
  optim::AdamW& shard() { return *shard_; }
  // Bytes of optimizer state this rank holds (exp_avg and exp_avg_sq of its pieces).
  int64_t state_bytes() const;

  // The full state, as an unsharded AdamW over `groups` names it. A collective.
  nn::StateDict state_dict();
  // Takes this rank's pieces of a full state (validated as the unsharded AdamW validates it).
  void load_state_dict(const nn::StateDict& full);

 private:
  struct Piece {
    size_t param;         // index across the groups
    size_t reduced;       // index in the reducer's parameters (the model's order)
    size_t bucket;
    int64_t begin, numel;  // in the parameter's flat elements
    int64_t offset;        // where it starts in the bucket's buffer
    Tensor view;           // of the parameter, what the shard optimizer updates
  };
  std::vector<optim::ParamGroup> groups_;
  std::vector<Tensor> params_;  // across the groups, in order
  optim::AdamWOptions options_;
  std::shared_ptr<parallel::Communicator> comm_;
  parallel::GradReducer& reducer_;
  std::vector<Piece> pieces_;
  std::vector<Tensor> clip_order_;  // the pieces' views in the reducer's parameter order
  std::unique_ptr<optim::AdamW> shard_;
};

}  // namespace mt::train
