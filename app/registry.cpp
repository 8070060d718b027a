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
