#include "nn/module.h"

#include <map>
#include <ostream>

#include "core/autograd.h"
#include "core/error.h"

namespace mt::nn {

template <class F>
void Module::visit(Kind kind, bool recurse, const std::string& prefix, F&& f) const {
  if (kind != Kind::buffers)
    for (const auto& [name, t] : parameters_) f(prefix + name, t);
  if (kind != Kind::parameters)
    for (const auto& [name, t] : buffers_) f(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->visit(kind, true, prefix + name + ".", f);
}

namespace {
thread_local ForwardHook* forward_hook = nullptr;
}  // namespace

ForwardHookGuard::ForwardHookGuard(ForwardHook hook) : hook_(std::move(hook)), previous_(forward_hook) {
  forward_hook = &hook_;
}

ForwardHookGuard::~ForwardHookGuard() { forward_hook = previous_; }

bool forward_hook_active() { return forward_hook != nullptr; }

Tensor Module::forward(const Tensor&) {
  MT_THROW(repr(), ": this module has no one-tensor forward; call the forward it declares");
}

Tensor Module::operator()(const Tensor& x) {
  Tensor y = forward(x);
  if (forward_hook != nullptr) (*forward_hook)(*this, y);
  return y;
}

void Module::check_new_name(const std::string& name, const char* what) const {
  MT_CHECK(!name.empty() && name.find('.') == std::string::npos, repr(), ": ", what, " name '",
           name, "' must be non-empty and contain no '.' (dots separate the levels of a name)");
  auto taken = [&](const auto& list) {
    for (const auto& entry : list)
      if (entry.first == name) return true;
    return false;
  };
  MT_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), repr(), ": cannot register ",
           what, " '", name, "': the name is already taken");
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, "parameter");
  MT_CHECK(t.defined(), repr(), ": parameter '", name, "' is an undefined tensor");
  t.set_requires_grad(requires_grad);
  parameters_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name, "buffer");
  MT_CHECK(t.defined(), repr(), ": buffer '", name, "' is an undefined tensor");
  buffers_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> child) {
  check_new_name(name, "module");
  MT_CHECK(child, repr(), ": module '", name, "' is null");
  children_.emplace_back(name, std::move(child));
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  visit(Kind::parameters, recurse, "", [&](const std::string&, const Tensor& t) { out.push_back(t); });
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  visit(Kind::parameters, recurse, "", [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  visit(Kind::buffers, recurse, "", [&](const std::string&, const Tensor& t) { out.push_back(t); });
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  visit(Kind::buffers, recurse, "", [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t); });
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& entry : children_) out.push_back(entry.second);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& [name, child] : children_) {
    out.emplace_back(name, child);
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(name + "." + sub, std::move(m));
  }
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (const auto& entry : children_) entry.second->train(on);
}

void Module::to(Device device) {
  NoGradGuard no_grad;  // a move is not part of any graph
  visit(Kind::both, true, "", [&](const std::string&, Tensor t) {
    Tensor grad = t.grad(), copy = t.compute_copy();
    t.set_data(t.to(device));
    if (grad.defined()) t.set_grad(grad.to(device));
    if (copy.defined()) t.set_compute_copy(copy.to(device));
  });
}

void Module::to(DType dtype) {
  MT_CHECK(dtype == DType::f32 || dtype == DType::f64, repr(), ".to(", dtype_name(dtype),
           "): parameters are f32 or f64; for bf16/f16 compute keep f32 parameters and call "
           "set_compute_dtype(", dtype_name(dtype), ")");
  NoGradGuard no_grad;
  visit(Kind::both, true, "", [&](const std::string&, Tensor t) {
    if (!is_floating(t.dtype()) || t.dtype() == dtype) return;
    Tensor grad = t.grad();
    t.set_data(t.to(dtype));
    if (grad.defined()) t.set_grad(grad.to(grad_dtype_for(dtype)));
    refresh_compute_copies({t});
  });
}

void Module::set_compute_dtype(DType dtype) {
  MT_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16, repr(),
           ".set_compute_dtype(", dtype_name(dtype), "): expected f32, bf16 or f16 (f64 is a "
           "parameter dtype: use to(DType::f64))");
  for (const auto& entry : children_) entry.second->set_compute_dtype(dtype);
}

void Module::zero_grad(bool set_to_none) {
  for (Tensor p : parameters()) p.zero_grad(set_to_none);
}

StateDict Module::state_dict() const {
  StateDict out;
  visit(Kind::both, true, "", [&](const std::string& n, const Tensor& t) { out.emplace_back(n, t.detach()); });
  return out;
}

void Module::load_state_dict(const StateDict& dict, bool strict) {
  std::map<std::string, Tensor> given;
  for (const auto& [key, t] : dict)
    MT_CHECK(given.emplace(key, t).second, "load_state_dict: key '", key, "' appears twice in the state dict");

  // Check everything first, so that a failed load changes nothing.
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source)
  std::string missing, unexpected;
  visit(Kind::both, true, "", [&](const std::string& key, const Tensor& t) {
    auto it = given.find(key);
    if (it == given.end()) {
      missing += (missing.empty() ? "'" : ", '") + key + "'";
      return;
    }
    const Tensor& src = it->second;
    MT_CHECK(src.shape() == t.shape(), "load_state_dict: '", key, "' has shape ", shape_str(src.shape()),
             " in the state dict but ", shape_str(t.shape()), " in the module");
    MT_CHECK(src.dtype() == t.dtype(), "load_state_dict: '", key, "' has dtype ", dtype_name(src.dtype()),
             " in the state dict but ", dtype_name(t.dtype()), " in the module");
    copies.emplace_back(t, src);
    given.erase(it);
  });
  for (const auto& entry : given) unexpected += (unexpected.empty() ? "'" : ", '") + entry.first + "'";
  if (strict) {
    MT_CHECK(missing.empty(), "load_state_dict: missing keys (in the module, not in the state dict): ",
             missing);
    MT_CHECK(unexpected.empty(), "load_state_dict: unexpected keys (in the state dict, not in the "
             "module): ", unexpected);
  }

  NoGradGuard no_grad;
  for (const auto& [dst, src] : copies) {
    dst.copy_(src);
    refresh_compute_copies({dst});
  }
}

static void print_tree(std::ostream& os, const Module& m, const std::string& indent) {
  os << m.repr();
  if (m.named_children().empty()) return;
  os << "(\n";
  for (const auto& [name, child] : m.named_children()) {
    os << indent << "  (" << name << "): ";
    print_tree(os, *child, indent + "  ");
    os << "\n";
  }
  os << indent << ")";
}

std::ostream& operator<<(std::ostream& os, const Module& m) {
  print_tree(os, m, "");
  return os;
}

void refresh_compute_copies(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  for (const Tensor& p : params)
    if (Tensor copy = p.compute_copy(); copy.defined()) copy.copy_(p);
}

}  // namespace mt::nn
