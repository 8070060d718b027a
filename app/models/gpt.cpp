// model.kind: gpt (nn/gpt.h), trained on token data (data.kind text or tokens, app/datasets/
// tokens.cpp) with the language-modelling task (train/lm_task.h). model.bias is the schema's.
#include <algorithm>

#include "app/memory.h"
#include "app/registry.h"
#include "data/token_source.h"
#include "nn/gpt.h"
#include "train/lm_task.h"

namespace mt::app {

nn::GPTConfig gpt_config(const Config& c) {
  const Params& p = c.model.params;
  return {.n_layer = p.integer("n_layer"), .n_head = p.integer("n_head"),
          .n_embd = p.integer("n_embd"), .block_size = p.integer("block_size"),
          .vocab_size = p.integer("vocab_size"), .padded_vocab_size = p.integer("padded_vocab_size"),
          .dropout = p.number("dropout"), .bias = c.model.bias};
}

// A lower bound of one rank's memory: what a GPT run certainly holds, so that one that cannot fit
// is refused before its first allocation instead of being killed by the system. The state: every
// weight's fp32 value and gradient, the optimizer's moments (this rank's share under
// optim.shard_state) and the compute-dtype copies of the matrices but wpe (only the matrices
// counted). The activations: the larger of a training microbatch (its logits over the padded
// vocabulary and, per block and token, ten C-wide rows its backward reads at least: the block's
// input, ln_1's output, q, k, v, the attention's output, the MLP's 4C hidden) and an evaluation
// batch's logits.
MemoryEstimate estimate_gpt_memory(const Config& c, int world) {
  const nn::GPTConfig g = gpt_config(c);
  const double C = double(g.n_embd), L = double(g.n_layer), V = double(g.padded_vocab());
  const double weights = V * C + double(g.block_size) * C + 12 * L * C * C;
  const double copied = weights - double(g.block_size) * C;  // wpe is added in fp32
  // text and tokens, the kinds a GPT trains on, both have these keys.
  const bool windows = c.data.kind == "text" || c.data.kind == "tokens";
  const int64_t data_T = windows ? c.data.params.integer("block_size") : 0;
  const double T = double(data_T > 0 ? data_T : g.block_size);
  const double tokens = double(largest_microbatch(c, world)) * T;
  const int64_t eval_windows = windows ? c.data.params.integer("eval_windows") : 0;
  const int64_t eval_batch =
      eval_windows > 0 ? std::min(c.eval.batch_size, eval_windows) : c.eval.batch_size;
  const double eval_tokens = c.data.val_fraction > 0 ? double(eval_batch) * T : 0;
  MemoryEstimate e;
  e.state = state_bytes(c, weights, copied, world);
  e.activations = std::max(tokens * (V + 10 * L * C), eval_tokens * V) *
                  double(dtype_size(c.precision.compute_dtype));
  return e;
}

namespace {

std::string at_least_1(const Params& p, const std::string& key) {
  return p.integer(key) >= 1 && p.integer(key) <= (int64_t(1) << 24) ? "" : "must be in [1, 2^24]";
}

ParamKey size_key(const std::string& name, const std::string& value, const std::string& meaning) {
  return {.name = name, .type = ParamType::integer, .default_value = value, .meaning = meaning,
          .constraints = "1 … 2^24", .check = [name](const Params& p) { return at_least_1(p, name); }};
}

const RegisterModel gpt({
    .name = "gpt",
    .meaning = "GPT-2's architecture (nn::GPT, docs/gpt.md), trained on data.kind text or tokens",
    .keys = {size_key("n_layer", "4", "blocks"), size_key("n_head", "4", "attention heads"),
             {.name = "n_embd", .type = ParamType::integer, .default_value = "128",
              .meaning = "width", .constraints = "1 … 2^24, divisible by n_head",
              .check = [](const Params& p) {
                if (!at_least_1(p, "n_embd").empty()) return at_least_1(p, "n_embd");
                return p.integer("n_embd") % p.integer("n_head") == 0
                           ? std::string()
                           : "must be divisible by model.n_head = " + std::to_string(p.integer("n_head"));
              }},
             size_key("block_size", "64",
                      "the longest context (rows of the position table; the CUDA attention "
                      "takes at most 65535 · 64 = 4,194,240)"),
             size_key("vocab_size", "256", "token ids the model knows; must cover the tokenizer's"),
             {.name = "padded_vocab_size", .type = ParamType::integer, .default_value = "0",
              .meaning = "rows of the token table; 0 rounds vocab_size up to a multiple of 64",
              .constraints = "0 or vocab_size … 2^24",
              .check = [](const Params& p) {
                const int64_t v = p.integer("padded_vocab_size");
                return v == 0 || (v >= p.integer("vocab_size") && v <= (int64_t(1) << 24))
                           ? std::string() : "must be 0 or in [model.vocab_size, 2^24]";
              }},
             {.name = "dropout", .type = ParamType::number, .default_value = "0.0",
              .meaning = "dropout after the embeddings, on each residual branch and on the "
                         "attention probabilities (nanoGPT's three places), in training",
              .constraints = "[0, 1)",
              .check = [](const Params& p) {
                return p.number("dropout") >= 0 && p.number("dropout") < 1 ? "" : "must be in [0, 1)";
              }}},
    .build = [](const Config& c) -> std::shared_ptr<nn::Module> {
      return std::make_shared<nn::GPT>(gpt_config(c));
    },
    .check_memory = [](const Config& c, Device device, int world) {
      check_estimate(estimate_gpt_memory(c, world), c.optim.name, device, world,
                     "make model.n_layer, model.n_embd, data.block_size (model.block_size when it "
                     "is 0), optim.batch_size or eval.batch_size smaller, or optim.microbatches "
                     "larger");
    },
    .task = [](const Config& c, data::Source& source) -> std::shared_ptr<train::Task> {
      auto* tokens = dynamic_cast<data::TokenSource*>(&source);
      if (tokens == nullptr)
        throw ConfigError("model.kind: gpt trains on token data (data.kind text or tokens), not "
                          "data.kind " + c.data.kind);
      return train::language_modeling(c.model.params.integer("vocab_size"), tokens->tokens_per_byte(),
                                      {c.seed, [tokens] { return tokens->last_step(); },
                                       [tokens] { return tokens->first_microbatch(); },
                                       [tokens] { return tokens->microbatches(); }});
    },
});

}  // namespace
}  // namespace mt::app
