#include "data/data.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#endif
#include "data/csv.h"
#include "data/idx.h"

namespace mt::data {

std::pair<Tensor, Tensor> Dataset::gather(const std::vector<int64_t>& indices, Device device) const {
  const int64_t n = int64_t(indices.size());
  Tensor x = empty({n, dim}, DType::f32);
  Tensor y = empty({n}, DType::i64);
  float* xp = x.data<float>();
  int64_t* yp = y.data<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = indices[size_t(r)];
    std::copy_n(features.begin() + i * dim, dim, xp + r * dim);
    yp[r] = labels[size_t(i)];
  }
  return {x.to(device), y.to(device)};
}

Dataset make_synthetic(int64_t samples, int64_t dim, int64_t classes, double noise, uint64_t seed,
                       uint64_t draw) {
  MT_CHECK(samples > 0 && dim > 0 && classes >= 2 && noise >= 0, "make_synthetic: invalid sizes (",
           samples, " samples, dim ", dim, ", ", classes, " classes, noise ", noise, ")");
  int64_t center_values = 0, feature_values = 0;
  MT_CHECK(!__builtin_mul_overflow(classes, dim, &center_values) &&
               !__builtin_mul_overflow(samples, dim, &feature_values),
           "make_synthetic: ", samples, " samples of ", dim, " features in ", classes,
           " classes overflow 64 bits");
  Generator centers_rng(seed);
  std::vector<double> centers(static_cast<size_t>(center_values));
  for (auto& c : centers) c = centers_rng.normal();
  Generator g(seed * 0x9e3779b97f4a7c15ull + 0x1234567u + draw);
  Dataset d;
  d.name = "synthetic";
  d.size = samples;
  d.dim = dim;
  d.classes = classes;
  d.features.resize(size_t(feature_values));
  d.labels.resize(size_t(samples));
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t c = int64_t(g.below(uint64_t(classes)));
    d.labels[size_t(i)] = c;
    for (int64_t j = 0; j < dim; ++j)
      d.features[size_t(i * dim + j)] = float(centers[size_t(c * dim + j)] + noise * g.normal());
  }
  return d;
}

// Finds `stem` or `stem.gz` in dir.
static std::string find_idx(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  for (const std::string& name : {stem, stem + ".gz"})
    if (fs::exists(fs::path(dir) / name)) return (fs::path(dir) / name).string();
  MT_THROW("load_mnist: neither ", stem, " nor ", stem, ".gz found in '", dir,
           "' (put the standard MNIST IDX files there)");
}

// Bytes this process may still take: the physical memory, or less under an address-space limit.
static double available_bytes() {
  double bytes = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) bytes = std::min(bytes, double(as.rlim_cur));
  return bytes;
}

// What loading `count` MNIST samples of `pixels` each holds at its peak, checked from the header
// before any data is read: each pixel as read and as a float (5 bytes), each label as read and as
// an int64 (9 bytes). The read cap alone let a 255 KiB file grow past 6 GiB.
static void check_mnist_fits(const std::string& path, int64_t count, int64_t pixels) {
  const double need = double(count) * (double(pixels) * 5 + 9), have = available_bytes();
  MT_CHECK(need <= have, path, ": its header's ", count,
           pixels > 0 ? detail::concat(" images of ", pixels, " pixels") : std::string(" labels"), " take ",
           need / double(1 << 30), " GiB to load, more than the ", have / double(1 << 30),
           " GiB this process may use");
}

Dataset load_mnist(const std::string& dir, bool test) {
  const std::string prefix = test ? "t10k" : "train";
  const std::string img_path = find_idx(dir, prefix + "-images-idx3-ubyte");
  const std::string lbl_path = find_idx(dir, prefix + "-labels-idx1-ubyte");
  // The small labels file first: its count then bounds the images before their data is read.
  const IdxArray labels = read_idx(lbl_path, [&](const std::vector<int64_t>& shape) {
    MT_CHECK(shape.size() == 1, lbl_path, ": expected a 1-D label array, got ", shape_str(shape));
    check_mnist_fits(lbl_path, shape[0], 0);
  });
  const IdxArray images = read_idx(img_path, [&](const std::vector<int64_t>& shape) {
    MT_CHECK(shape.size() == 3, img_path, ": expected a 3-D image array, got ", shape_str(shape));
    MT_CHECK(shape[0] == labels.shape[0], img_path, ": the header says ", shape[0],
             " images, but ", lbl_path, " has ", labels.shape[0], " labels");
    check_mnist_fits(img_path, shape[0], shape[1] * shape[2]);
  });
  Dataset d;
  d.name = "mnist";
  d.size = images.shape[0];
  d.dim = images.shape[1] * images.shape[2];
  d.sample_shape = {images.shape[1], images.shape[2]};
  d.classes = 10;
  d.features.resize(images.data.size());
  for (size_t i = 0; i < images.data.size(); ++i)
    d.features[i] = (float(images.data[i]) / 255.0f - 0.1307f) / 0.3081f;
  d.labels.resize(labels.data.size());
  for (size_t i = 0; i < labels.data.size(); ++i) {
    MT_CHECK(labels.data[i] < 10, lbl_path, ": label ", int(labels.data[i]), " at index ", i,
             " is not a digit");
    d.labels[i] = labels.data[i];
  }
  return d;
}

