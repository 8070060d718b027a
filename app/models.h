#pragma once
// The models the `train` program builds from a config's `model` section. The trainer itself
// takes any nn::Module; this is where the YAML's model turns into one.
#include <memory>

#include "nn/module.h"
#include "app/config.h"

namespace mt::app {

// An MLP of widths {input, hidden..., classes}: per hidden layer Linear → [RMSNorm] → activation,
// then a final Linear (nn::MLP), fp32 on the CPU, initialized from the default generator.
std::shared_ptr<nn::Module> build_model(const ModelConfig& m);

}  // namespace mt::app
