#pragma once
// Autograd: the graph, the Function contract and the engine behind Tensor::backward.
//
// "Two kernels, one node". Each differentiable op is a forward kernel and a separate backward
// kernel, glued into the graph by one contract that mirrors torch.autograd.Function:
//
//   struct ScaledSiLUFn : Function<ScaledSiLUFn> {
//     static constexpr const char* name = "scaled_silu";
//     static Tensor forward(Context& ctx, const Tensor& x, const Tensor& w, bool inplace);
//     static GradList backward(Context& ctx, const GradList& dy);  // one entry PER forward argument
//   };
//   Tensor y = ScaledSiLUFn::apply(x, w, false);
//
// backward returns exactly one gradient per forward argument, in order; a non-differentiable
// argument (the bool above) gets an empty Tensor{}, like Python's None.
//
// A forward may also return several tensors (std::vector<Tensor>, say a value and a statistic).
// Its backward then receives one gradient per output, in order, undefined for an output that
// received none (it was not used, or only through non-differentiable paths), and still returns
// one gradient per forward argument. apply() returns the outputs, each one remembering which of
// the node's outputs it is. An integer output (an argmax, say) is not differentiable: it gets no
// history, and its slot in backward is always undefined. A wrong count, or a
// gradient whose shape, dtype or device differs from its input's, is an mt::Error naming the op,
// the argument and both shapes.
//
// .grad semantics (PyTorch's): a leaf's .grad is created on first use and then ADDED INTO (+=)
// by every backward until zero_grad(). The "grad sink" lets a backward add straight into a leaf's
// existing .grad (a GEMM with beta = 1, a final += of reduced partials) instead of returning a
// temporary that the engine would add afterwards. Sinks are always added into, never stored to.
#include <any>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace mt {

using GradList = std::vector<Tensor>;

// ---- grad mode ----------------------------------------------------------------------------

// Graph recording is on unless a NoGradGuard is alive on this thread (eval, optimizer steps).
struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// ---- watching the ops run ---------------------------------------------------------------------

// An OpObserver hears when each op's forward (Function::apply) and each node's backward (run by
// the engine) begins and ends, on the thread that runs it: the place for a profiler's CUDA events
// (bench/gpt_step.cpp splits a GPT step's GPU time by op this way). An op whose forward calls
// other ops is heard around each of them too, nested. One observer for the process, none by
// default (then each op pays one pointer test); set it before the ops run, not while they do.
struct OpObserver {
  virtual ~OpObserver() = default;
  virtual void begin(const char* op, bool backward) = 0;
  virtual void end(const char* op, bool backward) = 0;
};
void set_op_observer(OpObserver* observer);  // nullptr: none
OpObserver* op_observer();

namespace detail {
// Tells the observer, if there is one, of the op's begin now and of its end when the scope ends
// (also by an exception).
class ObservedOp {
 public:
  ObservedOp(const char* op, bool backward)
      : observer_(op_observer()), op_(op), backward_(backward) {
    if (observer_) observer_->begin(op_, backward_);
  }
  ~ObservedOp() {
    if (observer_) observer_->end(op_, backward_);
  }
  ObservedOp(const ObservedOp&) = delete;
  ObservedOp& operator=(const ObservedOp&) = delete;

 private:
  OpObserver* observer_;
  const char* op_;
  bool backward_;
};
}  // namespace detail

// ---- graph --------------------------------------------------------------------------------

struct Node;
struct Edge {
  std::shared_ptr<Node> node;  // empty: this input needs no gradient
  uint32_t output_nr = 0;      // which of node's outputs this input was
};

// A node of the backward graph. A node has num_outputs outputs (the tensors its op produced,
// usually one) and one edge per forward argument, pointing at the node (and output) that must
// receive that argument's gradient.
//
// Nodes own their children (next_edges), so dropping the output of an 8,000-layer model frees
// the whole chain. The destructor does that iteratively, not by recursing once per node: it
// frees saved tensors first and then takes over every child it holds the last reference to.
struct Node {
  virtual ~Node();
  virtual std::string name() const = 0;
  // Given the summed gradient of each of this node's outputs (undefined where every
  // contribution was empty), returns one gradient per edge (empty = none).
  virtual GradList apply(const GradList& grad_outputs) = 0;
  // Frees saved tensors (after a backward without retain_graph, and before destruction).
  virtual void release() {}

