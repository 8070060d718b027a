#pragma once
// Datasets and the batch loader.
//
// Every source (the generated default, MNIST IDX files, CSV) is read once into an in-memory
// Dataset of float features and int64 labels. The loader then forms each optimizer step's batch
// as a pure function of (seed, step): epoch e's order is a Fisher-Yates shuffle drawn from a
// generator seeded by (seed, e), so a resumed run sees exactly the batches an uninterrupted run
// would, with no loader state to save.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/source.h"

namespace mt::data {

// A data file that cannot be read or parsed: the message names the file and, for text, the line
// and column. `train` exits with code 4. (Data that parses but does not fit the config, such as
// the wrong number of features for model.input, is a ConfigError: the fix is in the config.)
struct DataError : Error {
  using Error::Error;
};

struct Dataset {
  std::vector<float> features;  // [size, dim], row-major
  std::vector<int64_t> labels;  // [size], in [0, classes)
  int64_t size = 0, dim = 0, classes = 0;
  std::vector<int64_t> sample_shape;  // mnist: {rows, cols} of an image (dim = rows · cols); else empty
  std::string name;
  std::string file;        // the file it was read from (empty: generated), for messages
  bool had_header = false;  // csv: its first line was a header, skipped

  // The rows `indices` as tensors: x [n, dim] f32 and y [n] i64, on `device`.
  std::pair<Tensor, Tensor> gather(const std::vector<int64_t>& indices, Device device) const;
};

// A classification task that needs no download: `classes` Gaussian clusters in `dim` dimensions.
// Centers are drawn from N(0, 1) once per seed; a sample is its class center plus N(0, noise²)
// per coordinate, so `noise` sets how much the classes overlap (and the best reachable accuracy).
// `draw` picks an independent set of samples from the same clusters (0: training, 1: test).
Dataset make_synthetic(int64_t samples, int64_t dim, int64_t classes, double noise, uint64_t seed,
                       uint64_t draw = 0);

// MNIST in its standard IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, optionally
// .gz) from `dir`; `test` picks the t10k-* files. Pixels are scaled to [0, 1] and normalized with
// MNIST's mean 0.1307 and std 0.3081.
Dataset load_mnist(const std::string& dir, bool test);

// Numeric CSV: every column but the label is a feature.
Dataset load_csv(const std::string& path, int64_t label_column, bool header);

// Standardization of the features (data.standardize): x' = (x - mean) / std per feature, with
// the mean and the population std of the training split (never the validation or test rows, so
// nothing held out leaks into training). A feature that is constant there has std 1: it becomes
// 0. The statistics are saved with every checkpoint, so `train eval` and `train predict` apply
// exactly the run's transform to new data.
struct Standardization {
  std::vector<float> mean, std;  // [dim] each; empty: none
  bool empty() const { return mean.empty(); }
};
Standardization standardization_of(const Dataset& set, const std::vector<int64_t>& rows);
// Applies `s` to `features` ([n, s.mean.size()], row-major) in place.
void standardize(std::vector<float>& features, const Standardization& s);
// As text for a checkpoint's metadata ({"mean": [...], "std": [...]} with every float exact)
// and back; from_text throws DataError for text that is not such an object.
std::string to_text(const Standardization& s);
Standardization standardization_from_text(const std::string& text, const std::string& where);

// The samples val_fraction holds out of `size` for validation (split_indices splits so).
inline int64_t validation_samples(int64_t size, double val_fraction) {
  return int64_t(std::llround(val_fraction * double(size)));
}

// The rows `rows` of `set`, in that order, as a dataset of their own (name, file, classes kept).
Dataset take_rows(const Dataset& set, const std::vector<int64_t>& rows);

// Splits [0, size) into a training and a held-out part, after a seeded shuffle.
struct Split {
  std::vector<int64_t> train, val;
};
Split split_indices(int64_t size, double val_fraction, uint64_t seed);

// The sizes of k microbatches of a batch of B samples: the first B % k get one more, so sizes
// differ by at most one and the last is never larger than the first.
std::vector<int64_t> microbatch_sizes(int64_t batch, int64_t k);

class Loader {
 public:
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;
  // Batches of `batch_size` drawn from `indices` (whole batches only: an epoch is
  // floor(|indices| / batch_size) steps), each split into `microbatches` parts.
  //
  // Data parallelism: with `world` ranks, `batch_size` is the GLOBAL batch. Step s's batch is
  // exactly the one a single-rank loader forms (the shuffle does not depend on world), cut into
  // `world` contiguous shards by the microbatch_sizes rule (sizes differ by at most one, the first
  // batch_size % world are larger); rank `rank` takes shard `rank` and splits it into
  // `microbatches` microbatches of its own. Every shard must hold at least `microbatches` samples.
  Loader(const Dataset& data, std::vector<int64_t> indices, int64_t batch_size,
         int64_t microbatches, bool shuffle, uint64_t seed, int rank = 0, int world = 1);

  // The microbatches of optimizer step `step` (0-based), on `device`.
  std::vector<Batch> step_batches(int64_t step, Device device) const;
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t shard_size() const { return shard_size_; }  // this rank's samples per step

 private:
  const std::vector<int64_t>& epoch_order(int64_t epoch) const;
  const Dataset& data_;
  std::vector<int64_t> indices_;
  int64_t batch_size_, microbatches_, steps_per_epoch_;
  int64_t shard_begin_, shard_size_;  // this rank's rows within the global batch
  bool shuffle_;
  uint64_t seed_;
  mutable int64_t cached_epoch_ = -1;  // the order is recomputed once per epoch, not per step
  mutable std::vector<int64_t> cached_order_;

  // On CUDA, microbatches are gathered into page-locked staging buffers and copied to the device
  // asynchronously; a buffer is refilled only once the event recorded after its last copy has
  // passed (two steps' worth of buffers, so that is never a wait in practice).
  struct Staging {
    void* host = nullptr;
    size_t bytes = 0;
    void* done = nullptr;  // cudaEvent_t
  };
  mutable std::vector<Staging> staging_;
  mutable size_t next_staging_ = 0;
  Batch gather_to_device(const std::vector<int64_t>& rows, Device device) const;
};

}  // namespace mt::data
