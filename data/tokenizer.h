#pragma once
// Tokenizers: text (bytes) to token ids and back. Two kinds, chosen by name:
//
//   bytes  every byte is its own token: 256 ids, any input, no vocabulary files
//   gpt2   GPT-2's byte-level BPE (data/bpe.h): 50,257 ids, read from encoder.json and vocab.bpe
//
// Both are immutable once built, so one tokenizer may serve several threads. decode() returns
// bytes, not necessarily UTF-8: a GPT-2 token can hold part of a character, so ids cut at an
// arbitrary place (a sampled continuation) decode to the bytes they stand for and the caller
// decides what to do with a broken character at the end.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

// What encode() does with the text of a special token ("<|endoftext|>") found in its input.
enum class Special {
  as_text,  // tokenized like any other text, as GPT-2's own encoder does: data cannot forge one
  allow,    // becomes the special token's id
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::string name() const = 0;
  // Ids are 0 .. vocab_size() - 1.
  virtual int32_t vocab_size() const = 0;
  // The id that ends a document (GPT-2's "<|endoftext|>"), if the tokenizer has one.
  virtual std::optional<int32_t> end_of_text() const = 0;

  // Throws mt::Error for text the tokenizer cannot take (GPT-2: text that is not valid UTF-8,
  // naming the byte offset).
  virtual std::vector<int32_t> encode(std::string_view text,
                                      Special special = Special::as_text) const = 0;
  // The bytes the ids stand for, concatenated. Throws mt::Error naming an id outside the
  // vocabulary and its position.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
};

// The byte-level tokenizer: id = byte value. It has no special tokens, so `special` changes
// nothing, and decode(encode(x)) == x for every byte string.
class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "bytes"; }
  int32_t vocab_size() const override { return 256; }
  std::optional<int32_t> end_of_text() const override { return std::nullopt; }
  std::vector<int32_t> encode(std::string_view text,
                              Special special = Special::as_text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
};

// The tokenizer called `name` ("bytes" or "gpt2"). `gpt2_dir` is the folder holding GPT-2's
// encoder.json and vocab.bpe, read only for "gpt2". Throws mt::Error for another name, listing
// the known ones.
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name, const std::string& gpt2_dir);

}  // namespace mt