  std::vector<Edge> next_edges;
  uint32_t num_outputs = 1;
  uint64_t sequence_nr = 0;  // creation order: the engine runs later nodes first
};

// Where a leaf's gradient lands: adds into leaf.grad (creating it on first use), then runs the
// leaf's grad-ready hooks. One per leaf, shared by all its uses.
struct AccumulateGrad : Node {
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::string name() const override { return "AccumulateGrad"; }
  GradList apply(const GradList& grads) override;
  std::shared_ptr<TensorImpl> leaf;
};

// The dtype a leaf's .grad has: f64 for f64 leaves (gradient checks), fp32 for every other
// floating dtype, whatever the compute dtype.
DType grad_dtype_for(DType leaf_dtype);

// The edge a forward argument contributes: its grad_fn, its leaf's AccumulateGrad, or none.
Edge gradient_edge(const Tensor& t);

// ---- the Function contract ----------------------------------------------------------------

class Context {
 public:
  // Tensors backward needs and cannot cheaply regenerate (inputs like x and W, or an output,
  // as sigmoid keeps it). Reading one that was modified in place after it was saved is an error,
  // as in PyTorch. A saved output comes back without its history (grad_fn): keeping that would
  // make the output own its own node through the saved copy, a cycle that leaks the graph
  // whenever backward does not run. Backward runs without recording, so it never needs it.
  void save_for_backward(std::vector<Tensor> tensors);
  std::vector<Tensor> saved_tensors() const;

  // Non-tensor values backward needs (eps, flags, a normalizer). A tensor goes through
  // save_for_backward, whose version check and freeing a value would escape.
  template <class T> void set(const std::string& key, T value) {
    static_assert(!std::is_same_v<std::decay_t<T>, Tensor>, "save tensors with save_for_backward");
    values_[key] = std::move(value);
  }
  // A key forward never set, or one read as another type than it was set with, is an mt::Error
  // naming the op and the key.
  template <class T> T get(const std::string& key) const;

  // Whether forward argument i is a tensor that needs a gradient.
  bool needs_input_grad(size_t i) const { return i < needs_grad_.size() && needs_grad_[i]; }

  // If argument i is a leaf that needs a gradient, returns its .grad (created as zeros on first
  // use) for the backward kernel to ADD INTO; the backward then returns {} in slot i. Returns an
  // undefined tensor otherwise, and backward returns the gradient as usual.
  Tensor grad_sink(size_t i);

  // Filled by Function::apply / the engine.
  std::string op_name;
  std::vector<bool> needs_grad_;
  std::vector<std::shared_ptr<TensorImpl>> sink_leaves_;  // per argument: the leaf, or null
  std::vector<bool> sunk_;
  bool released_ = false;
  // Replaces saved copies of `out` (one of the forward's results) by history-free aliases of the
  // same storage, before Function::apply sets out's grad_fn (see save_for_backward).
  void unlink_saved_output(const Tensor& out);

 private:
  struct Saved {
    Tensor tensor;
    uint64_t version;
    const void* data;  // where its elements were: set_data (Module::to) may move them
  };
  std::vector<Saved> saved_;
  std::unordered_map<std::string, std::any> values_;
};

namespace detail {
std::string type_name(const std::type_info& t);  // readable ("double"), for error messages
}

template <class T> T Context::get(const std::string& key) const {
  auto it = values_.find(key);
  MT_CHECK(it != values_.end(), op_name, ": backward asked for '", key, "', which forward never set");
  const T* value = std::any_cast<T>(&it->second);
  MT_CHECK(value, op_name, ": backward asked for '", key, "' as ", detail::type_name(typeid(T)),
           ", but forward set it as ", detail::type_name(it->second.type()));
  return *value;
}