Dataset load_csv(const std::string& path, int64_t label_column, bool header) {
  CsvData c = read_csv(path, label_column, header);
  Dataset d;
  d.name = "csv";
  d.size = c.rows;
  d.dim = c.cols;
  d.features = std::move(c.features);
  d.labels = std::move(c.labels);
  const int64_t max_label =
      d.labels.empty() ? -1 : *std::max_element(d.labels.begin(), d.labels.end());
  MT_CHECK(max_label < std::numeric_limits<int64_t>::max(), path, ": label ", max_label,
           " is too large to count the classes");
  d.classes = max_label + 1;
  MT_CHECK(d.classes >= 2, path, ": needs at least two classes (labels 0 and 1), but column ",
           label_column < 0 ? c.cols : label_column, ", the label column (data.label_column = ",
           label_column, label_column < 0 ? ": the last" : "", "), holds only label 0");
  return d;
}

Standardization standardization_of(const Dataset& set, const std::vector<int64_t>& rows) {
  const size_t D = size_t(set.dim);
  std::vector<double> sum(D, 0.0), sq(D, 0.0);
  for (int64_t r : rows)
    for (size_t k = 0; k < D; ++k) sum[k] += set.features[size_t(r) * D + k];
  const double n = double(std::max<size_t>(rows.size(), 1));
  Standardization s;
  for (size_t k = 0; k < D; ++k) s.mean.push_back(float(sum[k] / n));
  for (int64_t r : rows)  // two passes: the squares of deviations, not E[x²] - E[x]², which cancels
    for (size_t k = 0; k < D; ++k) {
      const double dev = set.features[size_t(r) * D + k] - double(s.mean[k]);
      sq[k] += dev * dev;
    }
  for (size_t k = 0; k < D; ++k) {
    const double sd = std::sqrt(sq[k] / n);
    s.std.push_back(sd > 0 && std::isfinite(float(sd)) ? float(sd) : 1.0f);
  }
  return s;
}

void standardize(std::vector<float>& features, const Standardization& s) {
  const size_t D = s.mean.size();
  if (D == 0) return;
  MT_CHECK(features.size() % D == 0, "standardize: ", features.size(),
           " values are not rows of ", D, " features");
  for (size_t i = 0; i < features.size(); ++i)
    features[i] = (features[i] - s.mean[i % D]) / s.std[i % D];
}

std::string to_text(const Standardization& s) {
  auto list = [](const std::vector<float>& v) {
    std::string t = "[";
    char buf[32];
    for (size_t i = 0; i < v.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%.9g", double(v[i]));  // 9 digits: the float exactly
      t.append(i ? "," : "").append(buf);
    }
    return t + "]";
  };
  return "{\"mean\": " + list(s.mean) + ", \"std\": " + list(s.std) + "}";
}

Standardization standardization_from_text(const std::string& text, const std::string& where) {
  Standardization s;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    s.mean = j.at("mean").get<std::vector<float>>();
    s.std = j.at("std").get<std::vector<float>>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(where + ": the feature standardization is not readable: " + e.what());
  }
  if (s.mean.size() != s.std.size() ||
      std::any_of(s.std.begin(), s.std.end(), [](float v) { return !(v > 0) || !std::isfinite(v); }) ||
      std::any_of(s.mean.begin(), s.mean.end(), [](float v) { return !std::isfinite(v); }))
    throw DataError(where + ": the feature standardization is damaged (" +
                    std::to_string(s.mean.size()) + " means, " + std::to_string(s.std.size()) +
                    " stds, every std must be finite and > 0)");
  return s;
}

static void shuffle(std::vector<int64_t>& v, Generator& g) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[g.below(i)]);
}

Dataset take_rows(const Dataset& set, const std::vector<int64_t>& rows) {
  Dataset out;
  out.name = set.name;
  out.file = set.file;
  out.had_header = set.had_header;
  out.dim = set.dim;
  out.classes = set.classes;
  out.size = int64_t(rows.size());
  const size_t D = size_t(set.dim);
  out.features.reserve(rows.size() * D);
  out.labels.reserve(rows.size());
  for (int64_t r : rows) {
    MT_CHECK(r >= 0 && r < set.size, "take_rows: row ", r, " of a dataset of ", set.size);
    out.features.insert(out.features.end(), set.features.begin() + long(size_t(r) * D),
                        set.features.begin() + long((size_t(r) + 1) * D));
    out.labels.push_back(set.labels[size_t(r)]);
  }
  return out;
}

Split split_indices(int64_t size, double val_fraction, uint64_t seed) {
  MT_CHECK(size >= 0 && val_fraction >= 0 && val_fraction <= 1, "split_indices: val_fraction must "
           "be in [0, 1] and size non-negative, got ", val_fraction, " of ", size);
  std::vector<int64_t> all(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) all[size_t(i)] = i;
  Generator g(seed ^ 0x5eedu);
  shuffle(all, g);
  const auto n_val = size_t(validation_samples(size, val_fraction));
  Split s;
  s.val.assign(all.begin(), all.begin() + long(n_val));
  s.train.assign(all.begin() + long(n_val), all.end());
  return s;
}

