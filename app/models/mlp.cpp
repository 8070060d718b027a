// model.kind: mlp, the model the `train` program builds by default. Its keys are the schema's
// own (model.input, hidden, classes, norm, activation, bias; app/config.h), which the synthetic
// data also reads for its shape.
#include "app/memory.h"
#include "app/registry.h"
#include "nn/modules.h"

namespace mt::app {
namespace {

// The data must fit the model: its feature count and its labels.
void check_fits(const Config& c, const data::Dataset& set) {
  const ModelConfig& m = c.model;
  if (set.size == 0) return;
  const std::string which = set.file.empty() ? set.name : set.name + " file " + set.file;
  if (set.dim != m.input)
    throw ConfigError(detail::concat("model.input: is ", m.input, " but the ", which,
                                     " has ", set.dim, " features per sample"));
  for (size_t i = 0; i < set.labels.size(); ++i)
    if (set.labels[i] < 0 || set.labels[i] >= m.classes)
      throw ConfigError(detail::concat("model.classes: is ", m.classes, " but the ", which,
                                       " has label ", set.labels[i], " (sample ", i, ")"));
}

const RegisterModel mlp({
    .name = "mlp",
    .meaning = "an MLP of widths {input, hidden..., classes}: per hidden layer Linear, "
               "[RMSNorm], activation; then a final Linear (nn::MLP)",
    .keys = {},
    .build =
        [](const Config& c) -> std::shared_ptr<nn::Module> {
          const ModelConfig& m = c.model;
          std::vector<int64_t> widths{m.input};
          widths.insert(widths.end(), m.hidden.begin(), m.hidden.end());
          widths.push_back(m.classes);
          return std::make_shared<nn::MLP>(widths, m.norm, m.activation, m.bias);
        },
    .check_data = check_fits,
    .check_memory = [](const Config& c, Device device, int world) { check_memory(c, device, world); },
});

}  // namespace
}  // namespace mt::app
