#pragma once
// Language-model data: a stream of token ids cut into windows of T + 1 consecutive tokens. A
// window starting at s gives the inputs x = tokens[s, s + T) and the targets y = tokens[s + 1,
// s + T + 1): every position predicts the next token.
//
//   tokens   [ ...................... train ...................... | ...... validation ...... ]
//                 ^ s (drawn from seed, step)                        ^ evenly spaced starts
//
// Split by position, not by window: the first (1 − val_fraction) of the stream trains, the rest
// is held out, so no validation token is ever inside a training window (windows overlapping the
// boundary are never drawn).
//
// Training batches are a pure function of (seed, step): step s's B window starts are drawn
// uniformly, with replacement, from a generator seeded by (seed, s), so a resumed run sees
// exactly the batches of an uninterrupted run, with no loader state to save. Data parallelism
// cuts that same global batch into `world` contiguous shards (the MLP loader's rule, sizes
// differing by at most one), so N ranks together see what one rank sees. Validation takes
// `windows` starts evenly spread over the held-out part (the same every time).
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/tokenizer.h"

namespace mt::data {

// Token ids in memory, with what they encode.
struct TokenStream {
  std::vector<int32_t> tokens;
  int64_t vocab_size = 0;  // every id is in [0, vocab_size)
  int64_t text_bytes = 0;  // bytes of text the tokens encode (0: unknown): bits per byte
  std::string source;      // the file(s) it came from, for messages
};

// The tokens of the text file at `path` by `tokenizer`, with its byte count; `special` says what
// "<|endoftext|>" in the text becomes (data/tokenizer.h). A file that cannot be read is an
// mt::Error naming it; so is text the tokenizer refuses (the message names the file and the
// tokenizer's reason: GPT-2's BPE takes only valid UTF-8 and names the byte offset).
TokenStream tokenize_text_file(const std::string& path, const Tokenizer& tokenizer,
                               Special special = Special::as_text);

// The tokens of llm.c shards (data/token_shards.h), concatenated in order, each id checked against
// vocab_size (an mt::Error naming the file, the position and the id). The source says
// "first … last (N shards)" for more than one.
TokenStream read_token_shards(const std::vector<std::string>& paths, int64_t vocab_size);

// The positions [begin, end) of a token stream (a split) as windows of T + 1 tokens.
class TokenWindows {
 public:
  // Needs at least T + 1 tokens in [begin, end) (an mt::Error naming `what`, the source, the
  // token count and T otherwise).
  TokenWindows(const TokenStream& stream, int64_t begin, int64_t end, int64_t T,
               const std::string& what);
  int64_t windows() const { return end_ - begin_ - T_; }  // starts in [begin, end − T)
  int64_t T() const { return T_; }

  // Inputs and targets of the windows starting at begin + starts[i]: x and y [n, T] int64.
  std::pair<Tensor, Tensor> gather(const std::vector<int64_t>& starts, Device device) const;
  // `count` starts spread evenly over the windows (all of them when there are fewer).
  std::vector<int64_t> evenly_spaced(int64_t count) const;
  // The windows that tile the split, 0, T, 2T, ...: each token a target once, as llm.c reads its
  // validation split (a tail of fewer than T targets fills no window and is left out).
  std::vector<int64_t> tiling() const;

 private:
  const TokenStream& stream_;
  int64_t begin_, end_, T_;
};

// The B window starts of optimizer step `step` for a split of `windows` windows.
std::vector<int64_t> step_window_starts(int64_t windows, int64_t batch, uint64_t seed, int64_t step);

// The first position of the validation part: size − round(val_fraction · size).
int64_t validation_begin(int64_t size, double val_fraction);

}  // namespace mt::data
