// data::load_dataset and has_test_set (declared in app/config.h): a data kind's dataset through
// the registry, with data.test_fraction's held-out rows cut here. A file of its own, apart from the
// registry, so that what only parses configs (the fuzzers) links without the data loaders.
#include <algorithm>

#include "app/config.h"
#include "app/registry.h"
#include "data/data.h"

namespace mt::data {

namespace {

// A file of no samples is the data's fault, said before a split (validation, test_fraction)
// would name itself instead, and before eval reports a loss over nothing.
Dataset nonempty(Dataset set, const char* which) {
  if (set.size == 0)
    throw DataError(detail::concat("the ", set.name, which, " (",
                                   set.file.empty() ? "generated" : set.file, ") has no samples"));
  return set;
}

}  // namespace

Dataset load_dataset(const DataConfig& d, const ModelConfig& m, bool test) {
  const app::DataKind& kind = app::data_kind(d.kind);
  if (!kind.load)
    throw ConfigError("data.kind: " + d.kind + " serves batches of its own (a data source), not "
                      "a dataset of features and labels");
  if (d.test_fraction == 0)
    return nonempty(kind.load(d, m, test), test ? " test set" : " training set");
  // The test set held out of the training data: the same rows for every caller (training, eval,
  // predict), as the draw depends on data.seed and the file alone. Its seed differs from the
  // validation split's, which then splits the rest.
  const Dataset all = nonempty(kind.load(d, m, false), " data");
  const Split split = split_indices(all.size, d.test_fraction, ~d.seed);
  const std::string of = detail::concat(" of the ", all.size, " samples of ",
                                        all.file.empty() ? all.name : all.file);
  if (split.val.empty())
    throw ConfigError(detail::concat("data.test_fraction: ", d.test_fraction, " holds out none", of));
  if (split.train.empty())
    throw ConfigError(detail::concat("data.test_fraction: ", d.test_fraction, " holds out all", of,
                                     ", leaving none to train on"));
  std::vector<int64_t> rows = test ? split.val : split.train;
  std::sort(rows.begin(), rows.end());  // file order
  return take_rows(all, rows);
}

bool has_test_set(const DataConfig& d) {
  const app::DataKind& kind = app::data_kind(d.kind);
  return kind.load && (d.test_fraction > 0 || (kind.has_test && kind.has_test(d)));
}

}  // namespace mt::data
