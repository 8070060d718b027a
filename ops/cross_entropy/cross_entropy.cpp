// cross_entropy: the Function (the graph node's contract) and the CPU reference kernels.
// The math, the normalizer's role and what is saved are in cross_entropy.h.
#include "ops/cross_entropy/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"
#include "ops/cross_entropy/bad_target.h"

namespace mt {
namespace {

struct CrossEntropyFn : Function<CrossEntropyFn> {
  static constexpr const char* name = "cross_entropy";

  static Tensor forward(Context& ctx, const Tensor& logits, const Tensor& targets,
                        int64_t ignore_index, double normalizer, int64_t valid_classes) {
    MT_CHECK(logits.dim() == 2 && logits.size(1) >= 1 && is_floating(logits.dtype()),
             "cross_entropy: logits must be floating-point [rows, C] with C >= 1, got shape ",
             shape_str(logits.shape()), " ", dtype_name(logits.dtype()));
    MT_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), "cross_entropy: targets has "
             "shape ", shape_str(targets.shape()), " but logits has shape ",
             shape_str(logits.shape()), "; targets must be [", logits.size(0), "], one per row");
    MT_CHECK(targets.dtype() == DType::i64, "cross_entropy: targets (shape ",
             shape_str(targets.shape()), ") must be i64, got ", dtype_name(targets.dtype()));
    MT_CHECK(logits.device() == targets.device(), "cross_entropy: logits (shape ",
             shape_str(logits.shape()), ") is on ", logits.device().str(), " but targets (shape ",
             shape_str(targets.shape()), ") is on ", targets.device().str());
    MT_CHECK(std::isfinite(normalizer), "cross_entropy: normalizer must be finite, got ",
             normalizer);
    const int64_t C = logits.size(1);
    MT_CHECK(valid_classes >= 0 && valid_classes <= C, "cross_entropy: valid_classes must be in "
             "[1, C] (0 for all C), got ", valid_classes, " for logits of shape ",
             shape_str(logits.shape()));
    const int64_t valid = valid_classes == 0 ? C : valid_classes;
    const DType grad_dtype = grad_dtype_for(logits.dtype());
    Tensor lc = logits.contiguous(), tc = targets.contiguous();
    Tensor loss = empty({}, grad_dtype, logits.device());
    Tensor lse = empty({logits.size(0)}, grad_dtype, logits.device());
    kernel<CrossEntropyForwardFn>(name, Phase::Forward, logits.device())(lc, tc, ignore_index,
                                                                         normalizer, valid, loss,
                                                                         lse);
    ctx.set("ignore_index", ignore_index);
    ctx.set("valid", valid);
    ctx.set("normalizer", normalizer);
    ctx.save_for_backward({lc, tc, lse});
    return loss;
  }

