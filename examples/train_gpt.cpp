// Trains a small byte-level GPT on a text file with a hand-written loop, then samples from it:
//
//   build/train_gpt assets/tinyshakespeare.txt [steps] [model.safetensors]
//
// Given a model file, it saves the trained model there with its config, so `train sample
// --checkpoint model.safetensors` samples from it.
//
// The pieces the `train` program puts together for `data.kind: text` and `model.kind: gpt`:
// the text's bytes as tokens, windows of T + 1 tokens drawn from (seed, step), the last 10% held
// out for validation, AdamW with warmup + cosine, microbatches that add up to the full batch.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/autograd.h"
#include "core/rng.h"
#include "data/token_windows.h"
#include "nn/gpt.h"
#include "nn/serialize.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "train/lm_task.h"
#include "train/sample.h"

using namespace mt;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TEXT_FILE [steps] [MODEL_FILE]\n", argv[0]);
    return 2;
  }
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 600;
  const int64_t T = 64, batch = 32, k = 2, micro = batch / k;
  ByteTokenizer bytes;
  const data::TokenStream text = data::tokenize_text_file(argv[1], bytes);
  const int64_t split = data::validation_begin(int64_t(text.tokens.size()), 0.1);
  const data::TokenWindows train(text, 0, split, T, "training split");
  const data::TokenWindows val(text, split, int64_t(text.tokens.size()), T, "validation split");

  manual_seed(0);
  const nn::GPTConfig config{.n_layer = 4, .n_head = 4, .n_embd = 128, .block_size = T,
                             .vocab_size = 256};
  nn::GPT model(config);
  std::printf("%lld parameters\n", (long long)model.num_parameters());
  optim::AdamW opt(optim::Optimizer::decay_groups(model, 0.1),
                   {.lr = 2e-3, .betas = {0.9, 0.99}, .weight_decay = 0.1});
  optim::WarmupCosineLR schedule(2e-3, std::min<int64_t>(50, steps), steps, 2e-4);

  auto validation_loss = [&] {
    NoGradGuard no_grad;
    model.eval();
    auto [x, y] = val.gather(val.evenly_spaced(128), kCPU);
    const double loss = train::next_token_loss(model(x), y, 256, double(x.numel())).item();
    model.train();
    return loss;
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    opt.set_lr(schedule.lr_at(step));
    const std::vector<int64_t> starts = data::step_window_starts(train.windows(), batch, 1, step);
    double step_loss = 0;
    for (int64_t i = 0; i < k; ++i) {
      auto [x, y] = train.gather({starts.begin() + i * micro, starts.begin() + (i + 1) * micro}, kCPU);
      Tensor loss = train::next_token_loss(model(x), y, 256, double(batch * T));
      loss.backward();
      step_loss += loss.item();
    }
    optim::clip_grad_norm_(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step % 50 == 0 || step + 1 == steps)
      std::printf("step %4lld  loss %.4f  %.1f s\n", (long long)step, step_loss, secs);
    if ((step + 1) % 200 == 0 || step + 1 == steps)
      std::printf("step %4lld  val_loss %.4f\n", (long long)step + 1, validation_loss());
  }
  if (argc > 3) {
    const std::string yaml = "model: {kind: gpt, n_layer: 4, n_head: 4, n_embd: 128, block_size: " +
                             std::to_string(T) + ", vocab_size: 256}\ndata: {kind: text, tokenizer: bytes}\n";
    nn::save(model, argv[3], {{"config", yaml}});
  }
  const std::string prompt = "ROMEO:";
  std::vector<int32_t> ids = bytes.encode(prompt);
  std::vector<int32_t> out = train::sample(model, ids, 256, T, {.tokens = steps < 100 ? 20 : 300, .temperature = 0.8, .top_k = 40, .seed = 1}, kCPU);
  std::printf("%s%s\n", prompt.c_str(), bytes.decode(out).c_str());
  return 0;
}
