// `train sample` and `train tokenize` end to end (app/lm_commands.h): same seed, same text; bad
// options, prompts, inputs and vocabulary files give a clear message and the documented exit code.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/rng.h"
#include "data/token_shards.h"
#include "nn/gpt.h"
#include "nn/serialize.h"
#include "tests/run_train.h"
#include "tests/temp_dir.h"

using namespace mt;

namespace {

// A small GPT saved as `train` saves a model file: its weights (after `edit`, when given) and its
// config (by default a byte-level model of text).
std::string save_tiny_gpt(const std::filesystem::path& dir, int64_t vocab = 256,
                          const std::string& data = "{kind: text, tokenizer: bytes}",
                          const std::string& name = "gpt",
                          const std::function<void(nn::GPT&)>& edit = {}) {
  manual_seed(0);
  nn::GPT model({.n_layer = 1, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = vocab});
  if (edit) edit(model);
  const std::string path = (dir / (name + ".safetensors")).string();
  nn::save(model, path,
           {{"config", "model: {kind: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 8, "
                       "vocab_size: " + std::to_string(vocab) + "}\ndata: " + data + "\n"}});
  return path;
}

void expect_fails(const std::string& args, int code, const std::string& words) {
  std::string out;
  EXPECT_EQ(test::run_train(args, &out), code) << args << "\n" << out;
  EXPECT_NE(out.find(words), std::string::npos) << args << ": output lacks '" << words << "':\n" << out;
}

TEST(SampleCli, SameSeedSameTextAndBadOptions) {
  test::TempDir t;
  const std::string ckpt = save_tiny_gpt(t.path);
  std::string a, b, c;
  const std::string base = "sample --checkpoint " + ckpt + " --prompt 'To be' --tokens 40 --top-k 20";
  ASSERT_EQ(test::run_train(base + " --seed 5", &a, false), 0) << a;
  ASSERT_EQ(test::run_train(base + " --seed 5", &b, false), 0);
  ASSERT_EQ(test::run_train(base + " --seed 6", &c, false), 0);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a.rfind("To be", 0), 0u) << "the output starts with the prompt";
  // A prompt longer than block_size (8) is fine: the model sees its last 8 tokens.
  EXPECT_EQ(test::run_train("sample --checkpoint " + ckpt + " --prompt 'a much longer prompt' --tokens 5", nullptr), 0);

  expect_fails("sample --checkpoint " + ckpt + " --prompt ''", 2, "prompt is empty");
  expect_fails("sample --checkpoint " + ckpt + " --temperature 0", 2, "temperature must be a positive number, got 0");
  expect_fails("sample --checkpoint " + ckpt + " --temperature -1", 2, "temperature");
  expect_fails("sample --checkpoint " + ckpt + " --top-k 257", 2, "top_k must be in [0, 256]");
  expect_fails("sample --checkpoint " + ckpt + " --tokens many", 2,
               "--tokens: expected a whole number in range, got 'many'");
  expect_fails("sample --checkpoint " + ckpt + " --bogus 1", 2, "unknown option '--bogus'");
  expect_fails("sample --prompt x", 2, "--checkpoint FILE|DIR is required");
  for (const char* help : {"sample --help", "tokenize -h", "sample --prompt x --help"}) {
    std::string usage;
    EXPECT_EQ(test::run_train(help, &usage, false), 0) << help;
    EXPECT_NE(usage.find("train sample --checkpoint CKPT"), std::string::npos) << help << usage;
  }
  expect_fails("sample --checkpoint " + ckpt + " --device gpu", 2,
               "--device: expected auto, cpu, cuda or cuda:N, got 'gpu'");
  expect_fails("sample --checkpoint " + ckpt + " --seed -1", 2, "--seed: expected a whole number");
  expect_fails("sample --checkpoint " + ckpt + " --tokens 1e3", 2,
               "--tokens: expected a whole number");
  // Seeds are taken exactly: two next to each other past 2^53 (one double) draw other text.
  std::string d, e;
  ASSERT_EQ(test::run_train(base + " --seed 9007199254740992", &d, false), 0) << d;
  ASSERT_EQ(test::run_train(base + " --seed 9007199254740993", &e, false), 0) << e;
  EXPECT_NE(d, e);
  // A model file holding a NaN (with its checksums intact) is damage, as eval and --resume say.
  const std::string nan_path =
      save_tiny_gpt(t.path, 256, "{kind: text, tokenizer: bytes}", "nan", [](nn::GPT& m) {
        for (const auto& [name, p] : m.named_parameters())
          if (name == "transformer.ln_f.weight") p.detach().fill_(std::nan(""));
      });
  expect_fails("sample --checkpoint " + nan_path, 2,
               "parameter 'transformer.ln_f.weight' holds nan: not a model to use");
  expect_fails("sample --checkpoint " + (t.path / "missing.safetensors").string(), 2, "missing.safetensors");
}

