#include "core/autograd.h"

#include <cxxabi.h>

#include <atomic>
#include <cstdlib>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/accumulate.h"

namespace mt {

// ---- grad mode ----------------------------------------------------------------------------

static thread_local bool grad_mode_enabled = true;
bool GradMode::is_enabled() { return grad_mode_enabled; }
void GradMode::set_enabled(bool enabled) { grad_mode_enabled = enabled; }

static OpObserver* the_op_observer = nullptr;
void set_op_observer(OpObserver* observer) { the_op_observer = observer; }
OpObserver* op_observer() { return the_op_observer; }

uint64_t detail::next_sequence_nr() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

// ---- graph teardown -------------------------------------------------------------------------

// PyTorch's deleteNode: a recursive teardown would nest one destructor per node and overflow the
// stack on a deep graph. Saved tensors go first, because a saved input holds its producer's node
// too; after that, a child whose last owner is this edge moves onto a local worklist, and is
// destroyed there with its own edges already emptied, so no destructor runs inside another.
Node::~Node() {
  std::vector<std::shared_ptr<Node>> worklist;
  auto take_children = [&](Node& n) {
    for (Edge& e : n.next_edges)
      if (e.node && e.node.use_count() == 1) worklist.push_back(std::move(e.node));
    n.next_edges.clear();
  };
  take_children(*this);  // this node's saved tensors died with the derived class's members
  while (!worklist.empty()) {
    std::shared_ptr<Node> n = std::move(worklist.back());
    worklist.pop_back();
    n->release();
    take_children(*n);
  }  // n, now childless, is destroyed here
}

// ---- leaves -------------------------------------------------------------------------------

DType grad_dtype_for(DType leaf_dtype) { return leaf_dtype == DType::f64 ? DType::f64 : DType::f32; }

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> l) : leaf(std::move(l)) {
  // Leaves finish last among their users: give them the highest priority once ready.
  sequence_nr = UINT64_MAX;
}

// Creates leaf.grad if needed (a buffer of its own, never an op's output) and checks that an
// existing one (possibly set by the user) is one a kernel may add into through a raw pointer.
static Tensor ensure_grad(const std::string& op, size_t arg, TensorImpl& leaf) {
  const DType gd = grad_dtype_for(leaf.dtype);
  const Device dev = leaf.storage->device();
  if (!leaf.grad) leaf.grad = zeros(leaf.shape, gd, dev).impl_ptr();
  Tensor g(leaf.grad);
  MT_CHECK(g.shape() == leaf.shape && g.dtype() == gd && g.device() == dev && g.is_contiguous(),
           op, ": argument ", arg, "'s .grad (shape ", shape_str(g.shape()), ", ",
           dtype_name(g.dtype()), ", ", g.device().str(), g.is_contiguous() ? "" : ", strided",
           ") cannot receive its gradient (shape ", shape_str(leaf.shape), ", ", dtype_name(gd),
           ", ", dev.str(), "); zero_grad() it or set a matching contiguous one");
  return g;
}

GradList AccumulateGrad::apply(const GradList& grads) {
  const Tensor& grad = grads[0];
  if (grad.defined()) {
    if (!leaf->grad) {
      // First use: a fresh copy in the grad dtype. clone() guarantees the leaf owns its buffer
      // (returning `grad` itself would alias whatever tensor the op produced).
      leaf->grad = grad.to(grad_dtype_for(leaf->dtype)).clone().impl_ptr();
    } else {
      add_into(Tensor(leaf->grad), grad);
    }
  }
  Tensor self(leaf);
  for (auto& hook : leaf->grad_ready_hooks) hook(self);
  return {};
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.impl().output_nr};
  TensorImpl& impl = t.impl();
  auto acc = impl.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl.grad_accumulator = acc;
  }
  return {acc};
}

// ---- Context ------------------------------------------------------------------------------

std::string detail::type_name(const std::type_info& t) {
  int status = 0;
  char* readable = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && readable ? readable : t.name();
  std::free(readable);
  return out;
}

