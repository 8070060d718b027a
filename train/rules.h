#pragma once
// The rules of train::Options' values, in one table: each is the key it checks, the check and its
// message. Both ways into the trainer use it, so a bad value reads the same from either:
//   - train::validate(Options) (train/options.h) walks the whole table, for a program that builds
//     Options itself, and the Trainer calls it first;
//   - the `train` program's config schema (app/config.cpp) calls the rules of each key as it
//     reads the key's value, and adds where the value came from:
//       optim.lr: must be > 0, got -1                          (train::validate)
//       optim.lr: must be > 0, got -1 at mlp.yaml:7:7          (train --config)
//       optim.lr: must be > 0, got -1 (from --set optim.lr=-1) (train --set)
// A rule is named by the config's key path (docs/config.md), the name a user of either sees in
// messages and logs; the Options field it reads is the one options_from (app/config.h) fills from
// that key (optim.lr is Options::optimizer.lr, optim.schedule is Options::schedule.kind).
//
// What only the config has (model and data keys, optim.batch_size, the spellings of the loss
// scale) is checked by the config schema alone; what depends on more than the values (the device,
// the data, the world size) by the trainer when it is built.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/options.h"

namespace mt::train {

// The bound of eval.batch_size and optim.epochs (and of the config's sample counts): far above
// any run this trainer is for, and low enough that every product formed from it (samples x width)
// fits in 64 bits.
inline constexpr int64_t kMaxSamples = int64_t(1) << 32;

struct Rule {
  std::string key;  // the config key path it checks: "optim.lr", "optim.betas[1]"
  // "" when `o` keeps the rule; else what is wrong, with the value: "must be > 0, got -1".
  std::function<std::string(const Options& o)> check;
  // A rule between two keys (optim.min_lr and optim.lr). The config checks these once the whole
  // section is read, so a misspelled key is reported as that, not as a conflict with the default
  // it failed to replace.
  bool between_keys = false;
  // A rule that the value be one of these (the config suggests the nearest to a misspelling).
  std::vector<std::string> choices = {};
};

// Every rule, in the config's order of keys; a key may have several (a lower and an upper bound).
const std::vector<Rule>& rules();

}  // namespace mt::train
