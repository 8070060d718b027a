#include "core/registry.h"

#include <algorithm>
#include <iomanip>
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

bool OpRegistry::Entry::declares(DeviceType d) const {
  return backends.empty() || std::find(backends.begin(), backends.end(), d) != backends.end();
}

static std::string backend_list(const std::vector<DeviceType>& backends) {
  std::string s;
  for (DeviceType d : backends) s += std::string(s.empty() ? "" : " and ") + device_name(d);
  return s;
}

void OpRegistry::set_backends(const std::string& op, const std::vector<DeviceType>& backends) {
  Entry& e = entries_[op];
  if (backends.empty())
    duplicates_.push_back(op + ": MT_OP_BACKENDS names no backend; name CPU and/or CUDA");
  else if (!e.backends.empty())
    duplicates_.push_back(op + ": its backends are declared twice (MT_OP_BACKENDS)");
  else
    e.backends = backends;
}

bool OpRegistry::declares(const std::string& op, DeviceType device) const {
  auto e = entries_.find(op);
  return e == entries_.end() || e->second.declares(device);
}

std::string OpRegistry::missing(const std::string& op, Phase phase, DeviceType device) const {
  auto e = entries_.find(op);
  if (e != entries_.end() && !e->second.declares(device))
    return op + ": has no " + device_name(device) + " kernels: the op is declared for " +
           backend_list(e->second.backends) + " only (MT_OP_BACKENDS); give it " +
           device_name(e->second.backends.front()) + " tensors";
  const std::vector<DeviceType> built = built_backends();
  const bool in_build = std::find(built.begin(), built.end(), device) != built.end();
  return op + ": no " + phase_name(phase) + " kernel registered for " + device_name(device) +
         (in_build ? "" : " (this build has no " + std::string(device_name(device)) + " backend)");
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
      out.push_back(name + ": " + (e.kernels.empty() ? "MT_OP_BACKENDS names it" : "kernels are registered") +
                    " but the op is never defined; add MT_DEFINE_OP(" + name +
                    ", \"<math>\", ForwardFn, BackwardFn) beside its Function");
      continue;
    }
    for (Phase p : {Phase::Forward, Phase::Backward}) {
      const Signature& sig = e.signature[p == Phase::Forward ? 0 : 1];
      for (DeviceType d : backends) {
        auto k = e.kernels.find({p, d});
        if (sig.defined() && k == e.kernels.end() && e.declares(d))
          out.push_back(name + ": no " + device_name(d) + " " + phase_name(p) + " kernel, and this "
                        "build has " + device_name(d) + "; register one with MT_REGISTER_KERNEL(" +
                        name + ", " + macro_name(p) + ", " + macro_device(d) + ", fn)");
      }
      for (const auto& [key, fn] : e.kernels) {
        if (key.first != p) continue;
        const std::string which = std::string(device_name(key.second)) + " " + phase_name(p);
        if (!e.declares(key.second))
          out.push_back(name + ": a " + which + " kernel is registered, but the op is declared "
                        "for " + backend_list(e.backends) + " only (MT_OP_BACKENDS)");
        else if (!sig.defined())
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
  const std::vector<DeviceType> built = built_backends();
  auto has = [&](const Entry& e, Phase p, DeviceType d) {
    if (e.kernels.count({p, d})) return "yes";
    if (!e.declares(d)) return "n/a";  // MT_OP_BACKENDS leaves the backend out
    const bool needed = e.signature[p == Phase::Forward ? 0 : 1].defined() &&
                        std::find(built.begin(), built.end(), d) != built.end();
    return needed ? "MISSING" : " - ";  // MISSING: verify_ops() names it
  };
  size_t width = 2;  // the op column fits the longest name
  for (const auto& [name, e] : entries_) width = std::max(width, name.size());
  std::ostringstream os;
  os << std::left;
  auto row = [&](const std::string& op, const char* cf, const char* cb, const char* gf,
                 const char* gb, const std::string& math) {
    os << std::setw(int(width)) << op << ' ' << std::setw(8) << cf << ' ' << std::setw(8) << cb
       << ' ' << std::setw(8) << gf << ' ' << std::setw(8) << gb << "  " << math << '\n';
  };
  row("op", "cpu fwd", "cpu bwd", "cuda fwd", "cuda bwd", "math");
  for (const auto& [name, e] : entries_)
    row(name, has(e, Phase::Forward, DeviceType::CPU), has(e, Phase::Backward, DeviceType::CPU),
        has(e, Phase::Forward, DeviceType::CUDA), has(e, Phase::Backward, DeviceType::CUDA), e.math);
  return os.str();
}

}  // namespace mt
