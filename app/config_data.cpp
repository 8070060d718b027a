// The data a config's `data` section names (app/config.h), read through the loaders of data/.
#include "app/config.h"

#include "data/csv.h"
#include "data/data.h"

namespace mt::data {

Dataset load_dataset(const DataConfig& d, const ModelConfig& m, bool test) {
  if (d.kind == "synthetic") {
    return test ? make_synthetic(synthetic_test_samples(d.samples), m.input, m.classes, d.noise,
                                 d.seed, 1)
                : make_synthetic(d.samples, m.input, m.classes, d.noise, d.seed, 0);
  }
  const std::string& path = test ? d.test_path : d.path;
  try {
    Dataset set;
    if (d.kind == "mnist") {
      set = load_mnist(path, test);
    } else {
      const bool header = csv_header(d.header, path);
      set = load_csv(path, d.label_column, header);
      set.had_header = header;
    }
    set.file = path;
    return set;
  } catch (const DataError&) {
    throw;
  } catch (const Error& e) {
    throw DataError(e.what());
  }
}

bool has_test_set(const DataConfig& d) { return d.kind == "synthetic" || !d.test_path.empty(); }

}  // namespace mt::data
