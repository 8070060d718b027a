#include "app/lm_commands.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include <yaml-cpp/yaml.h>

#include "app/cli.h"
#include "app/inference.h"
#include "data/data.h"
#include "data/token_shards.h"
#include "data/token_windows.h"
#include "data/tokenizer.h"
#include "nn/serialize.h"
#include "train/checkpoint.h"
#include "app/config.h"
#include "train/sample.h"
#include "train/trainer.h"

namespace mt::app {

namespace {

// "--name value" pairs; a name outside `known`, one without a value or one given twice is a
// ConfigError.
std::map<std::string, std::string> parse_options(const std::vector<std::string>& args,
                                                 const std::string& command,
                                                 const std::vector<std::string>& known) {
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (std::find(known.begin(), known.end(), a) == known.end())
      throw ConfigError("train " + command + ": unknown option '" + a + "'");
    if (i + 1 >= args.size()) throw ConfigError("train " + command + ": " + a + " needs a value");
    if (out.contains(a)) throw ConfigError("train " + command + ": " + a + " is given twice");
    out[a] = args[++i];
  }
  return out;
}

// The option `key` as a T, the whole text parsed (an integer exactly: no rounding through a
// double, no value out of T's range); absent, `fallback`.
template <class T>
T number(const std::map<std::string, std::string>& o, const std::string& key, T fallback) {
  auto it = o.find(key);
  if (it == o.end()) return fallback;
  const std::string& s = it->second;
  T v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size())
    throw ConfigError(key + ": expected " +
                      (std::is_integral_v<T> ? "a whole number" : "a number") + " in range, got '" +
                      s + "'");
  return v;
}

std::string text_of(const std::map<std::string, std::string>& o, const std::string& key,
                    const std::string& fallback) {
  auto it = o.find(key);
  return it == o.end() ? fallback : it->second;
}

// The tokenizer `name`: an unknown name is a ConfigError (exit code 2), a vocabulary whose files
// cannot be read or parsed a data::DataError (4), as for any data file.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name, const std::string& gpt2_dir,
                                          const std::string& from = "--tokenizer") {
  if (name != "bytes" && name != "gpt2")
    throw ConfigError(from + ": unknown tokenizer '" + name + "': the tokenizers are bytes and gpt2");
  try {
    return make_tokenizer(name, gpt2_dir);
  } catch (const Error& e) {
    throw data::DataError(std::string("the ") + name + " tokenizer: " + e.what());
  }
}

// `section`.`key` of a saved config as a T (absent: `fallback`); `where` names the file. A value
// of another type is an InferenceError naming the key, not yaml-cpp's "bad conversion".
template <class T>
T yaml_value(const YAML::Node& section, const std::string& name, const char* key, T fallback,
             const std::string& where) {
  if (!section || !section[key]) return fallback;
  try {
    return section[key].as<T>();
  } catch (const YAML::Exception&) {
    throw InferenceError(where + ": its config's " + name + "." + key + " is not " +
                         (std::is_same_v<T, std::string> ? "a string"
                          : std::is_same_v<T, bool>      ? "true or false"
                          : std::is_integral_v<T>        ? "a whole number"
                                                         : "a number"));
  }
}

// The section `name` of a saved config's YAML (an empty node when absent).
YAML::Node config_section(const std::string& yaml, const std::string& name,
                          const std::string& where) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    throw InferenceError(where + ": its config is not YAML: " + e.what());
  }
  if (!root.IsMap()) throw InferenceError(where + ": its config is not a YAML mapping");
  const YAML::Node section = root[name];
  if (section && !section.IsMap())
    throw InferenceError(where + ": its config's " + name + " is not a mapping");
  return section;
}