void Context::save_for_backward(std::vector<Tensor> tensors) {
  saved_.clear();
  for (auto& t : tensors) {
    const uint64_t v = t.defined() ? t.version() : 0;
    const void* data = t.defined() ? t.data_ptr() : nullptr;
    saved_.push_back({std::move(t), v, data});
  }
}

void Context::unlink_saved_output(const Tensor& out) {
  // detach() shares the storage, and so its version counter: the in-place check still holds.
  for (Saved& s : saved_)
    if (s.tensor.is_same(out)) s.tensor = out.detach();
}

void detail::link_outputs(const std::string& op, const std::shared_ptr<Node>& node, Context& ctx,
                          const std::vector<Tensor>& outputs,
                          const std::vector<const Tensor*>& inputs) {
  MT_CHECK(!outputs.empty(), op, ": forward returned no tensor");
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& out = outputs[k];
    MT_CHECK(out.defined(), op, ": forward's output ", k, " is undefined; return a tensor");
    for (const Tensor* in : inputs)
      MT_CHECK(!out.is_same(*in), op, ": forward returned one of its inputs (as output ", k,
               ") while a gradient is needed; return a new tensor");
    for (size_t j = 0; j < k; ++j)
      MT_CHECK(!out.is_same(outputs[j]), op, ": forward returned the same tensor as outputs ", j,
               " and ", k, "; return distinct tensors");
  }
  node->num_outputs = uint32_t(outputs.size());
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& out = outputs[k];
    ctx.unlink_saved_output(out);
    if (!is_floating(out.dtype())) continue;  // an index output has no gradient
    out.impl().grad_fn = node;
    out.impl().output_nr = uint32_t(k);
    out.impl().requires_grad = true;
  }
}

std::vector<Tensor> Context::saved_tensors() const {
  MT_CHECK(!released_, op_name, ": backward through the graph a second time, but its saved "
           "tensors were freed after the first; pass retain_graph=true to the first backward");
  std::vector<Tensor> out;
  for (size_t i = 0; i < saved_.size(); ++i) {
    const Saved& s = saved_[i];
    if (s.tensor.defined()) {
      MT_CHECK(s.tensor.data_ptr() == s.data, op_name, ": saved tensor ", i, " was given other "
               "data (set_data, as Module::to does) after it was saved for backward; the "
               "backward would read memory that is not what the forward saw. Run the backward "
               "before moving or converting the model");
      MT_CHECK(s.tensor.version() == s.version, op_name, ": saved tensor ", i, " (shape ",
               shape_str(s.tensor.shape()), ") was modified in place after it was saved for "
               "backward (version ", s.version, " -> ", s.tensor.version(), "); its gradient "
               "would be wrong. Clone it before modifying, or don't modify it in place");
    }
    out.push_back(s.tensor);
  }
  return out;
}

Tensor Context::grad_sink(size_t i) {
  if (i >= sink_leaves_.size() || !sink_leaves_[i] || !needs_input_grad(i)) return {};
  sunk_[i] = true;
  return ensure_grad(op_name, i, *sink_leaves_[i]);
}

void detail::validate_grads(const Context& ctx, const std::vector<InputMeta>& meta,
                            const GradList& grads) {
  MT_CHECK(grads.size() == meta.size(), ctx.op_name, ": backward returned ", grads.size(),
           " gradient(s) but forward took ", meta.size(), " argument(s); return exactly one per "
           "forward argument, {} for a non-differentiable one");
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    const InputMeta& m = meta[i];
    MT_CHECK(m.is_tensor, ctx.op_name, ": backward returned a gradient for argument ", i,
             ", which is not a tensor; return {} for it");
    MT_CHECK(!ctx.sunk_[i], ctx.op_name, ": backward both added argument ", i, "'s gradient "
             "into its grad sink and returned it; return {} for a sunk argument");
    MT_CHECK(g.shape() == m.shape, ctx.op_name, ": gradient for argument ", i, " has shape ",
             shape_str(g.shape()), " but the argument has shape ", shape_str(m.shape));
    MT_CHECK(g.dtype() == m.dtype, ctx.op_name, ": gradient for argument ", i, " (shape ",
             shape_str(g.shape()), ") has dtype ", dtype_name(g.dtype()),
             " but the argument has dtype ", dtype_name(m.dtype));
    MT_CHECK(g.device() == m.device, ctx.op_name, ": gradient for argument ", i, " (shape ",
             shape_str(g.shape()), ") is on ", g.device().str(), " but the argument is on ",
             m.device.str());
  }
}

