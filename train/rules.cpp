#include "train/rules.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"

namespace mt::train {
namespace {

using O = const Options&;

// A value as messages show it: numbers as the shortest text that reads back the same, strings
// quoted.
std::string shown(int64_t v) { return std::to_string(v); }
std::string shown(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
std::string shown(const std::string& v) { return "'" + v + "'"; }

// The rule that the value `get` reads passes `ok`; else "<what>, got <value>".
template <class Get, class Ok>
Rule value(std::string key, Get get, Ok ok, std::string what) {
  return {std::move(key), [get, ok, what](O o) {
            const auto v = get(o);
            return ok(v) ? std::string() : what + ", got " + shown(v);
          }};
}

// The rule that the string `get` reads is one of `choices`.
template <class Get>
Rule one_of(std::string key, Get get, std::vector<std::string> choices) {
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  Rule r = value(std::move(key), get, [choices](const std::string& v) {
    return std::find(choices.begin(), choices.end(), v) != choices.end();
  }, "expected one of " + list);
  r.choices = std::move(choices);
  return r;
}

// A rule between keys: "" when `ok`, else `what` (which names the other key).
template <class Ok, class What>
Rule between(std::string key, Ok ok, What what) {
  return {std::move(key), [ok, what](O o) { return ok(o) ? std::string() : std::string(what(o)); },
          true};
}

const std::string kMaxSamplesText = "must be at most " + std::to_string(kMaxSamples);

}  // namespace

const std::vector<Rule>& rules() {
  static const std::vector<Rule> all = {
      one_of("optim.name", [](O o) { return o.optimizer.name; }, {"adamw", "sgd"}),
      value("optim.lr", [](O o) { return o.optimizer.lr; },
            [](double v) { return v > 0; }, "must be > 0"),
      value("optim.weight_decay", [](O o) { return o.optimizer.weight_decay; },
            [](double v) { return v >= 0; }, "must be >= 0"),
      value("optim.betas[0]", [](O o) { return o.optimizer.betas[0]; },
            [](double v) { return v >= 0 && v < 1; }, "must be in [0, 1)"),
      value("optim.betas[1]", [](O o) { return o.optimizer.betas[1]; },
            [](double v) { return v >= 0 && v < 1; }, "must be in [0, 1)"),
      value("optim.eps", [](O o) { return o.optimizer.eps; },
            [](double v) { return v > 0; }, "must be > 0"),
      value("optim.momentum", [](O o) { return o.optimizer.momentum; },
            [](double v) { return v >= 0 && v < 1; }, "must be in [0, 1)"),
      one_of("optim.schedule", [](O o) { return o.schedule.kind; }, {"constant", "cosine"}),
      value("optim.warmup_steps", [](O o) { return o.schedule.warmup_steps; },
            [](int64_t v) { return v >= 0; }, "must be >= 0"),
      value("optim.min_lr", [](O o) { return o.schedule.min_lr; },
            [](double v) { return v >= 0; }, "must be >= 0"),
      value("optim.steps", [](O o) { return o.steps; },
            [](int64_t v) { return v >= 1; }, "must be at least 1"),
      value("optim.epochs", [](O o) { return o.epochs; },
            [](int64_t v) { return v >= 0; }, "must be >= 0 (0: optim.steps sets the length)"),
      value("optim.epochs", [](O o) { return o.epochs; },
            [](int64_t v) { return v <= kMaxSamples; }, kMaxSamplesText),
      value("optim.clip_norm", [](O o) { return o.optimizer.clip_norm; },
            [](double v) { return v >= 0; }, "must be >= 0 (0 turns clipping off)"),
      between("optim.min_lr", [](O o) { return o.schedule.min_lr <= o.optimizer.lr; },
              [](O o) {
                return "must not exceed optim.lr = " + shown(o.optimizer.lr) + ", got " +
                       shown(o.schedule.min_lr);
              }),
      between("optim.nesterov",
              [](O o) {
                return o.optimizer.name != "sgd" || !o.optimizer.nesterov || o.optimizer.momentum > 0;
              },
              [](O) { return "needs optim.momentum > 0"; }),
      between("optim.shard_state",
              [](O o) { return !o.optimizer.shard_state || o.optimizer.name == "adamw"; },
              [](O) { return "shards AdamW's state: needs optim.name adamw"; }),
      value("eval.every", [](O o) { return o.eval.every; },
            [](int64_t v) { return v >= 1; }, "must be at least 1"),
      value("eval.batch_size", [](O o) { return o.eval.batch_size; },
            [](int64_t v) { return v >= 1; }, "must be at least 1"),
      value("eval.batch_size", [](O o) { return o.eval.batch_size; },
            [](int64_t v) { return v <= kMaxSamples; }, kMaxSamplesText),
      value("checkpoint.dir", [](O o) { return o.checkpoint.dir; },
            [](const std::string& v) { return !v.empty(); }, "must not be empty"),
      value("checkpoint.every", [](O o) { return o.checkpoint.every; },
            [](int64_t v) { return v >= 1; }, "must be at least 1"),
      value("checkpoint.keep_last", [](O o) { return o.checkpoint.keep_last; },
            [](int64_t v) { return v >= 1; }, "must be at least 1"),
      value("logging.every", [](O o) { return o.logging.every; },
            [](int64_t v) { return v >= 1; }, "must be at least 1"),
  };
  return all;
}

void validate(const Options& o) {
  for (const Rule& r : rules())
    if (const std::string what = r.check(o); !what.empty()) throw ConfigError(r.key + ": " + what);
}

}  // namespace mt::train
