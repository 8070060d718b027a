#pragma once
// Language modelling: next-token prediction with cross-entropy, the task a GPT trains on.
//
//   logits = model(x)                      x [n, T] int64 ids → logits [n, T, V_padded]
//   loss   = Σ_{rows, positions} CE(logits[..., :V], y) / (normalizer · T)
//
// The trainer's normalizer counts the step's windows over all microbatches and ranks, so the
// divisor is the step's total count of targets: k microbatches' backward passes add up to the
// gradient of the full batch's mean loss, exactly as for the MLP (docs/README.md). Only the first
// V of the padded vocabulary's logits enter the softmax: ids ≥ V never occur, and their logits
// get no gradient.
//
// Metrics: "bpb", bits per byte of text, when the data knows how many bytes its tokens encode:
// loss / ln 2 · tokens / bytes, which compares models with different tokenizers (a byte-level
// model has tokens / bytes = 1); "ppl", perplexity, exp of the mean loss (Task::add_derived_metrics:
// it is not a mean over windows), for the logged batch and for validation ("val_ppl").
#include <functional>
#include <memory>

#include "train/task.h"

namespace mt::train {

// How a GPT's dropout masks are keyed in training (nn::GPT::set_dropout_key): `step` returns the
// optimizer step whose microbatches are being run (data::TokenSource::last_step),
// `first_microbatch` this rank's first microbatch in the step's numbering over all ranks
// (data::TokenSource::first_microbatch; none: 0), and `microbatches` how many the step has on
// this rank (none: no limit), so that a step run again (the trainer's replay of a step that went
// non-finite, train/forensics.h) draws its masks again. No `step`: the model's dropouts keep
// whatever key they have.
struct DropoutKey {
  uint64_t seed = 0;
  std::function<int64_t()> step;
  std::function<int64_t()> first_microbatch;
  std::function<int64_t()> microbatches;
};

// vocab_size: the number of real token ids V; tokens_per_byte: tokens / bytes of the text
// (0: unknown, no "bpb" metric).
std::shared_ptr<Task> language_modeling(int64_t vocab_size, double tokens_per_byte,
                                        DropoutKey key = {});

// The per-token cross-entropy of logits [n, T, ≥ V] against targets [n, T] over the first V
// classes, summed and divided by `normalizer`.
Tensor next_token_loss(const Tensor& logits, const Tensor& targets, int64_t vocab_size,
                       double normalizer);

}  // namespace mt::train
