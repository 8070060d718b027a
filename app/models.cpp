#include "app/models.h"

#include "core/error.h"
#include "nn/modules.h"

namespace mt::app {

std::shared_ptr<nn::Module> build_model(const ModelConfig& m) {
  MT_CHECK(m.kind == "mlp", "model.kind: unknown model '", m.kind, "'");
  std::vector<int64_t> widths{m.input};
  widths.insert(widths.end(), m.hidden.begin(), m.hidden.end());
  widths.push_back(m.classes);
  return std::make_shared<nn::MLP>(widths, m.norm, m.activation, m.bias);
}

}  // namespace mt::app
