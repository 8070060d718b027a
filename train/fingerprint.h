#pragma once
// What the ranks of a data-parallel job must agree on (parallel/job_check.h): the resolved config,
// key by key ("optim.lr" -> "0.001", in to_yaml's order), then each parameter's name, shape and
// dtype ("param.layers.0.weight" -> "[64, 784] f32"). The trainer checks them before the ranks'
// first collective.
#include "nn/module.h"
#include "parallel/job_check.h"
#include "train/config.h"

namespace mt::train {

parallel::JobEntries job_entries(const Config& c, const nn::Module& model);

}  // namespace mt::train
