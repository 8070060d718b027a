#include "nn/modules.h"

#include <cmath>
#include <sstream>
#include <typeinfo>

#include "core/autograd.h"
#include "nn/init.h"
#include "ops/dropout/dropout.h"
#include "ops/elementwise/elementwise.h"
#include "ops/embedding/embedding.h"
#include "ops/gelu/gelu.h"
#include "ops/layer_norm/layer_norm.h"
#include "ops/linear/linear.h"
#include "ops/rms_norm/rms_norm.h"
#include "ops/rms_norm/rms_norm_scaled_silu.h"
#include "ops/scaled_silu/scaled_silu.h"

namespace mt::nn {

// ---- Linear -------------------------------------------------------------------------------

Linear::Linear(int64_t in, int64_t out, bool with_bias) : in_features(in), out_features(out) {
  MT_CHECK(in > 0 && out > 0, "Linear(", in, ", ", out, "): both sizes must be positive");
  weight = register_parameter("weight", empty({out, in}));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (with_bias) {
    bias = register_parameter("bias", empty({out}));
    const double bound = 1.0 / std::sqrt(double(in));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& x) {
  return linear(x, weight, bias, weight.compute_copy(),
                bias.defined() ? bias.compute_copy() : Tensor());
}

std::string Linear::repr() const {
  return "Linear(in_features=" + std::to_string(in_features) + ", out_features=" +
         std::to_string(out_features) + ", bias=" + (bias.defined() ? "true" : "false") + ")";
}

void Linear::set_compute_dtype(DType dtype) {
  Module::set_compute_dtype(dtype);  // checks the dtype
  NoGradGuard no_grad;               // the copies are detached: gradients go to the fp32 ones
  weight.set_compute_copy(dtype == DType::f32 ? Tensor() : weight.to(dtype));
  // The bias rounded once per update instead of on every forward (the GEMM epilogue adds it in
  // the compute dtype either way).
  if (bias.defined()) bias.set_compute_copy(dtype == DType::f32 ? Tensor() : bias.to(dtype));
}

// ---- RMSNorm, ScaledSiLU, ReLU ------------------------------------------------------------

RMSNorm::RMSNorm(int64_t d, double e) : dim(d), eps(e) {
  MT_CHECK(d > 0 && e >= 0, "RMSNorm(", d, ", eps=", e, "): dim must be positive and eps >= 0");
  weight = register_parameter("weight", ones({d}));
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, weight, eps); }

std::string RMSNorm::repr() const {
  std::ostringstream os;
  os << "RMSNorm(" << dim << ", eps=" << eps << ")";
  return os.str();
}

ScaledSiLU::ScaledSiLU() { w = register_parameter("w", ones({1})); }

Tensor ScaledSiLU::forward(const Tensor& x) { return scaled_silu(x, w); }

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

// ---- Embedding, LayerNorm, GELU, Dropout -------------------------------------------------

Embedding::Embedding(int64_t n, int64_t d) : num_embeddings(n), dim(d) {
  MT_CHECK(n > 0 && d > 0, "Embedding(", n, ", ", d, "): both sizes must be positive");
  weight = register_parameter("weight", empty({n, d}));
  init::normal_(weight, 0.0, 1.0);
}

Tensor Embedding::forward(const Tensor& ids) { return embedding(ids, weight); }

std::string Embedding::repr() const {
  return "Embedding(" + std::to_string(num_embeddings) + ", " + std::to_string(dim) + ")";
}

LayerNorm::LayerNorm(int64_t d, double e, bool with_bias) : dim(d), eps(e) {
  MT_CHECK(d > 0 && e >= 0, "LayerNorm(", d, ", eps=", e, "): dim must be positive and eps >= 0");
  weight = register_parameter("weight", ones({d}));
  if (with_bias) bias = register_parameter("bias", zeros({d}));
}

const Tensor& LayerNorm::bias_or_zeros() {
  if (bias.defined()) return bias;
  // Without a bias the op still adds one: zeros that are no parameter (no gradient is kept).
  if (!zero_bias_.defined() || zero_bias_.device() != weight.device() || zero_bias_.dtype() != weight.dtype())
    zero_bias_ = zeros({dim}, weight.dtype(), weight.device());
  return zero_bias_;
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, weight, bias_or_zeros(), eps); }