// ---- engine -------------------------------------------------------------------------------

void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  backward({root}, {grad}, retain_graph);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  MT_CHECK(!roots.empty(), "backward: no tensor given");
  MT_CHECK(grads.size() == roots.size(), "backward: ", roots.size(), " tensor(s) but ", grads.size(),
           " gradient(s); give one per tensor (an undefined one for a single-element tensor)");
  std::vector<Tensor> seeds(roots.size());
  for (size_t r = 0; r < roots.size(); ++r) {
    const Tensor& root = roots[r];
    MT_CHECK(root.requires_grad(), "backward: tensor of shape ", shape_str(root.shape()),
             " does not require grad and has no grad_fn");
    Tensor seed = grads[r];
    if (seed.defined()) {
      MT_CHECK(seed.shape() == root.shape(), "backward: gradient of shape ", shape_str(seed.shape()),
               " does not match the output's shape ", shape_str(root.shape()));
      seed = seed.to(root.dtype()).to(root.device());
    } else {
      MT_CHECK(root.numel() == 1, "backward: a gradient can be implied only for a single-element "
               "output, but the output has shape ", shape_str(root.shape()), "; pass one explicitly");
      seed = ones(root.shape(), root.dtype(), root.device());
    }
    seeds[r] = std::move(seed);
  }
  NoGradGuard no_grad;  // nothing the backward does is recorded

  // 1. Dependency counts: how many edges of the reachable graph point at each node.
  //    Iterative, so a 10,000-op chain needs no deep recursion.
  std::vector<Edge> root_edges;  // held here: a leaf root's AccumulateGrad lives only in them
  for (const Tensor& root : roots) root_edges.push_back(gradient_edge(root));
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const Edge& e : root_edges)
    if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.node) continue;
      ++deps[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }

  // 2. Run nodes whose gradients are complete, latest-created first (a deterministic order).
  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr < b->sequence_nr;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(later_first)>
      ready(later_first);
  // The summed incoming gradient of each output of each node that is waiting to run.
  std::unordered_map<Node*, GradList> buffer;
  auto slots_of = [&](Node* n) -> GradList& {
    GradList& slots = buffer[n];
    if (slots.empty()) slots.resize(n->num_outputs);
    return slots;
  };
  // Seed every root's slot. A root that another root's graph also reaches waits for it.
  std::unordered_set<Node*> queued;
  for (size_t r = 0; r < roots.size(); ++r) {
    const Edge& e = root_edges[r];
    Tensor& slot = slots_of(e.node.get())[e.output_nr];
    slot = slot.defined() ? sum_of(slot, seeds[r]) : seeds[r];
    if (deps[e.node.get()] == 0 && queued.insert(e.node.get()).second) ready.push(e.node);
  }
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    GradList g = std::move(slots_of(node.get()));
    buffer.erase(node.get());
    GradList grads;
    {
      const std::string name = op_observer() ? node->name() : std::string();
      detail::ObservedOp observed(name.c_str(), /*backward=*/true);
      grads = node->apply(g);
    }
    if (!retain_graph) node->release();
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& edge = node->next_edges[i];
      Node* child = edge.node.get();
      if (!child) continue;
      if (i < grads.size() && grads[i].defined()) {
        Tensor& slot = slots_of(child)[edge.output_nr];
        // Out of place: an op may hand the same tensor to two inputs (add's backward does).
        slot = slot.defined() ? sum_of(slot, grads[i]) : grads[i];
      }
      if (--deps[child] == 0) ready.push(edge.node);
    }
  }
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  run_backward(*this, grad, retain_graph);
}

}  // namespace mt
