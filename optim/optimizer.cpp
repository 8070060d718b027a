#include "optim/optimizer.h"

#include <charconv>
#include <set>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/registry.h"
#include "optim/kernels.h"

namespace mt::optim {

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay,
                     std::vector<std::string> buffer_names)
    : groups_(std::move(groups)), buffer_names_(std::move(buffer_names)) {
  std::set<const TensorImpl*> seen;
  for (ParamGroup& g : groups_) {
    if (!g.lr) g.lr = lr;
    if (!g.weight_decay) g.weight_decay = weight_decay;
    MT_CHECK(*g.lr >= 0 && *g.weight_decay >= 0, "optimizer: lr and weight_decay must be >= 0, got lr ",
             *g.lr, " and weight_decay ", *g.weight_decay);
    for (const Tensor& p : g.params) {
      MT_CHECK(p.defined() && p.is_leaf() && (p.dtype() == DType::f32 || p.dtype() == DType::f64),
               "optimizer: parameters must be f32 or f64 leaf tensors (got ",
               p.defined() ? dtype_name(p.dtype()) : "an undefined tensor", ")");
      MT_CHECK(seen.insert(p.impl_ptr().get()).second, "optimizer: a parameter of shape ",
               shape_str(p.shape()), " appears twice in the parameter groups");
    }
  }
  state_.resize(seen.size());
}

MT_DEFINE_OP(zero_grads, "g = 0 for every gradient, one launch per device", ZeroGradsFn, void);
MT_OP_BACKENDS(zero_grads, CUDA);

void Optimizer::zero_grad(bool set_to_none) {
  // The contiguous fp32 CUDA gradients are zeroed in one launch per device (one node of a CUDA
  // graph instead of one per parameter); any other gradient by its own fill.
  auto batched = [&](const Tensor& grad) {
    return !set_to_none && grad.defined() && grad.device().is_cuda() && grad.dtype() == DType::f32 &&
           grad.is_contiguous();
  };
  std::vector<Tensor> on_device;
  for (ParamGroup& g : groups_)
    for (Tensor& p : g.params)
      if (batched(p.grad())) on_device.push_back(p.grad());
  if (!on_device.empty())
    kernel<ZeroGradsFn>("zero_grads", Phase::Forward, on_device[0].device())(on_device);
  for (ParamGroup& g : groups_)
    for (Tensor& p : g.params)
      if (!batched(p.grad())) p.zero_grad(set_to_none);
}

[[noreturn]] static void not_capturable(const char* call) {
  MT_THROW("optimizer: ", call, ": this optimizer keeps its per-step values on the host and has no "
           "prepare_step/apply_step split (a CUDA graph needs a capturable one: AdamW)");
}
void Optimizer::prepare_step() { not_capturable("prepare_step"); }
void Optimizer::apply_step() { not_capturable("apply_step"); }

void Optimizer::set_lr(double lr) {
  MT_CHECK(lr >= 0, "optimizer: set_lr(", lr, "): the learning rate must be >= 0");
  for (ParamGroup& g : groups_) g.lr = lr;
}

Tensor& Optimizer::buffer(size_t index, const std::string& name, const Tensor& p, DType dtype) {
  Tensor& b = state_[index].buffers[name];
  if (!b.defined()) b = zeros(p.shape(), dtype, p.device());
  else if (b.device() != p.device() || b.dtype() != dtype) b = b.to(p.device()).to(dtype);
  return b;
}

// "state.<index>.<name>" -> (index, name); false for anything else.
static bool parse_state_key(const std::string& key, size_t& index, std::string& name) {
  const std::string prefix = "state.";
  if (key.rfind(prefix, 0) != 0) return false;
  const char* first = key.data() + prefix.size();
  const char* last = key.data() + key.size();
  auto [end, ec] = std::from_chars(first, last, index);
  if (ec != std::errc() || end == first || end == last || *end != '.') return false;
  name = std::string(end + 1, last);
  return !name.empty();
}

static Tensor scalar_i64(int64_t v) { return from_vector(std::vector<int64_t>{v}, {}); }

nn::StateDict Optimizer::state_dict() const {
  nn::StateDict out;
  out.emplace_back("step", scalar_i64(steps_));
  for (size_t i = 0; i < state_.size(); ++i) {
    const std::string prefix = "state." + std::to_string(i) + ".";
    out.emplace_back(prefix + "step", scalar_i64(state_[i].step));
    for (const auto& [name, t] : state_[i].buffers) out.emplace_back(prefix + name, t.detach());
  }
  return out;
}

