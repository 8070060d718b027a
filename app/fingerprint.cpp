#include "app/fingerprint.h"

#include <yaml-cpp/yaml.h>

namespace mt::app {
namespace {

// Mappings become dotted keys; anything else is one value, written as flow YAML.
void flatten(const YAML::Node& node, const std::string& prefix, parallel::JobEntries& out) {
  if (node.IsMap()) {
    for (const auto& kv : node)
      flatten(kv.second, prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>(), out);
    return;
  }
  YAML::Emitter e;
  e << YAML::Flow << node;
  out.emplace_back(prefix, e.c_str());
}

}  // namespace

parallel::JobEntries job_entries(const Config& c) {
  parallel::JobEntries out;
  flatten(YAML::Load(to_yaml(c)), "", out);
  return out;
}

}  // namespace mt::app
