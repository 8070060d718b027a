// data.kind: text (a text file through a tokenizer) and tokens (llm.c shards): token windows
// for a GPT (data/token_source.h). data.path, val_fraction and seed are the schema's.
#include <glob.h>

#include <filesystem>

#include "app/registry.h"
#include "data/token_source.h"
#include "data/tokenizer.h"

namespace mt::app {
namespace {

// The files data.path names: for llm.c shards it may be a glob pattern, as llm.c's -i is
// ("fineweb_train_*.bin"), matched in name order and read as one stream; none match: empty.
std::vector<std::string> data_files(const DataConfig& d) {
  if (d.kind != "tokens" || d.path.find_first_of("*?[") == std::string::npos) return {d.path};
  glob_t g{};
  std::vector<std::string> files;
  if (::glob(d.path.c_str(), 0, nullptr, &g) == 0)
    files.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  return files;
}

// The token data a config names; a file that cannot be read or tokenized is a data::DataError,
// a tokenizer with more ids than model.vocab_size or too little text for the windows a ConfigError.
std::shared_ptr<data::Source> token_source(const Config& c) {
  const DataConfig& d = c.data;
  const int64_t vocab = c.model.params.integer("vocab_size");
  data::TokenStream stream;
  std::string tokenizer = "tokens";
  try {
    if (d.kind == "text") {
      const auto t = make_tokenizer(d.params.string("tokenizer"), d.params.string("gpt2_dir"));
      tokenizer = t->name();
      if (t->vocab_size() > vocab)
        throw ConfigError(detail::concat("model.vocab_size: is ", vocab, " but the ", t->name(),
                                         " tokenizer has ", t->vocab_size(), " ids"));
      stream = data::tokenize_text_file(d.path, *t);
    } else {
      stream = data::read_token_shards(data_files(d), vocab);
    }
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw data::DataError(e.what());
  }
  const int64_t T = d.params.integer("block_size");
  data::TokenSourceOptions o{.block_size = T > 0 ? T : c.model.params.integer("block_size"),
                             .batch_size = c.optim.batch_size, .microbatches = c.optim.microbatches,
                             .val_fraction = d.val_fraction,
                             .eval_windows = d.params.integer("eval_windows"), .seed = d.seed};
  try {
    return std::make_shared<data::TokenSource>(std::move(stream), tokenizer, o);
  } catch (const Error& e) {
    throw ConfigError(std::string("data: ") + e.what());  // too little text for the windows
  }
}

// A GPT trains on token data, whose windows fit its position table; the files must be there.
void check_tokens(const Config& c, const Reject& reject) {
  if (c.model.kind != "gpt")
    reject("kind", "is token data, for model.kind gpt, but model.kind is " + c.model.kind);
  const std::vector<std::string> files = data_files(c.data);
  if (files.empty()) reject("path", "no file matches the pattern '" + c.data.path + "'");
  std::error_code ec;
  for (const std::string& f : files)
    if (!std::filesystem::is_regular_file(f, ec))
      reject("path", (std::filesystem::exists(f, ec)
                          ? std::string(std::filesystem::is_directory(f, ec) ? "is a directory"
                                                                             : "is not a regular file")
                          : "no such file") +
                         " (data.kind " + c.data.kind + " reads a file), got '" + f + "'");
  if (c.model.kind == "gpt" &&
      c.data.params.integer("block_size") > c.model.params.integer("block_size"))
    reject("block_size", "is larger than the model's block_size " +
                             std::to_string(c.model.params.integer("block_size")) +
                             " (its position table has that many rows), got " +
                             std::to_string(c.data.params.integer("block_size")));
}

std::vector<ParamKey> token_keys(bool text) {
  std::vector<ParamKey> keys = {
      {.name = "block_size", .type = ParamType::integer, .default_value = "0",
       .meaning = "tokens per window; 0 is model.block_size", .constraints = "0 … model.block_size",
       .check = [](const Params& p) { return p.integer("block_size") >= 0 ? "" : "must be >= 0"; }},
      {.name = "eval_windows", .type = ParamType::integer, .default_value = "256",
       .meaning = "validation windows, spread over the held-out tail; 0: the windows that tile "
                  "it, T apart, so each held-out token is a target once (llm.c's validation)",
       .constraints = "≥ 0",
       .check = [](const Params& p) { return p.integer("eval_windows") >= 0 ? "" : "must be >= 0"; }}};
  if (text) {
    keys.push_back({.name = "tokenizer", .type = ParamType::string, .default_value = "bytes",
                    .meaning = "how the text becomes token ids", .constraints = "bytes, gpt2",
                    .check = [](const Params& p) {
                      const std::string t = p.string("tokenizer");
                      return t == "bytes" || t == "gpt2" ? "" : "expected bytes or gpt2";
                    }});
    keys.push_back({.name = "gpt2_dir", .type = ParamType::string, .default_value = "assets/gpt2",
                    .meaning = "gpt2: the folder of encoder.json and vocab.bpe"});
  }
  return keys;
}

const RegisterData text({
    .name = "text",
    .meaning = "a text file (data.path) as tokens, for model.kind gpt (docs/guide.md)",
    .keys = token_keys(true),
    .source = token_source,
    .check = check_tokens,
});

const RegisterData tokens({
    .name = "tokens",
    .meaning = "llm.c token shards (data.path: a file or a glob pattern), for model.kind gpt",
    .keys = token_keys(false),
    .source = token_source,
    .check = check_tokens,
});

}  // namespace
}  // namespace mt::app