void Optimizer::load_state_dict(const nn::StateDict& dict) {
  std::vector<const Tensor*> params;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) params.push_back(&p);

  std::vector<ParamState> state(state_.size());
  std::vector<bool> counted(state_.size(), false);
  std::optional<int64_t> steps;
  NoGradGuard no_grad;
  for (const auto& [key, t] : dict) {
    // A step count is one i64 >= 0, read as an integer: a float (NaN, 1e300) is not a count.
    auto count = [&] {
      MT_CHECK(t.numel() == 1 && t.dtype() == DType::i64, "optimizer load_state_dict: '", key,
               "' must be one i64 value, got ", dtype_name(t.dtype()), " of shape ", shape_str(t.shape()));
      const int64_t v = t.to(kCPU).contiguous().data<int64_t>()[0];
      MT_CHECK(v >= 0, "optimizer load_state_dict: '", key, "' is ", v, "; a step count is >= 0");
      return v;
    };
    if (key == "step") {
      MT_CHECK(!steps, "optimizer load_state_dict: 'step' appears twice");
      steps = count();
      continue;
    }
    size_t i = 0;
    std::string name;
    MT_CHECK(parse_state_key(key, i, name), "optimizer load_state_dict: unexpected key '", key,
             "' (expected 'step' or 'state.<index>.<name>')");
    MT_CHECK(i < params.size(), "optimizer load_state_dict: '", key, "' refers to parameter ", i,
             " but the optimizer has ", params.size());
    if (name == "step") {
      MT_CHECK(!counted[i], "optimizer load_state_dict: '", key, "' appears twice");
      counted[i] = true;
      state[i].step = count();
      continue;
    }
    bool known = false;
    for (const std::string& b : buffer_names_) known |= b == name;
    MT_CHECK(known, "optimizer load_state_dict: unexpected key '", key, "': this optimizer keeps no '",
             name, "' state");
    const Tensor& p = *params[i];
    const DType dtype = grad_dtype_for(p.dtype());
    MT_CHECK(t.shape() == p.shape() && t.dtype() == dtype, "optimizer load_state_dict: '", key,
             "' is ", shape_str(t.shape()), " ", dtype_name(t.dtype()), " but parameter ", i, " needs ",
             shape_str(p.shape()), " ", dtype_name(dtype));
    Tensor copy = empty(p.shape(), dtype, p.device());
    copy.copy_(t);
    MT_CHECK(state[i].buffers.emplace(name, copy).second, "optimizer load_state_dict: '", key,
             "' appears twice");
  }
  MT_CHECK(steps.has_value(), "optimizer load_state_dict: the state dict has no 'step'");
  // Every updated parameter has all its buffers (a missing one would restart from zeros), and no
  // parameter has had more updates than the optimizer has taken steps.
  for (size_t i = 0; i < state.size(); ++i) {
    const std::string prefix = "state." + std::to_string(i) + ".";
    // Every parameter's count is there, 0 for one not updated yet: a lost entry is an error,
    // never a parameter silently restarted from zeros.
    MT_CHECK(counted[i], "optimizer load_state_dict: '", prefix, "step' is missing: parameter ", i,
             " has no state (every parameter's count must be there, 0 if it was never updated)");
    if (state[i].step == 0) {
      MT_CHECK(state[i].buffers.empty(), "optimizer load_state_dict: '", prefix,
               state[i].buffers.begin()->first, "' is given but '", prefix, "step' is 0");
      continue;
    }
    MT_CHECK(state[i].step <= *steps, "optimizer load_state_dict: '", prefix, "step' is ",
             state[i].step, " but the optimizer has taken only ", *steps, " steps ('step')");
    for (const std::string& b : buffer_names_)
      MT_CHECK(state[i].buffers.count(b), "optimizer load_state_dict: '", prefix, b,
               "' is missing (parameter ", i, " has been updated ", state[i].step, " times)");
  }
  state_ = std::move(state);
  steps_ = *steps;
}

std::vector<ParamGroup> Optimizer::decay_groups(const nn::Module& module, double weight_decay,
                                                const DecayPredicate& decays) {
  ParamGroup decay{{}, std::nullopt, weight_decay}, no_decay{{}, std::nullopt, 0.0};
  for (const auto& [name, p] : module.named_parameters()) {
    const bool d = decays ? decays(name, p) : p.dim() >= 2;
    (d ? decay : no_decay).params.push_back(p);
  }
  return {decay, no_decay};
}

}  // namespace mt::optim
