#include "train/models.h"

#include "nn/modules.h"

namespace mt::train {

std::shared_ptr<nn::Module> build_model(const ModelConfig& m) {
  std::vector<int64_t> widths{m.input};
  widths.insert(widths.end(), m.hidden.begin(), m.hidden.end());
  widths.push_back(m.classes);
  return std::make_shared<nn::MLP>(widths, m.norm, m.activation, m.bias);
}

}  // namespace mt::train
