#include "core/registry.h"

#include <algorithm>
#include <sstream>

#include "core/autograd.h"

namespace mt {

OpRegistry& OpRegistry::instance() {
  static OpRegistry r;  // constructed on first use, so static registrars can run in any order
  return r;
}

static const char* phase_name(Phase p) { return p == Phase::Forward ? "forward" : "backward"; }
static const char* device_name(DeviceType d) { return d == DeviceType::CPU ? "cpu" : "cuda"; }
static const char* macro_name(Phase p) { return p == Phase::Forward ? "Forward" : "Backward"; }
static const char* macro_device(DeviceType d) { return d == DeviceType::CPU ? "CPU" : "CUDA"; }

void OpRegistry::define(const std::string& op, const std::string& math, Signature forward,
                        Signature backward) {
  Entry& e = entries_[op];
  if (e.defined) duplicates_.push_back(op + ": defined twice (MT_DEFINE_OP)");
  e.defined = true;
  e.math = math;
  e.signature[0] = forward;
  e.signature[1] = backward;
}

void OpRegistry::add(const std::string& op, Phase phase, DeviceType device, std::any fn) {
  auto [it, inserted] = entries_[op].kernels.emplace(std::make_pair(phase, device), std::move(fn));
  if (!inserted)
    duplicates_.push_back(op + ": the " + device_name(device) + " " + phase_name(phase) +
                          " kernel is registered twice");
}

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

std::vector<std::string> OpRegistry::problems(const std::vector<DeviceType>& backends) const {
  std::vector<std::string> out = duplicates_;
  for (const auto& [name, e] : entries_) {
    if (!e.defined) {
      out.push_back(name + ": kernels are registered but the op is never defined; add "
                    "MT_DEFINE_OP(" + name + ", \"<math>\", ForwardFn, BackwardFn) beside its Function");
      continue;
    }
    for (Phase p : {Phase::Forward, Phase::Backward}) {
      const Signature& sig = e.signature[p == Phase::Forward ? 0 : 1];
      for (DeviceType d : backends) {
        auto k = e.kernels.find({p, d});
        if (sig.defined() && k == e.kernels.end())
          out.push_back(name + ": no " + device_name(d) + " " + phase_name(p) + " kernel, and this "
                        "build has " + device_name(d) + "; register one with MT_REGISTER_KERNEL(" +
                        name + ", " + macro_name(p) + ", " + macro_device(d) + ", fn)");
      }
      for (const auto& [key, fn] : e.kernels) {
        if (key.first != p) continue;
        const std::string which = std::string(device_name(key.second)) + " " + phase_name(p);
        if (!sig.defined())
          out.push_back(name + ": a " + which + " kernel is registered, but the op's definition "
                        "declares no " + phase_name(p) + " kernel (void)");
        else if (fn.type() != *sig.type)
          out.push_back(name + ": the " + which + " kernel has the signature " +
                        detail::type_name(fn.type()) + ", but the op defines it as " +
                        detail::type_name(*sig.type));
      }
    }
  }
  return out;
}

std::vector<DeviceType> built_backends() {
#ifdef MT_WITH_CUDA
  return {DeviceType::CPU, DeviceType::CUDA};
#else
  return {DeviceType::CPU};
#endif
}

void verify_ops() {
  const std::vector<std::string> problems = OpRegistry::instance().problems(built_backends());
  if (problems.empty()) return;
  std::string msg = "the op registry is incomplete for this build (" +
                    std::to_string(problems.size()) + " problem(s)):";
  for (const std::string& p : problems) msg += "\n  " + p;
  MT_THROW(msg);
}

std::string OpRegistry::table() const {
  std::ostringstream os;
  const std::vector<DeviceType> built = built_backends();
  auto has = [&](const Entry& e, Phase p, DeviceType d) {
    if (e.kernels.count({p, d})) return "yes";
    const bool needed = e.signature[p == Phase::Forward ? 0 : 1].defined() &&
                        std::find(built.begin(), built.end(), d) != built.end();
    return needed ? "MISSING" : " - ";  // MISSING: verify_ops() names it
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

static bool g_gemm_autotune = false;
bool gemm_autotune() { return g_gemm_autotune; }
void set_gemm_autotune(bool on) { g_gemm_autotune = on; }

}  // namespace mt
