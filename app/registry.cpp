#include "app/registry.h"

#include <algorithm>

namespace mt::app {
namespace {

template <class Kind>
std::map<std::string, Kind>& entries() {
  static std::map<std::string, Kind> all;  // built on first use: registrations run at start-up
  return all;
}

template <class Kind>
void add(Kind kind, const char* what) {
  MT_CHECK(!kind.name.empty(), what, ": a kind needs a name");
  MT_CHECK(!entries<Kind>().contains(kind.name), what, " '", kind.name, "' is registered twice");
  const std::string name = kind.name;
  entries<Kind>().emplace(name, std::move(kind));
}

template <class Kind>
const Kind* find(const std::string& name) {
  auto it = entries<Kind>().find(name);
  return it == entries<Kind>().end() ? nullptr : &it->second;
}

template <class Kind>
const Kind& get(const std::string& name, const char* key) {
  if (const Kind* k = find<Kind>(name)) return *k;
  std::string known;
  for (const auto& [n, k] : entries<Kind>()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError(std::string(key) + ": unknown kind '" + name + "' (registered: " + known + ")");
}

template <class Kind>
std::vector<const Kind*> all() {
  std::vector<const Kind*> out;
  for (const auto& [name, k] : entries<Kind>()) out.push_back(&k);
  return out;
}

}  // namespace

RegisterModel::RegisterModel(ModelKind kind) {
  MT_CHECK(kind.build, "model kind '", kind.name, "': no build function");
  add(std::move(kind), "model kind");
}

RegisterData::RegisterData(DataKind kind) {
  MT_CHECK(kind.load || kind.source, "data kind '", kind.name, "': neither load nor source");
  add(std::move(kind), "data kind");
}

const ModelKind& model_kind(const std::string& name) { return get<ModelKind>(name, "model.kind"); }
const DataKind& data_kind(const std::string& name) { return get<DataKind>(name, "data.kind"); }
const ModelKind* find_model_kind(const std::string& name) { return find<ModelKind>(name); }
const DataKind* find_data_kind(const std::string& name) { return find<DataKind>(name); }
std::vector<const ModelKind*> model_kinds() { return all<ModelKind>(); }
std::vector<const DataKind*> data_kinds() { return all<DataKind>(); }

std::shared_ptr<nn::Module> build_model(const Config& c) { return model_kind(c.model.kind).build(c); }

}  // namespace mt::app

namespace mt::data {

Dataset load_dataset(const DataConfig& d, const ModelConfig& m, bool test) {
  const app::DataKind& kind = app::data_kind(d.kind);
  if (!kind.load)
    throw ConfigError("data.kind: " + d.kind + " serves batches of its own (a data source), not "
                      "a dataset of features and labels");
  if (d.test_fraction == 0) return kind.load(d, m, test);
  // The test set held out of the training data: the same rows for every caller (training, eval,
  // predict), as the draw depends on data.seed and the file alone. Its seed differs from the
  // validation split's, which then splits the rest.
  const Dataset all = kind.load(d, m, false);
  const Split split = split_indices(all.size, d.test_fraction, ~d.seed);
  if (split.val.empty())
    throw ConfigError(detail::concat("data.test_fraction: ", d.test_fraction, " holds out none of the ",
                                     all.size, " samples of ", all.file.empty() ? all.name : all.file));
  std::vector<int64_t> rows = test ? split.val : split.train;
  std::sort(rows.begin(), rows.end());  // file order
  return take_rows(all, rows);
}

bool has_test_set(const DataConfig& d) {
  const app::DataKind& kind = app::data_kind(d.kind);
  return kind.load && (d.test_fraction > 0 || (kind.has_test && kind.has_test(d)));
}

}  // namespace mt::data
