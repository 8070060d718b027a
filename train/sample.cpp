#include "train/sample.h"

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "core/error.h"
#include "core/rng.h"
#include "train/errors.h"

namespace mt::train {

void check_sample_options(const std::vector<int32_t>& prompt, int64_t vocab_size,
                          const SampleOptions& o) {
  MT_CHECK(!prompt.empty(), "sample: the prompt is empty; give at least one token (one character "
           "for a byte-level model)");
  MT_CHECK(std::isfinite(o.temperature) && o.temperature > 0, "sample: temperature must be a "
           "positive number, got ", o.temperature);
  MT_CHECK(o.top_k >= 0 && o.top_k <= vocab_size, "sample: top_k must be in [0, ", vocab_size,
           "] (0: no limit), got ", o.top_k);
  MT_CHECK(o.tokens >= 0, "sample: the token count must be at least 0, got ", o.tokens);
  for (int32_t t : prompt)
    MT_CHECK(t >= 0 && t < vocab_size, "sample: prompt token ", t, " is outside the vocabulary [0, ",
             vocab_size, ")");
}

std::vector<int32_t> sample(nn::Module& model, const std::vector<int32_t>& prompt,
                            int64_t vocab_size, int64_t block_size, const SampleOptions& o,
                            Device device) {
  check_sample_options(prompt, vocab_size, o);
  NoGradGuard no_grad;
  nn::EvalModeGuard eval_mode(model);
  Generator g(o.seed);
  std::vector<int32_t> context = prompt, out;
  std::vector<double> p(static_cast<size_t>(vocab_size));
  std::vector<int64_t> order(static_cast<size_t>(vocab_size));
  for (int64_t n = 0; n < o.tokens; ++n) {
    const int64_t T = std::min<int64_t>(int64_t(context.size()), block_size);
    std::vector<int64_t> ids(context.end() - T, context.end());
    Tensor logits = model(from_vector(ids, {1, T}, DType::i64, device));
    const int64_t Vp = logits.size(-1);
    std::vector<double> last = logits.reshape({T, Vp}).slice_rows(T - 1, T).to_vector();
    // Softmax over the first V logits at this temperature, in double, the largest logit taken
    // off before the division so that a tiny temperature cannot overflow; top_k keeps the k
    // largest (ties broken by the lower id, so the choice does not depend on the sort).
    const double top = *std::max_element(last.begin(), last.begin() + vocab_size);
    for (int64_t v = 0; v < vocab_size; ++v) p[size_t(v)] = (last[size_t(v)] - top) / o.temperature;
    if (o.top_k > 0 && o.top_k < vocab_size) {
      for (int64_t v = 0; v < vocab_size; ++v) order[size_t(v)] = v;
      std::nth_element(order.begin(), order.begin() + (o.top_k - 1), order.end(),
                       [&](int64_t a, int64_t b) {
                         return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
                       });
      const int64_t kth = order[size_t(o.top_k - 1)];
      const double cut = p[size_t(kth)];
      for (int64_t v = 0; v < vocab_size; ++v)
        if (p[size_t(v)] < cut || (p[size_t(v)] == cut && v > kth)) p[size_t(v)] = -INFINITY;
    }
    double total = 0;
    for (double& x : p) total += (x = std::exp(x));  // the largest is exp(0) = 1
    // A non-finite logit (a damaged model, an overflow) leaves no distribution to draw from.
    if (!(std::isfinite(total) && total > 0))
      throw NonFiniteError(detail::concat("sample: the logits at token ", n, " after the prompt "
                                          "are not finite (the largest is ", top, "): the model "
                                          "cannot be sampled"));
    double u = g.uniform() * total;
    int32_t next = 0;
    for (int64_t v = 0; v < vocab_size; ++v) {
      if (p[size_t(v)] == 0) continue;
      next = int32_t(v);
      if ((u -= p[size_t(v)]) < 0) break;
    }
    context.push_back(next);
    out.push_back(next);
    if (o.on_token) o.on_token(next);
  }
  return out;
}

}  // namespace mt::train
