// model.kind: mlp, the model the `train` program builds by default. Its keys are the schema's
// own (model.input, hidden, classes, norm, activation, bias; app/config.h), which the synthetic
// data also reads for its shape.
#include <algorithm>
#include <cmath>

#include "app/memory.h"
#include "app/registry.h"
#include "nn/modules.h"

namespace mt::app {
namespace {

// A CSV's label column, as data.label_column names it: "column 4 (data.label_column = -1, the last)".
std::string label_column_text(const DataConfig& d, const data::Dataset& set) {
  const int64_t column = d.label_column < 0 ? set.dim : d.label_column;
  return detail::concat("column ", column, " (data.label_column = ", d.label_column,
                        d.label_column < 0 ? ", the last)" : ")");
}

// A label outside model.classes in a CSV is often the wrong column read as labels. Names the
// column read, and the first feature column that looks like labels (whole numbers in
// [0, classes), at least two of them) as the value data.label_column may have meant.
std::string label_column_hint(const Config& c, const data::Dataset& set, int64_t largest) {
  const DataConfig& d = c.data;
  std::string hint = "; the labels are read from " + label_column_text(d, set);
  const int64_t label_at = d.label_column < 0 ? set.dim : d.label_column;
  const size_t D = size_t(set.dim);
  for (size_t k = 0; k < D; ++k) {
    float lo = INFINITY, hi = -INFINITY;
    bool labels = true;
    for (size_t r = 0; r < size_t(set.size) && labels; ++r) {
      const float v = set.features[r * D + k];
      labels = v >= 0 && v < float(c.model.classes) && v == std::floor(v);
      lo = std::min(lo, v), hi = std::max(hi, v);
    }
    if (!labels || lo == hi) continue;
    const int64_t column = int64_t(k) < label_at ? int64_t(k) : int64_t(k) + 1;  // in the file
    return hint + detail::concat("; column ", column, " holds whole numbers ", lo, " to ", hi,
                                 ": did you mean data.label_column=", column, "?");
  }
  return hint + detail::concat(": if that is the label column, model.classes must be at least ",
                               largest + 1);
}

// The data must fit the model: its feature count and its labels.
void check_fits(const Config& c, const data::Dataset& set) {
  const ModelConfig& m = c.model;
  if (set.size == 0) return;
  const bool csv = c.data.kind == "csv" && !set.file.empty();
  const std::string which = set.file.empty() ? set.name : set.name + " file " + set.file;
  if (set.dim != m.input)
    throw ConfigError(detail::concat("model.input: is ", m.input, " but the ", which,
                                     " has ", set.dim, " features per sample",
                                     csv ? "; every column but the label column, " +
                                               label_column_text(c.data, set) + ", is a feature"
                                         : ""));
  for (size_t i = 0; i < set.labels.size(); ++i)
    if (set.labels[i] < 0 || set.labels[i] >= m.classes) {
      const int64_t largest = *std::max_element(set.labels.begin(), set.labels.end());
      throw ConfigError(detail::concat("model.classes: is ", m.classes, " but the ", which,
                                       " has label ", set.labels[i], " (sample ", i, ")",
                                       csv ? label_column_hint(c, set, largest) : ""));
    }
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
