#include "train/lm_task.h"

#include <cmath>
#include <numbers>

#include "nn/gpt.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/dropout/dropout.h"

namespace mt::train {

Tensor next_token_loss(const Tensor& logits, const Tensor& targets, int64_t vocab_size,
                       double normalizer) {
  MT_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
               logits.size(1) == targets.size(1) && logits.size(2) >= vocab_size,
           "next_token_loss: logits ", shape_str(logits.shape()), " do not fit targets ",
           shape_str(targets.shape()), " and a vocabulary of ", vocab_size);
  const int64_t rows = targets.numel();
  return cross_entropy(logits.reshape({rows, logits.size(2)}), targets.reshape({rows}), -100,
                       normalizer, /*valid_classes=*/vocab_size);
}

namespace {

// The microbatches (calls) a step's dropout masks are keyed for: 2^20.
constexpr int64_t kCallsPerStep = int64_t(1) << 20;

class LanguageModeling : public Task {
 public:
  LanguageModeling(int64_t vocab_size, double tokens_per_byte, DropoutKey key)
      : vocab_size_(vocab_size), tokens_per_byte_(tokens_per_byte), key_(std::move(key)) {}

  Tensor loss(nn::Module& model, const Batch& batch, double normalizer, Metrics* metrics) override {
    const int64_t T = batch.x.size(1);
    auto* gpt = dynamic_cast<nn::GPT*>(&model);
    if (gpt != nullptr && key_.step && model.is_training()) {
      // Microbatch m of step s draws its masks from call s · 2^20 + m, m numbered over all
      // ranks (rank r's first is r · microbatches) and counted modulo the step's microbatches (a
      // step run again draws its masks again): a pure function of the step, so a resumed
      // run draws what an uninterrupted one did, and N ranks of k microbatches draw what one
      // rank of N · k draws when the batch splits evenly. The step's part, s · 2^20 calls, is a
      // device word the first microbatch moves: set from the host when run eagerly, advanced by
      // one step on the device when recorded in a CUDA graph, so every replay draws the next
      // step's masks, the ones an eager step would (ops/dropout/dropout.h).
      const int64_t step = key_.step(), k = key_.microbatches ? key_.microbatches() : 0;
      microbatch_ = step == step_ && (k == 0 || microbatch_ + 1 < k) ? microbatch_ + 1 : 0;
      step_ = step;
      const int64_t call = (key_.first_microbatch ? key_.first_microbatch() : 0) + microbatch_;
      MT_CHECK(call < kCallsPerStep, "dropout: microbatch ", call, " of a step is past the ",
               kCallsPerStep, " a step's masks are keyed for");
      const uint64_t per_step = uint64_t(kCallsPerStep) * gpt->num_dropouts();  // offsets a step
      if (microbatch_ == 0) {
        if (!base_.defined() || base_.device() != batch.x.device())
          base_ = zeros({1}, DType::i64, batch.x.device());
        advance_dropout_base(base_, uint64_t(step) * per_step, per_step);
      }
      gpt->set_dropout_key(key_.seed, uint64_t(call), base_);
    }
    Tensor loss = next_token_loss(model(batch.x), batch.y, vocab_size_, normalizer * double(T));
    if (metrics != nullptr && tokens_per_byte_ > 0) {
      // Per window: its mean loss in bits per byte; the trainer divides the sum by the windows.
      const double window_sum = loss.item() * normalizer;
      (*metrics)["bpb"] += window_sum * tokens_per_byte_ / std::numbers::ln2;
    }
    return loss;
  }

  // Perplexity: exp of the mean loss (not the mean of each window's exp).
  void add_derived_metrics(double mean_loss, Metrics& means) const override {
    means["ppl"] = std::exp(mean_loss);
  }

 private:
  int64_t vocab_size_;
  double tokens_per_byte_;
  DropoutKey key_;
  int64_t step_ = -1, microbatch_ = 0;
  Tensor base_;  // the dropouts' device word: the current step's part of their offsets
};

}  // namespace

std::shared_ptr<Task> language_modeling(int64_t vocab_size, double tokens_per_byte,
                                        DropoutKey key) {
  return std::make_shared<LanguageModeling>(vocab_size, tokens_per_byte, std::move(key));
}

}  // namespace mt::train