// The tokenizer `sample` decodes with: token data does not name one, so a model trained on it is
// taken to speak GPT-2's ids (as llm.c's shards do), and --tokenizer says otherwise; a model
// whose vocab_size exceeds its tokenizer's ids draws among the tokenizer's only (the rest have no
// text), so the output is the prompt and exactly N bytes.
TEST(SampleCli, TheTokenizerIsTheDatasOrNamedAndDrawsOnlyItsIds) {
  test::TempDir t;
  const std::string gpt2_dir = " --gpt2-dir " MT_SOURCE_DIR "/assets/gpt2";
  const std::string shards = "{kind: tokens, path: train.bin}";
  const std::string gpt2 = save_tiny_gpt(t.path, 50257, shards, "gpt2");
  std::string out;
  EXPECT_EQ(test::run_train("sample --checkpoint " + gpt2 + " --prompt Hello --tokens 4 --seed 3" +
                                gpt2_dir, &out, false), 0) << out;
  EXPECT_EQ(out.rfind("Hello", 0), 0u) << out;

  const std::string bytes = save_tiny_gpt(t.path, 256, shards, "bytes");
  expect_fails("sample --checkpoint " + bytes + " --tokens 4" + gpt2_dir, 2,
               "the gpt2 tokenizer has 50257 ids, more than the model's vocab_size 256 "
               "(--tokenizer names the one its data was made with)");
  EXPECT_EQ(test::run_train("sample --checkpoint " + bytes + " --prompt ab --tokens 30 "
                            "--tokenizer bytes", &out, false), 0) << out;
  EXPECT_EQ(out.size(), 2u + 30u + 1u) << out;
  expect_fails("sample --checkpoint " + bytes + " --tokenizer words", 2,
               "unknown tokenizer 'words'");

  const std::string wide = save_tiny_gpt(t.path, 300, "{kind: text, tokenizer: bytes}", "wide");
  for (int seed = 0; seed < 3; ++seed) {
    ASSERT_EQ(test::run_train("sample --checkpoint " + wide + " --prompt ab --tokens 60 --seed " +
                              std::to_string(seed), &out, false), 0) << out;
    EXPECT_EQ(out.size(), 2u + 60u + 1u) << "seed " << seed << ": " << out;
  }
}

// A saved config that the model file's checksums cover but that does not describe a GPT is named
// key by key (sample used to print yaml-cpp's "bad conversion" with exit 1, and blame a bad
// data.tokenizer on a --tokenizer never given).
TEST(SampleCli, ASavedConfigThatIsNotAGptsIsNamed) {
  test::TempDir t;
  manual_seed(0);
  nn::GPT model({.n_layer = 1, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 256});
  const std::string model_ok = "model: {kind: gpt, n_layer: 1, n_head: 2, n_embd: 16, "
                               "block_size: 8, vocab_size: 256}\n";
  int n = 0;
  auto refused = [&](const std::string& config, const std::string& words) {
    const std::string path = (t.path / ("m" + std::to_string(n++) + ".safetensors")).string();
    nn::save(model, path, {{"config", config}});
    expect_fails("sample --checkpoint " + path + " --tokens 2", 2, path + ": " + words);
  };
  refused("just text", "its config is not a YAML mapping");
  refused("model: 3", "its config's model is not a mapping");
  refused("model: {kind: gpt, n_layer: one}", "its config's model.n_layer is not a whole number");
  refused("model: {kind: gpt, bias: maybe}", "its config's model.bias is not true or false");
  refused("model: {kind: gpt, dropout: [1]}", "its config's model.dropout is not a number");
  refused(model_ok + "data: {kind: text, tokenizer: words}",
          "its config's data.tokenizer: unknown tokenizer 'words'");
  refused("model: {kind: gpt, n_layer: 1, n_head: 3, n_embd: 16, block_size: 8, vocab_size: 256}",
          "does not fit the GPT its config describes");
  // Sizes its weights do not have are refused before anything that large is allocated (an
  // AddressSanitizer build aborts on such an allocation).
  refused("model: {kind: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 8, "
          "vocab_size: 99999999999}", "does not fit the GPT its config describes: its "
          "transformer.wte.weight should be [100000000000, 16], the file's is [256, 16]");
  refused("model: {kind: gpt, n_layer: 100000000, n_head: 2, n_embd: 16, block_size: 8, "
          "vocab_size: 256}", "does not fit the GPT its config describes: its "
          "transformer.h.99999999.ln_1.weight should be [16], and the file has none");
}

