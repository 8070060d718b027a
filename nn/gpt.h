#pragma once
// GPT-2, as nanoGPT writes it (nn/gpt.cpp is the model, in one file): learned token and position
// embeddings, n_layer pre-LayerNorm blocks, a final LayerNorm, and an output head tied to the
// token embedding.
//
//   x = drop(wte[ids] + wpe[0..T))                      [B, T, C]
//   for each block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
//     attn: drop(c_proj(attention(q, k, v)))  with dropout on the attention probabilities too
//     mlp:  drop(c_proj(gelu(c_fc(x))))
//   logits = ln_f(x) · wteᵀ                              [B, T, padded_vocab_size]
//
//   nn::GPT model({.n_layer = 6, .n_head = 6, .n_embd = 384, .block_size = 256, .vocab_size = 65});
//   Tensor logits = model(ids);  // ids [B, T] int64, T <= block_size
//
// Parameter names are nanoGPT's state-dict keys (transformer.wte.weight,
// transformer.h.0.attn.c_attn.weight, ..., transformer.ln_f.bias), so a checkpoint maps onto
// nanoGPT's and GPT-2's tensors one to one (docs/gpt.md has the table). The head has no parameter
// of its own: it reads transformer.wte.weight, which is therefore saved once (nanoGPT's
// state_dict lists it a second time as lm_head.weight). Its gradient is the sum of the
// embedding's and the head's (the tied weight's two uses add into one .grad).
//
// The vocabulary is padded to padded_vocab_size rows (a multiple of 64 by default: 50257 →
// 50304), which GEMMs like; the padded rows start at zero, the loss leaves their logits out
// (train/lm_task.h), so no gradient ever reaches them and weight decay keeps them at zero.
//
// Initialization is GPT-2's: Linear and Embedding weights ~ N(0, 0.02), biases 0, LayerNorm 1 and
// 0, and the two projections that end a residual branch (attn.c_proj, mlp.c_proj) ~ N(0,
// 0.02/√(2·n_layer)), so the residual stream's variance does not grow with depth.
#include <cstdint>
#include <map>
#include <utility>
#include <memory>
#include <string>

#include "nn/modules.h"

namespace mt::nn {

struct GPTConfig {
  int64_t n_layer = 12, n_head = 12, n_embd = 768;
  int64_t block_size = 1024;         // the longest sequence (rows of wpe)
  int64_t vocab_size = 50257;        // token ids in [0, vocab_size)
  int64_t padded_vocab_size = 0;     // rows of wte; 0: vocab_size rounded up to a multiple of 64
  double dropout = 0.0;              // after the embeddings, each residual branch (the attention's
                                     // and the MLP's), and on the attention probabilities
  bool bias = true;                  // biases in the Linears and LayerNorms
  int64_t padded_vocab() const {
    return padded_vocab_size > 0 ? padded_vocab_size : (vocab_size + 63) / 64 * 64;
  }
};

// Causal multi-head self-attention: one Linear to q, k, v ([B, T, 3C] split three ways, each cut
// into n_head heads of C / n_head), attention over the past, one Linear back to C. In training,
// dropout on the attention probabilities too (nanoGPT's attn_dropout): the fused attention op
// applies it to P inside (ops/attention/attention.h), with attn_dropout's p and key, so that
// Dropout module is never called on a tensor; it is there to be keyed with the model's others.
class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;  // [B, T, C] → [B, T, C]
  std::string repr() const override { return "CausalSelfAttention"; }

  int64_t n_head;
  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> attn_dropout, resid_dropout;
};

// The feed-forward half of a block (nanoGPT's MLP): Linear(C, 4C) → GELU (tanh) → Linear(4C, C).
// It runs as one gelu_mlp node (ops/gelu_mlp: GELU in the GEMMs' epilogues on CUDA), or module by
// module while a forward hook is set or for the exact GELU.
class GPTMLP : public Module {
 public:
  explicit GPTMLP(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;
  std::string repr() const override { return "MLP"; }

  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<GELU> gelu;
  std::shared_ptr<Dropout> dropout;
};

// h = x + attn(ln_1(x)), then h + mlp(ln_2(h)).
class Block : public Module {
 public:
  explicit Block(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;
  // The block on the residual stream, each residual add fused into the LayerNorm after it
  // (add_layer_norm): given x and ln_1(x), returns {x', next(x')}, x' = forward(x), where next is
  // the following block's ln_1 or the trunk's ln_f. The same numbers as forward then next.
  std::pair<Tensor, Tensor> forward_fused(const Tensor& x, const Tensor& x_normed, LayerNorm& next);
  std::string repr() const override { return "Block"; }

  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<GPTMLP> mlp;
};

// nanoGPT's `transformer` dictionary: wte, wpe, drop, h (the blocks "h.0", "h.1", ...), ln_f.
// forward(ids [B, T]) is the final LayerNorm's output [B, T, C].
class GPTTrunk : public Module {
 public:
  explicit GPTTrunk(const GPTConfig& c);
  Tensor forward(const Tensor& ids) override;
  std::string repr() const override { return "Transformer"; }

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Sequential> h;
  std::shared_ptr<LayerNorm> ln_f;

 private:
  // [B, T] int64 ids 0..T-1 per row, one per shape and device seen, kept for the model's life: a
  // CUDA graph captured with one of them reads it on every replay, so an evaluation of another
  // shape between replays must not free it (it did, and the replay read reused memory).
  std::map<std::string, Tensor> positions_;
};

class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& c);
  // ids [B, T] int64 in [0, vocab_size), 1 <= T <= block_size → logits [B, T, padded_vocab].
  // An id past padded_vocab is an error (the embedding checks ids against its table's rows); one
  // in [vocab_size, padded_vocab) is not, as in llm.c: it reads a padding row, zero at
  // initialization, and its gradient trains that row. The trainer's data and `train sample`
  // refuse such ids before they get here.
  Tensor forward(const Tensor& ids) override;
  std::string repr() const override;
  // The Linears' compute copies (Module's), and one of wte's weight for the tied head.
  void set_compute_dtype(DType dtype) override;

  // Keys every dropout of the model for the next forward: the masks are a pure function of
  // (seed, call), so give each microbatch of a run its own call number (the LM task uses
  // step · microbatches + microbatch) and a resumed run draws the masks it would have drawn.
  // Dropout i of n draws from offset call · n + i, plus base[0] on the device when `base` is
  // defined (an i64 [1] tensor on the model's device, ops/dropout/dropout.h): the step's part of
  // the key, which a CUDA graph replay reads from device memory. The attention probabilities'
  // dropouts (each block's attn.attn_dropout) are among the n: every dropout of a forward has an
  // offset of its own.
  void set_dropout_key(uint64_t seed, uint64_t call, const Tensor& base = Tensor());
  // The model's Dropout modules: n above (1 + 3 · n_layer).
  size_t num_dropouts() const;

  // Parameters, leaving out the position embedding when `non_embedding` (GPT-2's count).
  int64_t num_parameters(bool non_embedding = false) const;

  GPTConfig config;
  std::shared_ptr<GPTTrunk> transformer;
};

}  // namespace mt::nn
