// The built-in data kinds, each read whole into a data::Dataset of features and class labels:
// synthetic (generated, no download), mnist (IDX files) and csv. Their keys are the schema's own
// (data.samples, noise, path, test_path, label_column, header; app/config.h).
#include "app/registry.h"
#include "core/input_file.h"
#include "data/csv.h"

namespace mt::app {
namespace {

std::string got(const std::string& v) { return ", got '" + v + "'"; }

// A data file's loader, its errors as DataErrors naming the file.
data::Dataset read_file(const std::string& path, const std::function<data::Dataset()>& read) {
  try {
    data::Dataset set = read();
    set.file = path;
    return set;
  } catch (const data::DataError&) {
    throw;
  } catch (const Error& e) {
    throw data::DataError(e.what());
  }
}

// Missing data is found as the config is parsed, not after the model is built.
void check_files(const DataConfig& d, const Reject& reject) {
  if (d.path.empty()) reject("path", "is required for data.kind " + d.kind + got(d.path));
  if (!exists(d.path))
    reject("path", "no such file or directory (needed for data.kind " + d.kind + ")" + got(d.path));
  if (!d.test_path.empty() && !exists(d.test_path))
    reject("test_path", "no such file or directory" + got(d.test_path));
}

const RegisterData synthetic({
    .name = "synthetic",
    .meaning = "generated: model.classes Gaussian clusters in model.input dimensions "
               "(data::make_synthetic); the test set is an independent draw of a fifth as many",
    .keys = {},
    .load =
        [](const DataConfig& d, const ModelConfig& m, bool test) {
          return test ? data::make_synthetic(synthetic_test_samples(d.samples), m.input, m.classes,
                                             d.noise, d.seed, 1)
                      : data::make_synthetic(d.samples, m.input, m.classes, d.noise, d.seed, 0);
        },
    .has_test = [](const DataConfig&) { return true; },
    // The generated data's sizes follow from the config alone, so too few samples is a config
    // error now, not a failure after start-up (file data is checked once it is loaded).
    .check =
        [](const Config& c, const Reject& reject) {
          const DataConfig& d = c.data;
          const std::string samples = std::to_string(d.samples);
          if (synthetic_test_samples(d.samples) < 1)
            reject("samples", "must be at least 5 for synthetic data, which draws a fifth as many "
                              "for the test set, got " + samples);
          const int64_t val = data::validation_samples(d.samples, d.val_fraction);
          if (d.val_fraction != 0 && val < 1)
            reject("val_fraction", "must hold out at least one of data.samples = " + samples +
                                       " (or be 0 for no validation), got " +
                                       format_number(d.val_fraction));
          if (d.samples - val < c.optim.batch_size)
            reject("samples", "must leave optim.batch_size = " + std::to_string(c.optim.batch_size) +
                                  " samples for training after data.val_fraction holds out " +
                                  std::to_string(val) + ", got " + samples);
        },
});

const RegisterData mnist({
    .name = "mnist",
    .meaning = "MNIST's IDX files (train-*, t10k-*, optionally .gz) in the folder data.path",
    .keys = {},
    .load =
        [](const DataConfig& d, const ModelConfig&, bool test) {
          const std::string& path = test ? d.test_path : d.path;
          return read_file(path, [&] { return data::load_mnist(path, test); });
        },
    .has_test = [](const DataConfig& d) { return !d.test_path.empty(); },
    .check = [](const Config& c, const Reject& reject) { check_files(c.data, reject); },
});

const RegisterData csv({
    .name = "csv",
    .meaning = "a numeric CSV file, one sample a line (data.label_column holds the label)",
    .keys = {},
    .load =
        [](const DataConfig& d, const ModelConfig&, bool test) {
          const std::string& path = test ? d.test_path : d.path;
          return read_file(path, [&] {
            const bool header = csv_header(d.header, path);
            data::Dataset set = data::load_csv(path, d.label_column, header);
            set.had_header = header;
            return set;
          });
        },
    .has_test = [](const DataConfig& d) { return !d.test_path.empty(); },
    .check =
        [](const Config& c, const Reject& reject) {
          const DataConfig& d = c.data;
          check_files(d, reject);
          // A CSV is read to its end: a device or pipe (/dev/zero) has no size that bounds that.
          const std::string not_regular = "is not a regular file (a device or pipe may never end)";
          if (!regular_file(d.path)) reject("path", not_regular + got(d.path));
          if (!d.test_path.empty() && !regular_file(d.test_path))
            reject("test_path", not_regular + got(d.test_path));
        },
});

}  // namespace
}  // namespace mt::app
