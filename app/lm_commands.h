#pragma once
// The language-model commands of `train` (app/cli.cpp dispatches to them):
//
//   train sample --checkpoint FILE|DIR [--prompt TEXT] [--tokens N] [--temperature T]
//                [--top-k K] [--seed S] [--device DEVICE] [--tokenizer bytes|gpt2]
//                [--gpt2-dir DIR]
//   train tokenize --input TEXT_FILE --output SHARD.bin [--tokenizer bytes|gpt2] [--gpt2-dir DIR]
//
// sample prints the prompt and N sampled tokens as text (train/sample.h: the same seed gives the
// same text on a device; --device defaults to cpu). The model and its tokenizer come from the
// checkpoint's saved config (model.kind gpt; data.tokenizer, data.gpt2_dir), --tokenizer and
// --gpt2-dir overriding them; a model trained on token data (which does not name its tokenizer)
// is taken to speak GPT-2's ids. Tokens are drawn among the tokenizer's ids only. An empty
// prompt is an error; a prompt longer than the model's block_size is kept whole in the output,
// and the model sees its last block_size tokens. tokenize writes a text file's tokens as one
// llm.c shard (data/token_shards.h) that `data.kind: tokens` (and llm.c) read.
//
// Errors are thrown for the program to turn into its exit codes: a bad command line or option
// value (--device included) is a ConfigError (2), a checkpoint that cannot be used (damaged, a
// non-finite value) or an output that would replace an input, a link or a device an
// InferenceError (2), text the tokenizer refuses, a vocabulary file that does not parse or a
// file that cannot be read a data::DataError (4). docs/gpt.md has the table of bad inputs and
// their exit codes.
#include <string>
#include <vector>

#include "nn/gpt.h"

namespace mt::app {

// The GPT a YAML config's `model` section describes (model.kind must be gpt); `where` names the
// config in messages. Read on its own rather than through parse_config: sampling needs the model,
// not the training data the rest of the config names (which parse_config checks is there).
nn::GPTConfig gpt_config_from_yaml(const std::string& yaml, const std::string& where);

int sample_command(const std::vector<std::string>& args);
int tokenize_command(const std::vector<std::string>& args);

}  // namespace mt::app
