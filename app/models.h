#pragma once
// The models the `train` program builds from a config's `model` section. The trainer itself
// takes any nn::Module; this is where the YAML's model turns into one.
#include <memory>

#include "nn/gpt.h"
#include "nn/module.h"
#include "app/config.h"

namespace mt::app {

// model.kind mlp: an MLP of widths {input, hidden..., classes}: per hidden layer Linear →
// [RMSNorm] → activation, then a final Linear (nn::MLP). model.kind gpt: nn::GPT of gpt_config(m).
// fp32 on the CPU, initialized from the default generator.
std::shared_ptr<nn::Module> build_model(const ModelConfig& m);

// The GPT's shape from model.n_layer, n_head, n_embd, block_size, vocab_size, padded_vocab_size,
// dropout and bias.
nn::GPTConfig gpt_config(const ModelConfig& m);

}  // namespace mt::app
