#pragma once
// nn::Module: a tree of named parameters, buffers and child modules, as in torch.nn.Module.
//
//   struct Net : nn::Module {
//     Net() {
//       fc1 = register_module("fc1", nn::Linear(32, 64));  // returns std::shared_ptr<nn::Linear>
//       fc2 = register_module("fc2", nn::Linear(64, 8));
//     }
//     Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }
//     std::shared_ptr<nn::Linear> fc1, fc2;
//   };
//
// A module's own tensors come from register_parameter (which sets requires_grad) and
// register_buffer. Names are dotted paths in registration order ("fc1.weight", "layers.0.bias"):
// they are the keys
// of state_dict() and so of checkpoints, and stay stable as long as the code registers the same
// things in the same order.
//
// Modules are move-only values. Passing one by value hands it to a shared_ptr (register_module,
// Sequential{...}); share an existing module by passing its shared_ptr instead.
//
// What a module does NOT do: train()/eval() only flip a flag and never touch gradients (an eval
// pass between two microbatches must leave the accumulated .grad alone), and to(...) changes
// each parameter in place (Tensor::set_data), so optimizers holding the handles keep working.
#include <concepts>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mt::nn {

// An ordered list of (dotted name, tensor), in the module's order: each module's parameters, then
// its buffers, then its children's. A vector, not a map, so that a checkpoint lists its tensors in
// the order a reader of the model's code expects.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // One tensor in, one out. A module whose forward takes other arguments (two tensors, a struct)
  // declares its own and leaves this one, which then throws, as torch.nn.Module's does.
  virtual Tensor forward(const Tensor& x);
  // forward(x), then the thread's forward hook, if one is set (ForwardHookGuard below).
  Tensor operator()(const Tensor& x);

  // One line describing this module alone, e.g. "Linear(in_features=32, out_features=8,
  // bias=true)"; operator<< prints the whole tree, as PyTorch's repr does.
  virtual std::string repr() const { return "Module"; }

  // ---- registration ---------------------------------------------------------------------
  // A name is non-empty, has no '.', and is unique among this module's parameters, buffers and
  // children. Returns the registered handle.
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  // State that is saved and moved with the module but not trained (running statistics, say).
  Tensor register_buffer(const std::string& name, Tensor t);
  template <std::derived_from<Module> M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }
  template <std::derived_from<Module> M>
  std::shared_ptr<M> register_module(const std::string& name, M&& m) {
    return register_module(name, std::make_shared<M>(std::move(m)));
  }

  // ---- traversal ------------------------------------------------------------------------
  // Recursive unless recurse = false; registration order, children after own tensors.
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::shared_ptr<Module>> children() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const {
    return children_;
  }
  // Every descendant under its dotted name ("layers", "layers.0", ...), parents before children;
  // the module itself is not listed.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;

  // ---- mode, placement, gradients -------------------------------------------------------
  // Sets the flag on this module and every descendant. Gradients are not touched.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves every parameter and buffer (and its .grad and compute copy) in place.
  void to(Device device);
  // Converts every floating parameter and buffer in place: f32 (the default) or f64 (gradient
  // checks). Mixed precision keeps fp32 parameters and uses set_compute_dtype instead.
  void to(DType dtype);

  // The dtype the GEMMs run in. bf16/f16: every Linear weight and bias gets a detached compute-dtype copy
  // (Tensor::compute_copy) that the optimizer refreshes after each update; f32 drops the copies.
  virtual void set_compute_dtype(DType dtype);

  // Every parameter's .grad set to none (the default, as in PyTorch) or filled with zeros.
  void zero_grad(bool set_to_none = true);

  // ---- checkpoints ----------------------------------------------------------------------
  // Parameters and buffers under their dotted names. The tensors are detached views that SHARE
  // storage with the module (as in PyTorch): clone them to keep a snapshot.
  StateDict state_dict() const;
  // Copies values in (copy_, across devices). Shape or dtype mismatches are errors that name the
  // key and both sides. strict = true also makes a key the module lacks, or one the dict lacks,
  // an error; strict = false ignores both, as PyTorch does. Nothing is copied unless every check
  // passes, so a failed load leaves the module unchanged.
  void load_state_dict(const StateDict& dict, bool strict = true);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> child);
  void check_new_name(const std::string& name, const char* what) const;
  enum class Kind { parameters, buffers, both };
  // Calls f(dotted name, handle) for this module's tensors of `kind`, then its children's
  // (PyTorch's order: own parameters, own buffers, then each child in registration order).
  template <class F> void visit(Kind kind, bool recurse, const std::string& prefix, F&& f) const;

  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Eval mode for a scope (a validation pass mid-training, sampling): the module and its children
// go back to the mode the module had when the scope ends, also when an exception ends it.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(Module& m) : m_(m), was_training_(m.is_training()) { m.eval(); }
  ~EvalModeGuard() { m_.train(was_training_); }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  Module& m_;
  bool was_training_;
};

// A function called with each module and its output after every Module::operator() on this
// thread while a ForwardHookGuard holds it (the innermost module finishes, and is seen, first).
// The trainer's non-finite forensics uses it to name the first module whose output is NaN or inf.
using ForwardHook = std::function<void(const Module& module, const Tensor& output)>;
class ForwardHookGuard {
 public:
  explicit ForwardHookGuard(ForwardHook hook);
  ~ForwardHookGuard();  // restores the hook that was set before
  ForwardHookGuard(const ForwardHookGuard&) = delete;
  ForwardHookGuard& operator=(const ForwardHookGuard&) = delete;

 private:
  ForwardHook hook_;
  ForwardHook* previous_;
};

// Whether a forward hook is set on this thread (containers that fuse layers run them one by one
// while it is, so the hook sees every layer's output).
bool forward_hook_active();

// Prints the module tree: "Sequential(\n  (0): Linear(...)\n  ...\n)".
std::ostream& operator<<(std::ostream& os, const Module& m);

// Rewrites each parameter's compute copy (if it has one) from its fp32 value, in place. The fused
// CUDA AdamW does this inside its update; every other update path calls this afterwards.
void refresh_compute_copies(const std::vector<Tensor>& params);

}  // namespace mt::nn
