#pragma once
// What the ranks of a data-parallel job must agree on (parallel/job_check.h), from the program's
// side: the resolved config, key by key ("optim.lr" -> "0.001", in to_yaml's order). The trainer
// adds each parameter's name, shape and dtype (train::Options::job_keys) and checks them all
// before the ranks' first collective.
#include "app/config.h"
#include "parallel/job_check.h"

namespace mt::app {

parallel::JobEntries job_entries(const Config& c);

}  // namespace mt::app
