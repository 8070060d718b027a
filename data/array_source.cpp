#include "data/array_source.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::data {
namespace {

// One NaN or inf feature would turn every parameter into NaN in the first step that draws it.
void check_finite(const Dataset& set) {
  for (size_t i = 0; i < set.features.size(); ++i)
    if (!std::isfinite(set.features[i]))
      throw DataError(detail::concat("the ", set.name, " data: sample ", i / size_t(set.dim),
                                     ", feature ", i % size_t(set.dim), " is ", set.features[i]));
}

std::string origin(const Dataset& set) {
  return set.file.empty() ? std::string("generated")
                          : set.file + (set.had_header ? ", header line skipped" : "");
}

// "28×28 pixels" or "784 features".
std::string shape_text(const Dataset& set) {
  if (set.sample_shape.size() == 2)
    return detail::concat(set.sample_shape[0], "×", set.sample_shape[1], " pixels");
  return detail::concat(set.dim, " features");
}

}  // namespace

ArraySource::ArraySource(Dataset train, Dataset test, ArrayOptions options)
    : train_(std::move(train)), test_(std::move(test)), options_(options) {
  for (const Dataset* set : {&train_, &test_}) check_finite(*set);
  // No samples is the data's fault, not the split's: without this, val_fraction's check below
  // would name the split and suggest turning validation off. (A test set may be empty: none.)
  if (train_.size == 0)
    throw DataError(detail::concat("the training set", train_.name.empty() ? "" : " " + train_.name,
                                   " has no samples"));
  // The model reads a test sample as it learned a training one: 14×56 images are not 28×28 ones,
  // though both are 784 features.
  if (test_.size > 0 && (test_.dim != train_.dim || test_.sample_shape != train_.sample_shape))
    throw DataError(detail::concat("the ", test_.name, " test set (", origin(test_), ") has samples of ",
                                   shape_text(test_), ", the training set (", origin(train_), ") of ",
                                   shape_text(train_)));
  split_ = split_indices(train_.size, options_.val_fraction, options_.seed);
  if (options_.val_fraction > 0 && split_.val.empty())
    throw ConfigError(detail::concat("data.val_fraction: ", options_.val_fraction,
                                     " holds out none of the ", train_.size, " ", train_.name,
                                     " samples (use 0 for no validation)"));
  if (int64_t(split_.train.size()) < options_.batch_size)
    throw ConfigError(detail::concat("optim.batch_size: ", options_.batch_size,
                                     " is larger than the ", split_.train.size(),
                                     " training samples"));
  if (options_.standardize) {
    standardization_ = standardization_of(train_, split_.train);
    for (Dataset* set : {&train_, &test_}) standardize(set->features, standardization_);
  }
  shard(0, 1);
}

ArraySource::~ArraySource() = default;

std::vector<std::string> ArraySource::describe() const {
  std::vector<std::string> lines = {detail::concat(
      train_.name, " ", train_.dim, " features, ", train_.classes, " classes: ",
      split_.train.size(), " training, ", split_.val.size(), " validation samples (",
      origin(train_), "); test: ",
      test_.size > 0 ? detail::concat(test_.size, " samples (", origin(test_), ")")
                     : std::string("none"))};
  if (options_.standardize)
    lines.push_back(detail::concat("features standardized by the mean and std of the ",
                                   split_.train.size(), " training samples"));
  return lines;
}

void ArraySource::shard(int rank, int world) {
  if (options_.batch_size < world * options_.microbatches)
    throw ConfigError(detail::concat("optim.batch_size: ", options_.batch_size,
                                     " samples cannot give ", world, " ranks ",
                                     options_.microbatches, " microbatches each"));
  loader_ = std::make_unique<Loader>(train_, split_.train, options_.batch_size,
                                     options_.microbatches, options_.shuffle, options_.seed, rank,
                                     world);
}

int64_t ArraySource::shard_size() const { return loader_->shard_size(); }

int64_t ArraySource::steps_per_epoch() const { return loader_->steps_per_epoch(); }

std::vector<Batch> ArraySource::step_batches(int64_t step, Device device) const {
  return loader_->step_batches(step, device);
}

int64_t ArraySource::held_out_size(HeldOut which) const {
  return which == HeldOut::validation ? int64_t(split_.val.size()) : test_.size;
}

void ArraySource::for_each_held_out(HeldOut which, int64_t batch_size, Device device,
                                    const std::function<void(const Batch&)>& visit) const {
  if (which == HeldOut::validation) return for_each_batch(train_, split_.val, batch_size, device, visit);
  std::vector<int64_t> all(static_cast<size_t>(test_.size));
  for (int64_t i = 0; i < test_.size; ++i) all[size_t(i)] = i;
  for_each_batch(test_, all, batch_size, device, visit);
}

std::map<std::string, std::string> ArraySource::metadata() const {
  if (standardization_.empty()) return {};
  return {{"standardization", to_text(standardization_)}};
}

void for_each_batch(const Dataset& set, const std::vector<int64_t>& rows, int64_t batch_size,
                    Device device, const std::function<void(const Batch&)>& visit) {
  MT_CHECK(batch_size > 0, "for_each_batch: batch_size must be positive, got ", batch_size);
  for (size_t begin = 0; begin < rows.size(); begin += size_t(batch_size)) {
    const std::vector<int64_t> part(
        rows.begin() + long(begin), rows.begin() + long(std::min(rows.size(), begin + size_t(batch_size))));
    auto [x, y] = set.gather(part, device);
    visit({x, y});
  }
}

}  // namespace mt::data