// Finite weights whose logits overflow (every embedding 1e38, and ln_f's bias 1: each logit is
// 16 · 1e38) pass the load's checks and leave no distribution to draw from: exit 3, and nothing
// on stdout, as the first token was never drawn.
TEST(SampleCli, LogitsThatOverflowExitWithCode3) {
  test::TempDir t;
  const std::string path =
      save_tiny_gpt(t.path, 256, "{kind: text, tokenizer: bytes}", "huge", [](nn::GPT& m) {
        for (const auto& [name, p] : m.named_parameters()) {
          if (name == "transformer.wte.weight") p.detach().fill_(1e38);
          if (name == "transformer.ln_f.bias") p.detach().fill_(1);
        }
      });
  const std::string args = "sample --checkpoint " + path + " --prompt ab --tokens 3";
  expect_fails(args, 3, "sample: the logits at token 0 after the prompt are not finite");
  std::string stdout_only;
  EXPECT_EQ(test::run_train(args, &stdout_only, false), 3);
  EXPECT_EQ(stdout_only, "") << "printed before the first token was drawn";
}

// Logits that turn non-finite after a token was drawn: every embedding 3e38, so positions 0 and
// 1 (the prompt) hold rows of 3e38 that LayerNorm takes to its bias, 0, and logits of 0 (a
// uniform draw), while position 2's embedding adds another 3e38 and overflows. The text drawn so
// far stays, ended by exactly one newline: in a file, and on a terminal that shows the error
// too, where the error's own newline is that one (there was a blank line before the message).
TEST(SampleCli, AnErrorMidSampleEndsTheTextWithOneNewline) {
  test::TempDir t;
  const std::string path =
      save_tiny_gpt(t.path, 256, "{kind: text, tokenizer: bytes}", "late", [](nn::GPT& m) {
        for (const auto& [name, p] : m.named_parameters()) {
          if (name == "transformer.wte.weight") p.detach().fill_(3e38);
          if (name == "transformer.wpe.weight") p.detach().narrow(0, 2, 6).fill_(3e38);
        }
      });
  const std::string args = "sample --checkpoint " + path + " --prompt ab --tokens 3 --seed 1";
  const std::string error = "train: sample: the logits at token 1 after the prompt are not finite";
  expect_fails(args, 3, error);
  std::string text;
  EXPECT_EQ(test::run_train(args, &text, false), 3);
  ASSERT_EQ(text.size(), 4u) << "the prompt, the one token drawn, a newline: " << text;
  const char drawn = text[2];
  ASSERT_TRUE(drawn != '\n' && drawn != '\r') << "a drawn newline would hide the count below";
  EXPECT_EQ(text, std::string("ab") + drawn + "\n");
  const std::string screen = test::run_on_terminal(args);
  EXPECT_NE(screen.find(std::string("ab") + drawn + "\r\n" + error), std::string::npos) << screen;
}

