#pragma once
// What the trainer trains on: a Source hands out each optimizer step's batch as microbatches of
// (input, target) tensors, and the held-out data it is evaluated on. The trainer (train/trainer.h)
// asks nothing else of the data, so any kind of data that can say this trains through it:
// features and class labels (data::ArraySource, data/array_source.h), or token ids whose targets
// are the next tokens (input and target both int64 [B, T]).
//
// Step `s`'s microbatches must be a pure function of s (and the rank): a resumed run asks for the
// batches of the steps after its checkpoint and must see exactly what an uninterrupted run saw,
// with no loader state in the checkpoint.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt::data {

// One microbatch, on the run's device. x: the model's input (float features are converted to the
// compute dtype by the trainer; integer inputs such as token ids are passed as they are);
// y: the target the task's loss compares against (class labels [n], token ids [B, T], ...).
struct Batch {
  Tensor x, y;
};

enum class HeldOut { validation, test };

class Source {
 public:
  virtual ~Source() = default;

  // A short name for the log and the loss curve's title ("synthetic", "mnist", "data.csv").
  virtual std::string name() const = 0;
  // Lines for the start of the run's log: sizes, where the data came from.
  virtual std::vector<std::string> describe() const { return {name()}; }

  // Data parallelism: from now on this source serves rank `rank` of `world`, each rank its shard
  // of every step's batch. Called by the trainer once, before the first batch; a source that
  // cannot split its batch so throws mt::ConfigError.
  virtual void shard(int rank, int world) = 0;

  // Samples in one pass over the training data.
  virtual int64_t size() const = 0;
  // Samples in one step's batch over all ranks: each microbatch's loss is divided by it, so the
  // step's backward passes add up to the gradient of the batch's mean loss.
  virtual int64_t batch_size() const = 0;
  // This rank's samples per step.
  virtual int64_t shard_size() const = 0;
  virtual int64_t microbatches() const = 0;
  // Steps in one pass over the training data (whole batches only).
  virtual int64_t steps_per_epoch() const = 0;
  // This rank's microbatches of optimizer step `step` (from 0), on `device`.
  virtual std::vector<Batch> step_batches(int64_t step, Device device) const = 0;

  // Samples held out for validation or testing (0: none), and those samples in batches of at most
  // `batch_size`, on `device`, in a fixed order.
  virtual int64_t held_out_size(HeldOut which) const = 0;
  virtual void for_each_held_out(HeldOut which, int64_t batch_size, Device device,
                                 const std::function<void(const Batch&)>& visit) const = 0;

  // String metadata saved with every checkpoint (e.g. the feature standardization), for whoever
  // uses the saved model on new data.
  virtual std::map<std::string, std::string> metadata() const { return {}; }
};

}  // namespace mt::data
