#pragma once
// Token data as a trainer's data source (data/source.h): `data.kind: text` (a text file through
// a tokenizer) and `data.kind: tokens` (llm.c shards) both become one TokenStream cut into
// windows (data/token_windows.h). A sample is a window: x and y are int64 [n, T], y the next
// tokens of x.
//
//   step s, rank r of N:   starts = step_window_starts(training windows, B, seed, s)
//                          rank r takes its contiguous shard of the B starts (sizes differ by
//                          at most one), split into `microbatches` parts
//   validation:            `eval_windows` starts spread evenly over the held-out tail, or
//                          with 0 the windows that tile it (each token a target once)
//
// So batches are a pure function of (seed, step), N ranks together see what one rank sees, and a
// resumed run sees what an uninterrupted one would.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/source.h"
#include "data/token_windows.h"

namespace mt::data {

struct TokenSourceOptions {
  int64_t block_size = 64;     // T: tokens per window
  int64_t batch_size = 32;     // windows per optimizer step, over all ranks
  int64_t microbatches = 1;    // per rank
  double val_fraction = 0.1;   // the held-out tail of the stream
  int64_t eval_windows = 256;  // validation windows (0: the held-out part tiled, T apart)
  uint64_t seed = 1;
};

class TokenSource : public Source {
 public:
  // Errors (mt::Error naming the value): a split shorter than T + 1 tokens, batch_size < 1,
  // microbatches outside [1, batch_size].
  TokenSource(TokenStream stream, std::string tokenizer, const TokenSourceOptions& options);
  // Its windows refer to its own stream: a copy or a move would leave them on the old one.
  TokenSource(const TokenSource&) = delete;
  TokenSource& operator=(const TokenSource&) = delete;

  std::string name() const override;
  std::vector<std::string> describe() const override;
  void shard(int rank, int world) override;
  // One pass over the training data: its tokens / T windows.
  int64_t size() const override;
  int64_t batch_size() const override { return o_.batch_size; }
  int64_t shard_size() const override { return shard_size_; }
  int64_t microbatches() const override { return o_.microbatches; }
  int64_t steps_per_epoch() const override;
  std::vector<Batch> step_batches(int64_t step, Device device) const override;
  int64_t held_out_size(HeldOut which) const override;
  void for_each_held_out(HeldOut which, int64_t batch_size, Device device,
                         const std::function<void(const Batch&)>& visit) const override;
  std::map<std::string, std::string> metadata() const override;

  // tokens / bytes of the text (0 when unknown): the bits-per-byte factor.
  double tokens_per_byte() const;
  // The step of the last step_batches call (-1 before the first): the language-modelling task
  // keys dropout by it, so masks are a pure function of the step too.
  int64_t last_step() const { return last_step_; }
  // This rank's first microbatch in the step's numbering over all ranks, rank · microbatches:
  // the task keys dropout by it too, so no two ranks draw the same masks.
  int64_t first_microbatch() const { return rank_ * o_.microbatches; }

 private:
  // The validation windows' starts: eval_windows spread evenly, or with 0 the tiling.
  std::vector<int64_t> validation_starts() const;

  TokenStream stream_;
  std::string tokenizer_;
  TokenSourceOptions o_;
  std::unique_ptr<TokenWindows> train_, val_;
  int64_t rank_ = 0, shard_begin_ = 0, shard_size_ = 0;
  mutable int64_t last_step_ = -1;
};

}  // namespace mt::data
