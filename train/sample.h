#pragma once
// Sampling text from a language model, one token at a time:
//
//   context = the last block_size tokens so far (the prompt, then what was sampled)
//   p       = softmax(logits[last position, :V] / temperature), restricted to the top_k largest
//   next    ~ p, drawn with a generator seeded by `seed`
//
// A pure function of (model, prompt, options) on one device (on_token only watches): the same
// seed gives the same tokens.
// Across devices the logits differ in their last bits, so a draw near a boundary of the
// cumulative distribution can differ. There is no KV cache: each token runs the model over the
// whole context (fine for the small models trained here; the cost grows with context · tokens).
#include <cstdint>
#include <functional>
#include <vector>

#include "nn/module.h"

namespace mt::train {

struct SampleOptions {
  int64_t tokens = 200;      // how many to generate
  double temperature = 1.0;  // > 0; lower is greedier
  int64_t top_k = 0;         // 0: the whole vocabulary; else in [1, vocab_size]
  uint64_t seed = 0;
  std::function<void(int32_t)> on_token = nullptr;  // if set, called with each token drawn
};

// `model` maps ids [1, T] int64 to logits [1, T, ≥ vocab_size] for T ≤ block_size; it runs in eval
// mode and without gradients. An empty prompt, temperature ≤ 0 (or not finite), top_k outside
// [0, vocab_size] or a negative token count is an mt::Error naming the value. A prompt longer
// than block_size is allowed: only its last block_size tokens are seen (as for every later token).
// Logits that leave no distribution to draw from (NaN, inf) are a NonFiniteError.
// Returns the generated tokens (without the prompt); on_token sees them one by one before that, so
// that a caller can print them as they come (a sampled text of thousands of tokens takes minutes).
std::vector<int32_t> sample(nn::Module& model, const std::vector<int32_t>& prompt,
                            int64_t vocab_size, int64_t block_size, const SampleOptions& options,
                            Device device);

// The checks sample() makes before it draws anything, for a caller that wants an option's error
// apart from the model's: an mt::Error naming the value.
void check_sample_options(const std::vector<int32_t>& prompt, int64_t vocab_size,
                          const SampleOptions& options);

}  // namespace mt::train
