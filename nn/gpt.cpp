// The GPT model: GPT-2's architecture in nanoGPT's shape and names. nn/gpt.h says what each part
// computes; this file is the whole model.
#include "nn/gpt.h"

#include <cmath>
#include <sstream>
#include <tuple>

#include "core/autograd.h"
#include "nn/init.h"
#include "ops/attention/attention.h"
#include "ops/elementwise/elementwise.h"
#include "ops/gelu_mlp/gelu_mlp.h"
#include "ops/linear/linear.h"

namespace mt::nn {

namespace {

void check_config(const GPTConfig& c) {
  MT_CHECK(c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 && c.block_size > 0 && c.vocab_size > 0,
           "GPT: n_layer, n_head, n_embd, block_size and vocab_size must be positive, got ",
           c.n_layer, ", ", c.n_head, ", ", c.n_embd, ", ", c.block_size, ", ", c.vocab_size);
  MT_CHECK(c.n_embd % c.n_head == 0, "GPT: n_embd ", c.n_embd, " is not divisible by n_head ",
           c.n_head);
  MT_CHECK(c.padded_vocab() >= c.vocab_size, "GPT: padded_vocab_size ", c.padded_vocab_size,
           " is smaller than vocab_size ", c.vocab_size);
  MT_CHECK(c.dropout >= 0 && c.dropout < 1, "GPT: dropout must be in [0, 1), got ", c.dropout);
}

}  // namespace

// ---- attention ------------------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(const GPTConfig& c) : n_head(c.n_head) {
  c_attn = register_module("c_attn", Linear(c.n_embd, 3 * c.n_embd, c.bias));
  c_proj = register_module("c_proj", Linear(c.n_embd, c.n_embd, c.bias));
  attn_dropout = register_module("attn_dropout", Dropout(c.dropout));
  resid_dropout = register_module("resid_dropout", Dropout(c.dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  // [B, T, 3C] → each head's attention → [B, T, C], the heads read and written in place (no
  // split or merge copies); probabilities dropped in training (none in evaluation or at p = 0).
  const Dropout& a = *attn_dropout;
  Tensor y = attention_packed((*c_attn)(x), n_head,
                              {.p = a.p, .seed = a.seed, .offset = a.offset, .base = a.base,
                               .training = a.is_training()});
  return (*resid_dropout)((*c_proj)(y));
}

// ---- MLP and Block --------------------------------------------------------------------------

GPTMLP::GPTMLP(const GPTConfig& c) {
  c_fc = register_module("c_fc", Linear(c.n_embd, 4 * c.n_embd, c.bias));
  gelu = register_module("gelu", GELU());
  c_proj = register_module("c_proj", Linear(4 * c.n_embd, c.n_embd, c.bias));
  dropout = register_module("dropout", Dropout(c.dropout));
}

Tensor GPTMLP::forward(const Tensor& x) {
  if (forward_hook_active() || gelu->exact)  // module by module (the epilogue's GELU is tanh's)
    return (*dropout)((*c_proj)((*gelu)((*c_fc)(x))));
  // One node, GELU in the GEMMs' epilogues (ops/gelu_mlp): the same math, a rounding apart.
  const auto copy = [](const Tensor& p) { return p.defined() ? p.compute_copy() : Tensor(); };
  return (*dropout)(gelu_mlp(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias,
                             copy(c_fc->weight), copy(c_fc->bias), copy(c_proj->weight),
                             copy(c_proj->bias)));
}

Block::Block(const GPTConfig& c) {
  ln_1 = register_module("ln_1", LayerNorm(c.n_embd, 1e-5, c.bias));
  attn = register_module("attn", CausalSelfAttention(c));
  ln_2 = register_module("ln_2", LayerNorm(c.n_embd, 1e-5, c.bias));
  mlp = register_module("mlp", GPTMLP(c));
}

Tensor Block::forward(const Tensor& x) {
  if (forward_hook_active()) {  // each module by its own call, so the hook sees every output
    Tensor h = add(x, (*attn)((*ln_1)(x)));
    return add(h, (*mlp)((*ln_2)(h)));
  }
  auto [h, a] = ln_2->forward_add(x, (*attn)((*ln_1)(x)));
  return add(h, (*mlp)(a));
}

std::pair<Tensor, Tensor> Block::forward_fused(const Tensor& x, const Tensor& x_normed,
                                               LayerNorm& next) {
  auto [h, a] = ln_2->forward_add(x, (*attn)(x_normed));
  return next.forward_add(h, (*mlp)(a));
}

// ---- the trunk and the model ----------------------------------------------------------------

GPTTrunk::GPTTrunk(const GPTConfig& c) {
  wte = register_module("wte", Embedding(c.padded_vocab(), c.n_embd));
  wpe = register_module("wpe", Embedding(c.block_size, c.n_embd));
  drop = register_module("drop", Dropout(c.dropout));
  h = register_module("h", Sequential());
  for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(Block(c));
  ln_f = register_module("ln_f", LayerNorm(c.n_embd, 1e-5, c.bias));
}

Tensor GPTTrunk::forward(const Tensor& ids) {
  const int64_t B = ids.size(0), T = ids.size(1);
  Tensor& positions = positions_[shape_str(ids.shape()) + " " + ids.device().str()];
  if (!positions.defined()) {
    std::vector<int64_t> pos(size_t(B * T));
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = int64_t(i) % T;
    positions = from_vector(pos, {B, T}, DType::i64, ids.device());
  }
  // The embeddings are fp32 tables; the residual stream is in the compute dtype (a
  // differentiable cast, so the gradient flows back to the tables in fp32).
  const DType compute = wte->weight.compute_copy().defined() ? wte->weight.compute_copy().dtype()
                                                             : wte->weight.dtype();
  Tensor x = (*drop)(add((*wte)(ids), (*wpe)(positions)).to(compute));
  if (forward_hook_active()) return (*ln_f)((*h)(x));  // the hook sees every block's output
  // The residual stream with every add fused into the LayerNorm after it: block i hands
  // {x, ln(x)} to block i + 1, whose ln_1 that is (ln_f after the last).
  auto block = [&](size_t i) {
    auto b = std::dynamic_pointer_cast<Block>((*h)[i]);
    MT_CHECK(b != nullptr, "GPT: h.", i, " is not a Block");
    return b;
  };
  Tensor normed = (*block(0)->ln_1)(x);
  for (size_t i = 0; i < h->size(); ++i) {
    LayerNorm& next = i + 1 < h->size() ? *block(i + 1)->ln_1 : *ln_f;
    std::tie(x, normed) = block(i)->forward_fused(x, normed, next);
  }
  return normed;
}

GPT::GPT(const GPTConfig& c) : config(c) {
  check_config(c);
  transformer = register_module("transformer", GPTTrunk(c));
  // GPT-2's initialization (nn/gpt.h), drawn in parameter order from the default generator.
  const double residual_std = 0.02 / std::sqrt(2.0 * double(c.n_layer));
  NoGradGuard no_grad;
  for (const auto& [name, p] : named_parameters()) {
    const bool projection = name.ends_with("c_proj.weight");
    if (name.ends_with("ln_1.weight") || name.ends_with("ln_2.weight") || name.ends_with("ln_f.weight")) {
      continue;  // LayerNorm: ones, zeros
    } else if (name.ends_with(".bias")) {
      p.fill_(0.0);
    } else {
      init::normal_(p, 0.0, projection ? residual_std : 0.02);
    }
  }
  transformer->wte->weight.slice_rows(c.vocab_size, c.padded_vocab()).fill_(0.0);
}

Tensor GPT::forward(const Tensor& ids) {
  MT_CHECK(ids.dim() == 2 && ids.dtype() == DType::i64, "GPT: ids must be [B, T] int64, got ",
           shape_str(ids.shape()), " ", dtype_name(ids.dtype()));
  MT_CHECK(ids.size(1) >= 1 && ids.size(1) <= config.block_size, "GPT: a sequence of ",
           ids.size(1), " tokens, but the model's block_size is ", config.block_size);
  const Tensor& w = transformer->wte->weight;
  return linear((*transformer)(ids), w, Tensor(), w.compute_copy());  // the head, tied to wte
}

namespace {
std::vector<Dropout*> dropouts_of(const Module& model) {
  std::vector<Dropout*> dropouts;
  for (const auto& [name, m] : model.named_modules())
    if (auto* d = dynamic_cast<Dropout*>(m.get())) dropouts.push_back(d);
  return dropouts;
}
}  // namespace

void GPT::set_dropout_key(uint64_t seed, uint64_t call, const Tensor& base) {
  const std::vector<Dropout*> dropouts = dropouts_of(*this);
  for (size_t i = 0; i < dropouts.size(); ++i) {
    dropouts[i]->seed = seed;
    dropouts[i]->offset = call * dropouts.size() + i;
    dropouts[i]->base = base;
  }
}

size_t GPT::num_dropouts() const { return dropouts_of(*this).size(); }

void GPT::set_compute_dtype(DType dtype) {
  Module::set_compute_dtype(dtype);  // the Linears' copies
  NoGradGuard no_grad;              // and the head's: wte's weight in the compute dtype
  Tensor& w = transformer->wte->weight;
  w.set_compute_copy(dtype == DType::f32 ? Tensor() : w.to(dtype));
}

int64_t GPT::num_parameters(bool non_embedding) const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return non_embedding ? n - transformer->wpe->weight.numel() : n;
}

std::string GPT::repr() const {
  std::ostringstream os;
  os << "GPT(n_layer=" << config.n_layer << ", n_head=" << config.n_head << ", n_embd="
     << config.n_embd << ", block_size=" << config.block_size << ", vocab_size="
     << config.vocab_size << ", padded_vocab_size=" << config.padded_vocab() << ")";
  return os.str();
}

}  // namespace mt::nn
