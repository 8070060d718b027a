// The rules of train::Options' values (train/rules.h): one table, which train::validate walks and
// the config schema (app/config.cpp) calls key by key. Every rule of the table, broken once, gives
// the same message both ways: train::validate on the Options, and the config with the same value
// from --set (which adds the --set it came from). A rule without an example below fails the
// coverage test, so a new rule cannot go unchecked.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "app/config.h"
#include "train/options.h"
#include "train/rules.h"

using namespace mt;

namespace {

// One bad value (or, for a rule between keys, a bad pair), as --set overrides and as the same
// change to default Options.
struct Example {
  std::vector<std::string> set;
  std::function<void(train::Options&)> apply;
};

const std::vector<Example>& examples() {
  static const std::vector<Example> all = {
      {{"optim.name=lamb"}, [](train::Options& o) { o.optimizer.name = "lamb"; }},
      {{"optim.lr=-1"}, [](train::Options& o) { o.optimizer.lr = -1; }},
      {{"optim.weight_decay=-0.5"}, [](train::Options& o) { o.optimizer.weight_decay = -0.5; }},
      {{"optim.betas=[1, 0.999]"}, [](train::Options& o) { o.optimizer.betas = {1, 0.999}; }},
      {{"optim.betas=[0.9, 1.5]"}, [](train::Options& o) { o.optimizer.betas = {0.9, 1.5}; }},
      {{"optim.eps=0"}, [](train::Options& o) { o.optimizer.eps = 0; }},
      {{"optim.momentum=1"}, [](train::Options& o) { o.optimizer.momentum = 1; }},
      {{"optim.schedule=linear"}, [](train::Options& o) { o.schedule.kind = "linear"; }},
      {{"optim.warmup_steps=-1"}, [](train::Options& o) { o.schedule.warmup_steps = -1; }},
      {{"optim.min_lr=-0.1"}, [](train::Options& o) { o.schedule.min_lr = -0.1; }},
      {{"optim.steps=0"}, [](train::Options& o) { o.steps = 0; }},
      {{"optim.epochs=-1"}, [](train::Options& o) { o.epochs = -1; }},
      {{"optim.epochs=4294967297"}, [](train::Options& o) { o.epochs = 4294967297; }},
      {{"optim.clip_norm=-1"}, [](train::Options& o) { o.optimizer.clip_norm = -1; }},
      {{"optim.min_lr=0.01"}, [](train::Options& o) { o.schedule.min_lr = 0.01; }},
      {{"optim.name=sgd", "optim.momentum=0", "optim.nesterov=true"},
       [](train::Options& o) {
         o.optimizer.name = "sgd";
         o.optimizer.momentum = 0;
         o.optimizer.nesterov = true;
       }},
      {{"optim.name=sgd", "optim.shard_state=true"},
       [](train::Options& o) {
         o.optimizer.name = "sgd";
         o.optimizer.shard_state = true;
       }},
      {{"eval.every=0"}, [](train::Options& o) { o.eval.every = 0; }},
      {{"eval.batch_size=0"}, [](train::Options& o) { o.eval.batch_size = 0; }},
      {{"eval.batch_size=4294967297"}, [](train::Options& o) { o.eval.batch_size = 4294967297; }},
      {{"checkpoint.dir=''"}, [](train::Options& o) { o.checkpoint.dir = ""; }},
      {{"checkpoint.every=0"}, [](train::Options& o) { o.checkpoint.every = 0; }},
      {{"checkpoint.keep_last=0"}, [](train::Options& o) { o.checkpoint.keep_last = 0; }},
      {{"logging.every=0"}, [](train::Options& o) { o.logging.every = 0; }},
  };
  return all;
}

// The message of the ConfigError `f` throws; "(no error)" if it throws none.
std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// The rule train::validate reports for `o`: the first the options break (null: none).
const train::Rule* first_broken(const train::Options& o) {
  for (const train::Rule& r : train::rules())
    if (!r.check(o).empty()) return &r;
  return nullptr;
}

}  // namespace

TEST(Rules, DefaultsKeepEveryRule) {
  EXPECT_EQ(first_broken(train::Options{}), nullptr);
  EXPECT_EQ(first_broken(app::options_from(Config{})), nullptr);
  EXPECT_NO_THROW(train::validate(train::Options{}));
}

// The library and the config speak of a bad value in the same words.
TEST(Rules, EachRuleGivesTheSameMessageFromTheLibraryAndTheConfig) {
  for (const Example& e : examples()) {
    SCOPED_TRACE("--set " + e.set.back());
    train::Options o;
    e.apply(o);
    const train::Rule* rule = first_broken(o);
    ASSERT_NE(rule, nullptr) << "the example breaks no rule";
    const std::string library = config_error([&] { train::validate(o); });
    EXPECT_EQ(library, rule->key + ": " + rule->check(o));

    // The config names the --set that gave the rule's key ("optim.betas" for "optim.betas[1]").
    const std::string key = rule->key.substr(0, rule->key.find('['));
    std::string from;
    for (const std::string& s : e.set)
      if (s.starts_with(key + "=")) from = s;
    ASSERT_FALSE(from.empty()) << "no --set of the example gives " << key;
    const std::string config = config_error([&] { parse_config("", "t.yaml", e.set); });
    EXPECT_EQ(config, library + " (from --set " + from + ")");
  }
}

// Every rule of the table has an example above that it is the first to refuse.
TEST(Rules, EveryRuleHasAnExample) {
  std::set<const train::Rule*> covered;
  for (const Example& e : examples()) {
    train::Options o;
    e.apply(o);
    covered.insert(first_broken(o));
  }
  const std::vector<train::Rule>& rules = train::rules();
  for (size_t i = 0; i < rules.size(); ++i)
    EXPECT_TRUE(covered.contains(&rules[i]))
        << "rule " << i << " of train::rules() (" << rules[i].key
        << ") has no example in tests/test_rules.cpp that it is the first to refuse";
}
