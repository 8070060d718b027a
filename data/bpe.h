#pragma once
// GPT-2's byte-level BPE tokenizer, matching OpenAI's encoder token for token.
//
// Encoding runs in three steps:
//
// 1. Pre-tokenize. The text, read as UTF-8, is cut into pieces by GPT-2's regex
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//    matched leftmost-first at each position, then from where the match ended. It is written out
//    by hand (gpt2_split): std::regex knows no \p{L}. A piece is one contraction, or a run of
//    letters, of numbers, or of other characters, each with at most one space before it, or a run
//    of whitespace, which leaves its last character to the piece after it (" world" keeps its
//    space) unless the run ends the text or is one character long. \p{L} and \p{N} are the
//    Unicode letter and number categories (data/unicode_tables.h, generated); \s is Unicode's
//    White_Space property, as in the regex module GPT-2's encoder used.
//
// 2. Map bytes to symbols. Each piece's UTF-8 bytes become one symbol per byte. The vocabulary
//    spells its tokens in GPT-2's byte alphabet: byte b is the character U+00b when that is
//    printable (! to ~, ¡ to ¬, ® to ÿ) and otherwise U+0100 + n for the n-th remaining byte
//    (space is "Ġ", newline "Ċ"), so every token is a printable string.
//
// 3. Merge. In each piece, the adjacent pair ranked first in vocab.bpe (lowest rank) is merged,
//    every occurrence left to right, and again, until no adjacent pair has a rank. The merged
//    symbols' ids (encoder.json) are the piece's tokens.
//
// Decoding concatenates each id's bytes. decode(encode(x)) == x for every valid UTF-8 x.
//
// Text that is not valid UTF-8 (a stray byte, a cut-off, overlong or surrogate sequence, a value
// past U+10FFFF) is refused with an mt::Error naming the byte offset and line. GPT-2's encoder
// takes text, not bytes: Python refuses such a file when decoding it, so the reference has no
// tokens to match. The `bytes` tokenizer (data/tokenizer.h) takes any bytes.
//
// Cost. A piece is merged with a heap over its adjacent pairs, O(n log n) in its length, so one
// huge run (a megabyte of '=') costs no more than ordinary text. Pieces repeat (" the", ","):
// encode() remembers each distinct piece's tokens for the length of the call, with no state
// shared between calls, so one tokenizer may encode on several threads at once.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace mt {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Reads GPT-2's vocabulary (encoder.json: token -> id, ids 0 .. V-1, each byte's one-symbol
  // token among them, "<|endoftext|>" the end-of-text token) and merges (vocab.bpe: a
  // "#version" line, then one merge per line, "left right", first rank first). Throws mt::Error
  // naming the file and the token or line for a file that does not parse, a token outside the
  // byte alphabet, a missing or repeated id, a merge of tokens the vocabulary lacks, or a merge
  // that uses a token before an earlier merge makes it.
  Gpt2Tokenizer(const std::string& encoder_json, const std::string& vocab_bpe);

  std::string name() const override { return "gpt2"; }
  int32_t vocab_size() const override { return int32_t(token_bytes_.size()); }
  std::optional<int32_t> end_of_text() const override { return end_of_text_; }
  // Special::allow turns each "<|endoftext|>" in the text into end_of_text() and encodes the
  // text between them as usual.
  std::vector<int32_t> encode(std::string_view text,
                              Special special = Special::as_text) const override;
  std::string decode(std::span<const int32_t> ids) const override;

  int64_t merge_count() const { return int64_t(merges_.size()); }

 private:
  struct Merge {
    int32_t rank, id;
  };
  void merge_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> token_bytes_;  // id -> the bytes it stands for
  int32_t byte_token_[256];               // byte -> the id of its one-byte token
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank, merged id
  int32_t end_of_text_ = -1;
};

// GPT-2's pre-tokenizer alone (step 1 above): the pieces of `text`, views into it, in order.
// Throws mt::Error for text that is not valid UTF-8, as encode() does.
std::vector<std::string_view> gpt2_split(std::string_view text);

}  // namespace mt