// The sizes a saved config names, against the file's weights, before the model is built: a
// config that is not its weights' would otherwise allocate whatever it names first.
void check_sizes(const nn::GPTConfig& c, const nn::StateDict& tensors, const std::string& path) {
  auto expect = [&](const std::string& name, const Shape& shape) {
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const auto& named) { return named.first == name; });
    if (it == tensors.end() || it->second.shape() != shape)
      throw InferenceError(path + ": does not fit the GPT its config describes: its " + name +
                           " should be " + shape_str(shape) +
                           (it == tensors.end() ? ", and the file has none"
                                                : ", the file's is " + shape_str(it->second.shape())));
  };
  expect("transformer.wte.weight", {c.padded_vocab(), c.n_embd});
  expect("transformer.wpe.weight", {c.block_size, c.n_embd});
  expect("transformer.h." + std::to_string(c.n_layer - 1) + ".ln_1.weight", {c.n_embd});
}

}  // namespace

nn::GPTConfig gpt_config_from_yaml(const std::string& yaml, const std::string& where) {
  const YAML::Node m = config_section(yaml, "model", where);
  auto value = [&]<class T>(const char* key, T fallback) {
    return yaml_value<T>(m, "model", key, fallback, where);
  };
  const std::string kind = value("kind", std::string("mlp"));
  if (kind != "gpt")
    throw InferenceError(where + ": model.kind is '" + kind + "', not gpt: only a GPT samples text");
  nn::GPTConfig c;
  c.n_layer = value("n_layer", c.n_layer);
  c.n_head = value("n_head", c.n_head);
  c.n_embd = value("n_embd", c.n_embd);
  c.block_size = value("block_size", c.block_size);
  c.vocab_size = value("vocab_size", c.vocab_size);
  c.padded_vocab_size = value("padded_vocab_size", c.padded_vocab_size);
  c.dropout = value("dropout", c.dropout);
  c.bias = value("bias", c.bias);
  return c;
}