std::vector<int64_t> microbatch_sizes(int64_t batch, int64_t k) {
  MT_CHECK(k >= 1 && k <= batch, "microbatch_sizes: cannot split a batch of ", batch, " into ", k,
           " microbatches");
  std::vector<int64_t> sizes(size_t(k), batch / k);
  for (int64_t i = 0; i < batch % k; ++i) ++sizes[size_t(i)];
  return sizes;
}

Loader::Loader(const Dataset& data, std::vector<int64_t> indices, int64_t batch_size,
               int64_t microbatches, bool shuffle, uint64_t seed, int rank, int world)
    : data_(data), indices_(std::move(indices)), batch_size_(batch_size),
      microbatches_(microbatches), shuffle_(shuffle), seed_(seed) {
  MT_CHECK(batch_size_ >= 1 && int64_t(indices_.size()) >= batch_size_, "Loader: batch_size ",
           batch_size_, " is larger than the ", indices_.size(), " training samples");
  MT_CHECK(world >= 1 && rank >= 0 && rank < world, "Loader: rank ", rank, " is not a rank of a ",
           "world of ", world, " (need world >= 1 and 0 <= rank < world)");
  MT_CHECK(microbatches_ >= 1, "Loader: microbatches must be at least 1, got ", microbatches_);
  MT_CHECK(batch_size_ / world >= microbatches_, "Loader: batch_size ", batch_size_,
           " over world ", world, " gives shards of ", batch_size_ / world,
           batch_size_ % world ? " or " + std::to_string(batch_size_ / world + 1) : std::string(),
           " samples, too few for ", microbatches_, " microbatches per rank; need batch_size >= "
           "world * microbatches");
  const std::vector<int64_t> shards = microbatch_sizes(batch_size_, world);
  shard_begin_ = 0;
  for (int r = 0; r < rank; ++r) shard_begin_ += shards[size_t(r)];
  shard_size_ = shards[size_t(rank)];
  steps_per_epoch_ = int64_t(indices_.size()) / batch_size_;
}

const std::vector<int64_t>& Loader::epoch_order(int64_t epoch) const {
  if (epoch != cached_epoch_) {
    cached_order_ = indices_;
    if (shuffle_) {
      Generator g(seed_ * 0x9e3779b97f4a7c15ull + uint64_t(epoch));
      shuffle(cached_order_, g);
    }
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

Loader::~Loader() {
#ifdef MT_WITH_CUDA
  for (Staging& s : staging_) {
    if (s.done) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(s.done));  // its copy may still be reading
      cudaEventDestroy(static_cast<cudaEvent_t>(s.done));
    }
    cuda::free_pinned(s.host);
  }
#endif
}

Batch Loader::gather_to_device(const std::vector<int64_t>& rows, Device device) const {
#ifdef MT_WITH_CUDA
  if (device.is_cuda()) {
    if (staging_.empty()) staging_.resize(size_t(2 * microbatches_));
    Staging& s = staging_[next_staging_++ % staging_.size()];
    const int64_t n = int64_t(rows.size()), dim = data_.dim;
    const size_t x_bytes = size_t(n * dim) * sizeof(float), bytes = x_bytes + size_t(n) * sizeof(int64_t);
    cuda::set_device(device.index);
    if (s.done) MT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(s.done)));
    if (s.bytes < bytes) {
      cuda::free_pinned(s.host);
      s.host = cuda::alloc_pinned(bytes);
      s.bytes = bytes;
    }
    if (!s.done) {
      cudaEvent_t e;
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      s.done = e;
    }
    auto* xp = static_cast<float*>(s.host);
    auto* yp = reinterpret_cast<int64_t*>(static_cast<char*>(s.host) + x_bytes);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t i = rows[size_t(r)];
      std::copy_n(data_.features.begin() + i * dim, dim, xp + r * dim);
      yp[r] = data_.labels[size_t(i)];
    }
    Tensor x = empty({n, dim}, DType::f32, device), y = empty({n}, DType::i64, device);
    cuda::copy_h2d(x.data_ptr(), xp, x_bytes, device.index);
    cuda::copy_h2d(y.data_ptr(), yp, size_t(n) * sizeof(int64_t), device.index);
    MT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(s.done), cuda::stream(device.index)));
    return {x, y};
  }
#endif
  auto [x, y] = data_.gather(rows, device);
  return {x, y};
}

std::vector<Batch> Loader::step_batches(int64_t step, Device device) const {
  const std::vector<int64_t>& order = epoch_order(step / steps_per_epoch_);
  int64_t pos = (step % steps_per_epoch_) * batch_size_ + shard_begin_;
  std::vector<Batch> out;
  for (int64_t n : microbatch_sizes(shard_size_, microbatches_)) {
    std::vector<int64_t> rows(order.begin() + pos, order.begin() + pos + n);
    out.push_back(gather_to_device(rows, device));
    pos += n;
  }
  return out;
}

}  // namespace mt::data
