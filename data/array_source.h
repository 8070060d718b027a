#pragma once
// A Source (data/source.h) over in-memory arrays of features and class labels: the synthetic
// task, MNIST and CSV files (data/data.h) all train through it.
//
// The training Dataset is split once into training and validation rows (split_indices, seeded);
// the loader (data::Loader) forms every step's batch from the training rows as a pure function of
// (seed, step). With `standardize`, the features of every split are standardized by the training
// rows' mean and std (never the held-out rows'); the statistics travel with each checkpoint as the
// metadata "standardization", so the saved model applies exactly the run's transform to new data.
#include <memory>

#include "data/data.h"
#include "data/source.h"

namespace mt::data {

struct ArrayOptions {
  int64_t batch_size = 256;  // samples per step over all ranks
  int64_t microbatches = 4;  // per rank
  double val_fraction = 0.1;
  bool shuffle = true;
  uint64_t seed = 1;  // the split and the shuffles
  bool standardize = false;
};

class ArraySource : public Source {
 public:
  // `test` of size 0: no test set. A `train` of no samples, or NaN or inf in a feature, is a
  // DataError; a val_fraction that holds out no sample, or a training split smaller than one
  // batch, a ConfigError naming the key (data.val_fraction, optim.batch_size).
  ArraySource(Dataset train, Dataset test, ArrayOptions options);
  ~ArraySource() override;

  std::string name() const override { return train_.name; }
  std::vector<std::string> describe() const override;
  void shard(int rank, int world) override;
  int64_t size() const override { return int64_t(split_.train.size()); }
  int64_t batch_size() const override { return options_.batch_size; }
  int64_t shard_size() const override;
  int64_t microbatches() const override { return options_.microbatches; }
  int64_t steps_per_epoch() const override;
  std::vector<Batch> step_batches(int64_t step, Device device) const override;
  int64_t held_out_size(HeldOut which) const override;
  void for_each_held_out(HeldOut which, int64_t batch_size, Device device,
                         const std::function<void(const Batch&)>& visit) const override;
  std::map<std::string, std::string> metadata() const override;

 private:
  Dataset train_, test_;
  ArrayOptions options_;
  Split split_;
  Standardization standardization_;
  std::unique_ptr<Loader> loader_;
};

// The rows `rows` of `set` in batches of at most `batch_size`, in order, on `device`: what
// evaluation reads.
void for_each_batch(const Dataset& set, const std::vector<int64_t>& rows, int64_t batch_size,
                    Device device, const std::function<void(const Batch&)>& visit);

}  // namespace mt::data
