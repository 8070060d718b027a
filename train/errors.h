#pragma once
// The training floor's error for a value that went non-finite, apart from the heavy headers that
// throw it (the trainer, sampling).
#include "core/error.h"

namespace mt::train {

// A NaN or inf in the loss, a gradient, the state about to be saved or the logits being sampled:
// the run stops; `train` exits with code 3. (One in the data is a data::DataError when it is
// loaded: exit code 4.)
struct NonFiniteError : Error {
  using Error::Error;
};

}  // namespace mt::train