namespace detail {
// What the engine checks about each argument's gradient.
struct InputMeta {
  bool is_tensor = false;
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};
// Validates a backward's result against the forward arguments (count, shapes, dtypes, devices,
// sinks) and throws an mt::Error that names the op and the argument.
void validate_grads(const Context& ctx, const std::vector<InputMeta>& meta, const GradList& grads);
uint64_t next_sequence_nr();

template <class T> constexpr bool is_tensor_v = std::is_same_v<std::decay_t<T>, Tensor>;
}  // namespace detail

template <class Derived>
struct FunctionNode : Node {
  std::string name() const override { return Derived::name; }
  // A second backward without retain_graph fails only where the node needs what was freed, its
  // saved tensors (Context::saved_tensors): an add or a sum saves none, and runs again, as in
  // PyTorch.
  GradList apply(const GradList& grad_outputs) override {
    std::fill(ctx.sunk_.begin(), ctx.sunk_.end(), false);
    GradList grads;
    bool any = false;
    for (const Tensor& g : grad_outputs) any = any || g.defined();
    if (any) grads = Derived::backward(ctx, grad_outputs);
    else grads.assign(meta.size(), Tensor());  // no gradient flowed in: none flows out
    detail::validate_grads(ctx, meta, grads);
    return grads;
  }
  void release() override {
    ctx.released_ = true;
    ctx.save_for_backward({});
  }
  Context ctx;
  std::vector<detail::InputMeta> meta;
};

namespace detail {
// Ties the forward's outputs to their node: each gets the node as grad_fn and its index as
// output_nr. An output that is one of the inputs, or another output, is an mt::Error.
void link_outputs(const std::string& op, const std::shared_ptr<Node>& node, Context& ctx,
                  const std::vector<Tensor>& outputs, const std::vector<const Tensor*>& inputs);
}  // namespace detail

// Function::apply returns what Derived::forward returns: a Tensor, or a std::vector<Tensor> for
// an op with several outputs.
template <class Derived>
struct Function {
  template <class... Args>
  static auto apply(const Args&... args) {
    auto node = std::make_shared<FunctionNode<Derived>>();
    Context& ctx = node->ctx;
    ctx.op_name = Derived::name;
    bool any_needs = false;
    std::vector<const Tensor*> tensor_args;
    auto visit = [&](const auto& a) {
      detail::InputMeta m;
      Edge e;
      std::shared_ptr<TensorImpl> leaf;
      if constexpr (detail::is_tensor_v<decltype(a)>) {
        tensor_args.push_back(&a);
        m.is_tensor = a.defined();
        if (a.defined() && GradMode::is_enabled()) {
          m.shape = a.shape();
          m.dtype = a.dtype();
          m.device = a.device();
          e = gradient_edge(a);
          if (e.node && a.is_leaf()) leaf = a.impl_ptr();
        }
      }
      ctx.needs_grad_.push_back(e.node != nullptr);
      any_needs = any_needs || e.node != nullptr;
      node->next_edges.push_back(std::move(e));
      ctx.sink_leaves_.push_back(std::move(leaf));
      node->meta.push_back(std::move(m));
    };
    (visit(args), ...);
    ctx.sunk_.assign(ctx.needs_grad_.size(), false);
    using Out = decltype(Derived::forward(ctx, args...));
    static_assert(std::is_same_v<Out, Tensor> || std::is_same_v<Out, std::vector<Tensor>>,
                  "Function: forward must return a Tensor or a std::vector<Tensor>");
    Out out;
    {
      NoGradGuard no_grad;  // the forward's inner work is not recorded
      detail::ObservedOp observed(Derived::name, /*backward=*/false);
      out = Derived::forward(ctx, args...);
    }
    if (any_needs) {
      node->sequence_nr = detail::next_sequence_nr();
      if constexpr (std::is_same_v<Out, Tensor>)
        detail::link_outputs(Derived::name, node, ctx, std::vector<Tensor>{out}, tensor_args);
      else detail::link_outputs(Derived::name, node, ctx, out, tensor_args);
    }
    return out;
  }
};

// Runs backpropagation from `root` (Tensor::backward calls this).
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph);
// From several tensors at once, one gradient each (torch.autograd.backward): what an op with
// several outputs, or a loss made of several terms, needs. Every node runs once, after all the
// gradients reaching it from every root have been summed.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph = false);

}  // namespace mt
