#pragma once
// The layers of an MLP and the containers that stack them.
//
//   nn::Sequential model{nn::Linear(784, 256), nn::RMSNorm(256), nn::ScaledSiLU(),
//                        nn::Linear(256, 10)};
//   Tensor logits = model(x);
//
// Every parameter is fp32 (f64 after Module::to(DType::f64)); bf16/f16 compute goes through
// Module::set_compute_dtype, which gives Linear weights and biases compute-dtype copies for the
// GEMMs.
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace mt::nn {

// y = x·Wᵀ + b, W [out, in], b [out]. PyTorch's default init: W by kaiming_uniform_(a = √5) and
// b ~ U(−1/√in, 1/√in), i.e. both uniform within ±1/√in, W drawn first.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;
  void set_compute_dtype(DType dtype) override;

  int64_t in_features, out_features;
  Tensor weight, bias;  // bias undefined when bias = false
};

// y = x / rms(x) · weight over the last dimension; weight starts at ones.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;

  int64_t dim;
  double eps;
  Tensor weight;
};

// y = w · x · σ(x) with one learnable scalar w (shape [1]), starting at 1: SiLU with a learned gain.
class ScaledSiLU : public Module {
 public:
  ScaledSiLU();
  Tensor forward(const Tensor& x) override;
  std::string repr() const override { return "ScaledSiLU()"; }

  Tensor w;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string repr() const override { return "ReLU()"; }
};

// y[..., :] = weight[ids[...], :]: a row of the table per id (ids int64, any shape; y is
// ids.shape + [dim]). weight [num_embeddings, dim] ~ N(0, 1), as PyTorch's nn.Embedding.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim);
  Tensor forward(const Tensor& ids) override;
  std::string repr() const override;

  int64_t num_embeddings, dim;
  Tensor weight;
};

// y = (x − mean(x)) / sqrt(var(x) + eps) · weight + bias over the last dimension; weight starts at
// ones and bias at zeros (bias = false: no bias, as GPT configs with `bias: false` have).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool bias = true);
  Tensor forward(const Tensor& x) override;
  // {x + r, forward(x + r)} in one pass (add_layer_norm, ops/layer_norm/layer_norm.h).
  std::pair<Tensor, Tensor> forward_add(const Tensor& x, const Tensor& r);
  std::string repr() const override;

  int64_t dim;
  double eps;
  Tensor weight, bias;  // bias undefined when bias = false

 private:
  Tensor zero_bias_;  // bias = false: the zeros the op adds instead, kept while dtype and device stay
  const Tensor& bias_or_zeros();
};

// y = x · Φ(x), by default with GPT-2's tanh approximation (ops/gelu/gelu.h).
class GELU : public Module {
 public:
  explicit GELU(bool exact = false) : exact(exact) {}
  Tensor forward(const Tensor& x) override;
  std::string repr() const override { return exact ? "GELU(exact)" : "GELU(tanh)"; }

  bool exact;
};

// Zeroes each element with probability p and scales the rest by 1/(1 − p), in training mode only
// (ops/dropout/dropout.h). The mask is a pure function of (seed, offset, position): whoever runs
// the model sets `seed` and, before each forward, `offset` (a number no other call of the run
// uses), so a resumed run draws the same masks. nn::GPT does that for its dropouts. `base`, when
// defined, is the device word added to `offset` when the kernels run (dropout.h: how a CUDA graph
// replay draws a new mask each step).
class Dropout : public Module {
 public:
  explicit Dropout(double p);
  Tensor forward(const Tensor& x) override;
  std::string repr() const override;

  double p;
  uint64_t seed = 0, offset = 0;
  Tensor base;
};

// A handle to any module, so that containers can take a brace list of different layer types.
// Built from a module value (moved into a new shared_ptr) or from a shared_ptr (shared).
class AnyModule {
 public:
  template <std::derived_from<Module> M>
  AnyModule(M&& module) : ptr_(std::make_shared<M>(std::move(module))) {}  // NOLINT: implicit
  template <std::derived_from<Module> M>
  AnyModule(std::shared_ptr<M> module) : ptr_(std::move(module)) {}  // NOLINT: implicit
  const std::shared_ptr<Module>& ptr() const { return ptr_; }

 private:
  std::shared_ptr<Module> ptr_;
};

// Runs its children in order; they are named "0", "1", ... (so "0.weight" in a state dict).
// An RMSNorm directly followed by a ScaledSiLU (exactly those classes, not subclasses) runs as one
// rms_norm_scaled_silu (ops/rms_norm/rms_norm_scaled_silu.h): one kernel each way instead of two,
// the same parameters and state dict, h kept in fp32 between the two. `fuse = false`, or a
// forward hook on the thread (which must see each layer's output), runs them one by one.
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<AnyModule> modules);
  void push_back(const AnyModule& module);
  Tensor forward(const Tensor& x) override;
  std::string repr() const override { return "Sequential"; }

  size_t size() const { return named_children().size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // One step of forward: child i on x, or children i and i + 1 fused; *next = the first child
  // not yet run. (For code that times or inspects the layers one step at a time.)
  Tensor forward_step(size_t i, const Tensor& x, size_t* next);

  bool fuse = true;
};

// widths {in, h1, ..., hk, out}: per hidden layer Linear → [RMSNorm] → activation, then a final
// Linear, held in a Sequential child "layers" ("layers.0.weight", ...).
//   norm: "rms_norm" or "none";  activation: "scaled_silu" or "relu".
class MLP : public Module {
 public:
  explicit MLP(const std::vector<int64_t>& widths, const std::string& norm = "rms_norm",
               const std::string& activation = "scaled_silu", bool bias = true);
  Tensor forward(const Tensor& x) override { return (*layers)(x); }
  std::string repr() const override { return "MLP"; }

  std::shared_ptr<Sequential> layers;
};

}  // namespace mt::nn