TEST(TokenizeCli, WritesAShardTheReaderTakesAndRefusesBadInput) {
  test::TempDir t;
  const std::filesystem::path text = t.path / "a.txt", shard = t.path / "a.bin";
  std::ofstream(text) << "Hello world";
  std::string out;
  ASSERT_EQ(test::run_train("tokenize --input " + text.string() + " --output " + shard.string() +
                            " --gpt2-dir " MT_SOURCE_DIR "/assets/gpt2", &out), 0) << out;
  EXPECT_EQ(read_token_shard(shard.string()), (std::vector<uint16_t>{15496, 995}));
  ASSERT_EQ(test::run_train("tokenize --tokenizer bytes --input " + text.string() + " --output " +
                            shard.string(), &out), 0) << out;
  EXPECT_EQ(read_token_shard(shard.string()).size(), 11u);
  // <|endoftext|> is text unless --special allow makes it the end-of-text token, as llm.c puts
  // between documents; the bytes tokenizer has none.
  const std::filesystem::path docs = t.path / "docs.txt";
  std::ofstream(docs) << "a<|endoftext|>b";
  const std::string assets_dir = " --gpt2-dir " MT_SOURCE_DIR "/assets/gpt2";
  ASSERT_EQ(test::run_train("tokenize --input " + docs.string() + " --output " + shard.string() +
                            " --special allow" + assets_dir, &out), 0) << out;
  EXPECT_EQ(read_token_shard(shard.string()), (std::vector<uint16_t>{64, 50256, 65}));
  ASSERT_EQ(test::run_train("tokenize --input " + docs.string() + " --output " + shard.string() +
                            assets_dir, &out), 0) << out;
  const std::vector<uint16_t> plain = read_token_shard(shard.string());
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_GT(plain.size(), 3u);
  expect_fails("tokenize --input " + docs.string() + " --output " + shard.string() +
                   " --tokenizer bytes --special allow", 2,
               "the bytes tokenizer has no special tokens");
  expect_fails("tokenize --input " + docs.string() + " --output " + shard.string() +
                   " --special yes", 2, "--special: expected as-text or allow, got 'yes'");

  // Text that is not UTF-8 is refused by the GPT-2 tokenizer, naming the file and the offset.
  const std::filesystem::path bad = t.path / "bad.txt";
  std::ofstream(bad, std::ios::binary) << "ok \xff\xfe";
  expect_fails("tokenize --input " + bad.string() + " --output " + shard.string() +
                   " --gpt2-dir " MT_SOURCE_DIR "/assets/gpt2", 4, "bad.txt");
  // A vocabulary file that does not parse.
  const std::filesystem::path vocab = t.path / "vocab";
  std::filesystem::create_directories(vocab);
  std::ofstream(vocab / "encoder.json") << "{not json";
  std::ofstream(vocab / "vocab.bpe") << "#version: 0.2\n";
  expect_fails("tokenize --input " + text.string() + " --output " + shard.string() +
                   " --gpt2-dir " + vocab.string(), 4, "encoder.json");
  expect_fails("tokenize --input " + (t.path / "none.txt").string() + " --output " + shard.string() +
                   " --tokenizer bytes", 4, "none.txt");
  expect_fails("tokenize --input " + text.string() + " --output " + shard.string() +
                   " --tokenizer words", 2, "words");

  // The shard replaces its path whole: never the input, a link or a device (tokenize used to
  // overwrite its own input and replace a link with a file, exit 0). The input is a regular file:
  // a directory used to give an empty shard, a FIFO to wait forever.
  const std::string bytes = " --tokenizer bytes";
  expect_fails("tokenize --input " + text.string() + " --output " + text.string() + bytes, 2,
               "which this command reads");
  std::ifstream kept(text);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "Hello world");
  // Nor GPT-2's vocabulary files, which it reads too (it used to write the shard over them).
  const std::filesystem::path assets = t.path / "gpt2";
  std::filesystem::copy(MT_SOURCE_DIR "/assets/gpt2", assets);
  const auto merges_size = std::filesystem::file_size(assets / "vocab.bpe");
  for (const char* file : {"vocab.bpe", "encoder.json"})
    expect_fails("tokenize --input " + text.string() + " --output " + (assets / file).string() +
                     " --gpt2-dir " + assets.string(), 2, "which this command reads");
  EXPECT_EQ(std::filesystem::file_size(assets / "vocab.bpe"), merges_size);
  // Nor a file of a kind a training run keeps (it wrote a shard over a checkpoint, exit 0).
  const std::filesystem::path checkpoint = t.path / "step-000020.optim.safetensors";
  std::ofstream(checkpoint) << "kept";
  expect_fails("tokenize --input " + text.string() + " --output " + checkpoint.string() + bytes,
               2, "a .safetensors file is one a training run writes");
  EXPECT_EQ(std::filesystem::file_size(checkpoint), 4u);
  const std::filesystem::path link = t.path / "link.bin";
  std::filesystem::create_symlink(shard, link);
  expect_fails("tokenize --input " + text.string() + " --output " + link.string() + bytes, 2,
               "is a symbolic link");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  expect_fails("tokenize --input " + t.path.string() + " --output " + (t.path / "d.bin").string() +
                   bytes, 4, "is a directory");
  const std::filesystem::path fifo = t.path / "fifo.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_fails("tokenize --input " + fifo.string() + " --output " + (t.path / "f.bin").string() +
                   bytes, 4, "FIFO");
  EXPECT_FALSE(std::filesystem::exists(t.path / "d.bin"));
}