  static GradList backward(Context& ctx, const GradList& dloss) {
    auto saved = ctx.saved_tensors();
    const Tensor &logits = saved[0], &targets = saved[1], &lse = saved[2];
    Tensor dlogits = empty(logits.shape(), logits.dtype(), logits.device());
    kernel<CrossEntropyBackwardFn>(name, Phase::Backward, logits.device())(
        logits, targets, lse, dloss[0], ctx.get<int64_t>("ignore_index"),
        ctx.get<double>("normalizer"), ctx.get<int64_t>("valid"), dlogits);
    // One per forward argument: logits; targets, ignore_index, normalizer, valid_classes (no
    // gradient).
    return {dlogits, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// ---- CPU reference kernels ----------------------------------------------------------------
// lse and loss are acc_t<scalar_t>: the grad dtype (f32, f64 for f64 logits).

// normalizer <= 0 stands for the number of non-ignored targets in this call.
double resolve_normalizer(const Tensor& targets, int64_t ignore_index, double normalizer) {
  if (normalizer > 0) return normalizer;
  const int64_t* t = targets.data<int64_t>();
  auto kept = [&](int64_t v) { return v != ignore_index; };
  return double(std::count_if(t, t + targets.numel(), kept));
}

// Columns c >= valid are padding: left out of lse, never a target.
void forward_cpu(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                 double normalizer, int64_t valid, const Tensor& loss, const Tensor& lse) {
  MT_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t rows = logits.size(0), C = logits.size(1);
    const int64_t* tp = targets.data<int64_t>();
    acc* lsep = lse.data<acc>();
    double total = 0;  // the reference reduces in double: it is the oracle for the GPU
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* row = logits.data<scalar_t>() + r * C;
      acc m = cpu::to_acc(row[0]);
      for (int64_t c = 1; c < valid; ++c) m = std::max(m, cpu::to_acc(row[c]));
      // Max-subtracted: every term is in [0, 1]. A logit equal to the max counts 1 without the
      // subtraction, so a row whose max is +inf gives lse = +inf and a row of -inf gives -inf
      // (inf - inf would be NaN): the limits, as the CUDA kernel computes them.
      double sum_exp = 0;
      for (int64_t c = 0; c < valid; ++c) {
        const acc x = cpu::to_acc(row[c]);
        sum_exp += x == m ? 1.0 : double(std::exp(x - m));
      }
      const acc l = m + acc(std::log(sum_exp));
      lsep[r] = l;
      const int64_t t = tp[r];
      if (t == ignore_index) continue;
      if (t < 0 || t >= valid) MT_THROW(bad_target_message(r, t, valid, ignore_index));
      total += double(l - cpu::to_acc(row[t]));
    }
    const double n = resolve_normalizer(targets, ignore_index, normalizer);
    loss.data<acc>()[0] = n > 0 ? acc(total / n) : acc(0);  // every target ignored: 0, not NaN
  });
}

// Accumulation: dlogits '=' (a new tensor in logits' dtype, math in acc_t; 0 in the padding
// columns); nothing here adds into a .grad: the engine does that when logits is a leaf.
void backward_cpu(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                  const Tensor& dloss, int64_t ignore_index, double normalizer, int64_t valid,
                  const Tensor& dlogits) {
  MT_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t rows = logits.size(0), C = logits.size(1);
    const int64_t* tp = targets.data<int64_t>();
    const acc* lsep = lse.data<acc>();
    const double n = resolve_normalizer(targets, ignore_index, normalizer);
    const acc scale = n > 0 ? acc(dloss.item() / n) : acc(0);
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* row = logits.data<scalar_t>() + r * C;
      scalar_t* out = dlogits.data<scalar_t>() + r * C;
      const int64_t t = tp[r];
      for (int64_t c = 0; c < C; ++c) {
        const acc p = std::exp(cpu::to_acc(row[c]) - lsep[r]);  // softmax, recomputed
        const acc g = t == ignore_index || c >= valid ? acc(0)
                                                      : scale * (p - (c == t ? acc(1) : acc(0)));
        out[c] = cpu::from_acc<scalar_t>(g);
      }
    }
  });
}

}  // namespace

std::string bad_target_message(int64_t row, int64_t target, int64_t classes, int64_t ignore_index) {
  return detail::concat("cross_entropy: row ", row, " has target ", target, ", outside [0, ",
                        classes, ") for C = ", classes, " classes (and not ignore_index ",
                        ignore_index, ")");
}

void raise_bad_target(BadTargetRecord& r) {
  if (r.row < 0) return;
  const BadTargetRecord bad = r;
  r.row = -1;  // reported once: the next check starts clean
  MT_THROW(bad_target_message(bad.row, bad.target, bad.classes, bad.ignore_index));
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     double normalizer, int64_t valid_classes) {
  return CrossEntropyFn::apply(logits, targets, ignore_index, normalizer, valid_classes);
}

MT_DEFINE_OP(cross_entropy,
               "loss = sum(lse - x[t]) / n; dx = dloss/n * (softmax(x) - onehot(t))",
             CrossEntropyForwardFn, CrossEntropyBackwardFn);
MT_REGISTER_KERNEL(cross_entropy, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL(cross_entropy, Backward, CPU, backward_cpu);

}  // namespace mt