int sample_command(const std::vector<std::string>& args) {
  const auto o = parse_options(args, "sample", {"--checkpoint", "--prompt", "--tokens",
                                                "--temperature", "--top-k", "--seed", "--device",
                                                "--tokenizer", "--gpt2-dir"});
  if (!o.contains("--checkpoint")) throw ConfigError("train sample: --checkpoint FILE|DIR is required");
  const std::string device_spec = text_of(o, "--device", "cpu");
  if (!valid_device(device_spec))
    throw ConfigError("--device: expected auto, cpu, cuda or cuda:N, got '" + device_spec + "'");
  const ModelFile model_file = read_model_file(o.at("--checkpoint"));
  const std::string& path = model_file.path;
  const nn::TensorFile& file = model_file.file;
  const std::string& config = file.metadata.at("config");
  const nn::GPTConfig c = gpt_config_from_yaml(config, path);
  // The tokenizer: --tokenizer, else the one the run's text went through; token data does not
  // record its tokenizer, and is taken to hold GPT-2's ids, as llm.c's shards and `train
  // tokenize`'s default do.
  const YAML::Node data = config_section(config, "data", path);
  auto data_value = [&](const char* key, const std::string& fallback) {
    return yaml_value<std::string>(data, "data", key, fallback, path);
  };
  const bool token_data = data_value("kind", "") == "tokens", named = o.contains("--tokenizer");
  const auto tokenizer = load_tokenizer(
      named ? o.at("--tokenizer") : data_value("tokenizer", token_data ? "gpt2" : "bytes"),
      text_of(o, "--gpt2-dir", data_value("gpt2_dir", "assets/gpt2")),
      named ? "--tokenizer" : path + ": its config's data.tokenizer");
  if (tokenizer->vocab_size() > c.vocab_size)
    throw InferenceError(path + ": the " + tokenizer->name() + " tokenizer has " +
                         std::to_string(tokenizer->vocab_size()) + " ids, more than the model's "
                         "vocab_size " + std::to_string(c.vocab_size) + " (--tokenizer names "
                         "the one its data was made with)");
  // Ids past the tokenizer's (a vocab_size larger than it) never occur in the data and have no
  // text: the sample is drawn among the tokenizer's ids, as a padded vocabulary's are left out.
  const int64_t vocab = tokenizer->vocab_size();
  const Device device = train::resolve_device(device_spec);

  check_sizes(c, file.tensors, path);
  std::unique_ptr<nn::GPT> model;
  try {
    model = std::make_unique<nn::GPT>(c);
    model->load_state_dict(file.tensors);
  } catch (const Error& e) {
    throw InferenceError(path + ": does not fit the GPT its config describes: " + e.what());
  }
  model->to(device);
  train::SampleOptions so{.tokens = number<int64_t>(o, "--tokens", 200),
                          .temperature = number<double>(o, "--temperature", 1.0),
                          .top_k = number<int64_t>(o, "--top-k", 0),
                          .seed = number<uint64_t>(o, "--seed", 0)};
  const std::string prompt = text_of(o, "--prompt", "\n");
  std::vector<int32_t> ids;
  try {
    ids = tokenizer->encode(prompt);
  } catch (const Error& e) {
    throw data::DataError(std::string("--prompt: ") + e.what());
  }
  // The text is written as it is drawn: the prompt with the first token (a bad option writes
  // nothing), then each token's bytes (a tokenizer's decode is the concatenation of its ids').
  bool started = false;
  auto write = [](const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  so.on_token = [&](int32_t t) {
    if (!std::exchange(started, true)) write(prompt);
    write(tokenizer->decode(std::span<const int32_t>(&t, 1)));
  };
  try {
    train::check_sample_options(ids, vocab, so);
  } catch (const Error& e) {
    throw ConfigError(e.what());  // an empty prompt, temperature, top-k: nothing written yet
  }
  try {
    train::sample(*model, ids, vocab, c.block_size, so, device);
  } catch (...) {  // non-finite logits (exit 3), a device error, memory: after what was drawn
    // The text so far stays, ended by one newline: where the error shares the terminal, its
    // message's own (run_cli's) ends it.
    if (started && !errors_share_the_terminal()) write("\n");
    throw;
  }
  if (!started) write(prompt);  // --tokens 0
  write("\n");
  return 0;
}

int tokenize_command(const std::vector<std::string>& args) {
  const auto o = parse_options(args, "tokenize",
                               {"--input", "--output", "--tokenizer", "--gpt2-dir", "--special"});
  if (!o.contains("--input") || !o.contains("--output"))
    throw ConfigError("train tokenize: --input TEXT_FILE and --output SHARD.bin are required");
  const std::string name = text_of(o, "--tokenizer", "gpt2");
  const std::string gpt2_dir = text_of(o, "--gpt2-dir", "assets/gpt2");
  // The shard must not replace a file this command reads: the text, or GPT-2's vocabulary.
  std::vector<std::string> reads = {o.at("--input")};
  if (name == "gpt2")
    reads.insert(reads.end(), {gpt2_dir + "/encoder.json", gpt2_dir + "/vocab.bpe"});
  check_output_file("tokenize: --output", o.at("--output"), reads);
  const std::string special = text_of(o, "--special", "as-text");
  if (special != "as-text" && special != "allow")
    throw ConfigError("--special: expected as-text or allow, got '" + special + "'");
  const auto tokenizer = load_tokenizer(name, gpt2_dir);
  if (special == "allow" && !tokenizer->end_of_text())
    throw ConfigError("--special allow: the " + tokenizer->name() + " tokenizer has no special "
                      "tokens");
  data::TokenStream s;
  try {
    s = data::tokenize_text_file(o.at("--input"), *tokenizer,
                                 special == "allow" ? Special::allow : Special::as_text);
  } catch (const Error& e) {
    throw data::DataError(e.what());
  }
  write_token_shard(o.at("--output"), to_shard_tokens(s.tokens));
  std::printf("tokenize: %lld bytes -> %lld %s tokens -> %s\n", (long long)s.text_bytes,
              (long long)s.tokens.size(), tokenizer->name().c_str(), o.at("--output").c_str());
  return 0;
}

}  // namespace mt::app