// Each bad input of a GPT run, end to end through `train`: a clear message naming the thing and
// the exit code docs/gpt.md's table gives (2: the config or command line; 4: a data file).
TEST(GptBadInput, TrainRefusesEachWithItsExitCode) {
  test::TempDir t;
  const std::filesystem::path text = t.path / "text.txt", cfg = t.path / "gpt.yaml";
  {
    std::ofstream out(text);
    for (int i = 0; i < 20; ++i) out << "To be, or not to be, that is the question.\n";
  }
  std::ofstream(cfg) << "model: {kind: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}\n"
                        "data: {kind: text, path: " << text.string() << "}\n"
                        "optim: {steps: 2, warmup_steps: 1, batch_size: 4, microbatches: 1}\n"
                        "device: cpu\n";
  const std::string run = "--config " + cfg.string() + " --set checkpoint.dir=" + (t.path / "ckpt").string();
  auto shard = [&](const std::string& name, std::vector<int32_t> header, std::vector<uint16_t> tokens) {
    const std::string path = (t.path / name).string();
    header.resize(256, 0);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(2 * tokens.size()));
    return path;
  };
  const std::vector<uint16_t> many(200, 65);
  // A shard whose header lies about its magic or its count; one with an id the model lacks.
  expect_fails(run + " --set data.kind=tokens --set data.path=" + shard("magic.bin", {20240521, 1, 200}, many),
               4, "field 'magic' (int 0) is 20240521, expected 20240520");
  expect_fails(run + " --set data.kind=tokens --set data.path=" + shard("count.bin", {20240520, 1, 300}, many),
               4, "field 'count' (int 2) says 300 tokens");
  std::vector<uint16_t> wide = many;
  wide[7] = 300;
  expect_fails(run + " --set data.kind=tokens --set data.path=" + shard("wide.bin", {20240520, 1, 200}, wide),
               4, "token 300 at position 7 is not below the vocabulary size 256");
  // A corpus shorter than T + 1 tokens (in its validation part); windows longer than the model's.
  expect_fails(run + " --set data.val_fraction=0.01", 2, "fewer than T + 1 = 17");
  expect_fails(run + " --set data.block_size=32", 2, "larger than the model's block_size 16");
  // A tokenizer with more ids than the model; text that is not UTF-8 for GPT-2's BPE; a
  // vocabulary file that does not parse.
  expect_fails(run + " --set data.tokenizer=gpt2 --set data.gpt2_dir=" MT_SOURCE_DIR "/assets/gpt2", 2,
               "model.vocab_size: is 256 but the gpt2 tokenizer has 50257 ids");
  const std::filesystem::path latin1 = t.path / "latin1.txt";
  std::ofstream(latin1, std::ios::binary) << std::string(40, 'a') << "caf\xe9 " << std::string(40, 'b');
  expect_fails(run + " --set model.vocab_size=50257 --set data.tokenizer=gpt2 --set data.gpt2_dir="
                   MT_SOURCE_DIR "/assets/gpt2 --set data.path=" + latin1.string(), 4, "latin1.txt");
  const std::filesystem::path vocab = t.path / "vocab";
  std::filesystem::create_directories(vocab);
  std::ofstream(vocab / "encoder.json") << "{\"a\": 0,";
  std::ofstream(vocab / "vocab.bpe") << "#version: 0.2\n";
  expect_fails(run + " --set model.vocab_size=50257 --set data.tokenizer=gpt2 --set data.gpt2_dir=" +
                   vocab.string(), 4, "encoder.json");
  EXPECT_FALSE(std::filesystem::exists(t.path / "ckpt/step-000002.safetensors"));

  // A prompt that is not UTF-8, for a model whose tokenizer is GPT-2's BPE.
  manual_seed(0);
  nn::GPT bpe({.n_layer = 1, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 50257});
  const std::string ckpt = (t.path / "bpe.safetensors").string();
  nn::save(bpe, ckpt, {{"config", "model: {kind: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 8, "
                                  "vocab_size: 50257}\ndata: {kind: text, tokenizer: gpt2, gpt2_dir: "
                                  MT_SOURCE_DIR "/assets/gpt2}\n"}});
  EXPECT_EQ(test::run_train("sample --checkpoint " + ckpt + " --prompt Hello --tokens 2", nullptr), 0);
  expect_fails("sample --checkpoint " + ckpt + " --prompt \"$(printf 'caf\\351')\" --tokens 2", 4,
               "--prompt: gpt2 tokenizer: the text is not valid UTF-8");
}

}  // namespace
