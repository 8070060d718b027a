// A tiny model through the installed package's umbrella header: forward, backward and a few
// AdamW steps on the CPU. Exits non-zero unless every parameter got a finite, non-zero gradient
// and the loss went down.
#include <cmath>
#include <cstdio>

#include "minitrain.h"

using namespace mt;

int main() try {
  manual_seed(0);
  nn::Sequential model{nn::Linear(8, 16), nn::RMSNorm(16), nn::ScaledSiLU(), nn::Linear(16, 4)};
  const Tensor x = randn({32, 8});
  std::vector<int64_t> labels(32);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t(i % 4);
  const Tensor y = from_vector(labels, {32});

  optim::AdamW opt(model.parameters(), {.lr = 1e-2});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    Tensor loss = cross_entropy(model(x), y);
    loss.backward();
    last = loss.item();
    if (step == 0) {
      first = last;
      for (const auto& [name, p] : model.named_parameters()) {
        double sq = 0;
        for (double g : p.grad().to_vector()) sq += g * g;
        if (!std::isfinite(sq) || sq == 0) {
          std::fprintf(stderr, "consumer_train: %s has gradient norm^2 %g\n", name.c_str(), sq);
          return 1;
        }
      }
    }
    opt.step();
    opt.zero_grad();
  }
  std::printf("consumer_train: loss %.4f -> %.4f over 20 steps\n", first, last);
  if (!(last < first)) {
    std::fprintf(stderr, "consumer_train: the loss did not go down\n");
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "consumer_train: %s\n", e.what());
  return 1;
}
