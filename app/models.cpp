#include "app/models.h"

#include "core/error.h"
#include "nn/gpt.h"
#include "nn/modules.h"

namespace mt::app {

nn::GPTConfig gpt_config(const ModelConfig& m) {
  return {.n_layer = m.n_layer, .n_head = m.n_head, .n_embd = m.n_embd, .block_size = m.block_size,
          .vocab_size = m.vocab_size, .padded_vocab_size = m.padded_vocab_size,
          .dropout = m.dropout, .bias = m.bias};
}

std::shared_ptr<nn::Module> build_model(const ModelConfig& m) {
  if (m.kind == "gpt") return std::make_shared<nn::GPT>(gpt_config(m));
  MT_CHECK(m.kind == "mlp", "model.kind: unknown model '", m.kind, "'");
  std::vector<int64_t> widths{m.input};
  widths.insert(widths.end(), m.hidden.begin(), m.hidden.end());
  widths.push_back(m.classes);
  return std::make_shared<nn::MLP>(widths, m.norm, m.activation, m.bias);
}

}  // namespace mt::app