std::pair<Tensor, Tensor> LayerNorm::forward_add(const Tensor& x, const Tensor& r) {
  std::vector<Tensor> out = add_layer_norm(x, r, weight, bias_or_zeros(), eps);
  return {out[0], out[1]};
}

std::string LayerNorm::repr() const {
  std::ostringstream os;
  os << "LayerNorm(" << dim << ", eps=" << eps << ", bias=" << (bias.defined() ? "true" : "false")
     << ")";
  return os.str();
}

Tensor GELU::forward(const Tensor& x) { return gelu(x, exact ? GeluApprox::Erf : GeluApprox::Tanh); }

Dropout::Dropout(double prob) : p(prob) {
  MT_CHECK(p >= 0 && p < 1, "Dropout(", p, "): p must be in [0, 1)");
}

Tensor Dropout::forward(const Tensor& x) {
  return dropout(x, p, seed, offset, is_training(), base);
}

std::string Dropout::repr() const {
  std::ostringstream os;
  os << "Dropout(p=" << p << ")";
  return os.str();
}

// ---- Sequential ---------------------------------------------------------------------------

Sequential::Sequential(std::initializer_list<AnyModule> modules) {
  for (const AnyModule& m : modules) push_back(m);
}

void Sequential::push_back(const AnyModule& module) {
  register_module(std::to_string(size()), module.ptr());
}

namespace {

// m as an M when it is exactly an M: a subclass may override forward, and must not be fused.
template <class M>
const M* exactly(const std::shared_ptr<Module>& m) {
  const Module& ref = *m;
  return typeid(ref) == typeid(M) ? static_cast<const M*>(m.get()) : nullptr;
}

}  // namespace

Tensor Sequential::forward(const Tensor& x) {
  MT_CHECK(size() > 0, "Sequential: forward through an empty Sequential");
  Tensor y = x;
  for (size_t i = 0; i < size();) y = forward_step(i, y, &i);
  return y;
}

Tensor Sequential::forward_step(size_t i, const Tensor& x, size_t* next) {
  const auto& children = named_children();
  MT_CHECK(i < children.size(), "Sequential: index ", i, " out of range for ", children.size(),
           " modules");
  if (fuse && !forward_hook_active() && i + 1 < children.size()) {
    const RMSNorm* norm = exactly<RMSNorm>(children[i].second);
    const ScaledSiLU* act = exactly<ScaledSiLU>(children[i + 1].second);
    if (norm != nullptr && act != nullptr) {
      *next = i + 2;
      return rms_norm_scaled_silu(x, norm->weight, act->w, norm->eps);
    }
  }
  *next = i + 1;
  return (*children[i].second)(x);  // through operator(), so a forward hook sees each layer
}

const std::shared_ptr<Module>& Sequential::operator[](size_t i) const {
  MT_CHECK(i < size(), "Sequential: index ", i, " out of range for ", size(), " modules");
  return named_children()[i].second;
}

// ---- MLP ----------------------------------------------------------------------------------

MLP::MLP(const std::vector<int64_t>& widths, const std::string& norm, const std::string& activation,
         bool bias) {
  MT_CHECK(widths.size() >= 2, "MLP: widths needs at least {in, out}, got ", widths.size(), " values");
  MT_CHECK(norm == "rms_norm" || norm == "none", "MLP: norm must be 'rms_norm' or 'none', got '",
           norm, "'");
  MT_CHECK(activation == "scaled_silu" || activation == "relu",
           "MLP: activation must be 'scaled_silu' or 'relu', got '", activation, "'");
  layers = register_module("layers", Sequential());
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    layers->push_back(Linear(widths[i], widths[i + 1], bias));
    if (i + 2 == widths.size()) break;  // the output layer has no norm or activation
    if (norm == "rms_norm") layers->push_back(RMSNorm(widths[i + 1]));
    if (activation == "scaled_silu") layers->push_back(ScaledSiLU());
    else layers->push_back(ReLU());
  }
}

}  // namespace mt::nn
