#include "core/registry.h"

#include <sstream>

namespace mt {

OpRegistry& OpRegistry::instance() {
  static OpRegistry r;  // constructed on first use, so static registrars can run in any order
  return r;
}

void OpRegistry::add(const std::string& op, Phase phase, DeviceType device, std::any fn) {
  auto [it, inserted] = entries_[op].kernels.emplace(std::make_pair(phase, device), std::move(fn));
  MT_CHECK(inserted, "OpRegistry: ", op, " registered the same kernel twice");
}

void OpRegistry::describe(const std::string& op, const std::string& math) { entries_[op].math = math; }

const std::any* OpRegistry::find(const std::string& op, Phase phase, DeviceType device) const {
  auto e = entries_.find(op);
  if (e == entries_.end()) return nullptr;
  auto k = e->second.kernels.find({phase, device});
  return k == e->second.kernels.end() ? nullptr : &k->second;
}

std::vector<std::string> OpRegistry::ops() const {
  std::vector<std::string> names;
  for (const auto& [name, _] : entries_) names.push_back(name);
  return names;
}

std::string OpRegistry::table() const {
  std::ostringstream os;
  auto has = [](const Entry& e, Phase p, DeviceType d) {
    return e.kernels.count({p, d}) ? "yes" : " - ";
  };
  char line[256];
  std::snprintf(line, sizeof line, "%-16s %-8s %-8s %-8s %-8s  %s\n", "op", "cpu fwd", "cpu bwd",
                "cuda fwd", "cuda bwd", "math");
  os << line;
  for (const auto& [name, e] : entries_) {
    std::snprintf(line, sizeof line, "%-16s %-8s %-8s %-8s %-8s  %s\n", name.c_str(),
                  has(e, Phase::Forward, DeviceType::CPU), has(e, Phase::Backward, DeviceType::CPU),
                  has(e, Phase::Forward, DeviceType::CUDA), has(e, Phase::Backward, DeviceType::CUDA),
                  e.math.c_str());
    os << line;
  }
  return os.str();
}

static bool g_deterministic = true;
bool deterministic() { return g_deterministic; }
void set_deterministic(bool on) { g_deterministic = on; }

}  // namespace mt
