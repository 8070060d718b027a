// scaled_silu: the Function (the graph node's contract) and the CPU reference kernels.
// The math, the saved-vs-recomputed choice and the grids are in scaled_silu.h.
#include "ops/scaled_silu/scaled_silu.h"

#include <cmath>

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"

namespace mt {
namespace {

struct ScaledSiLUFn : Function<ScaledSiLUFn> {
  static constexpr const char* name = "scaled_silu";

  static Tensor forward(Context& ctx, const Tensor& x, const Tensor& w, bool inplace) {
    MT_CHECK(w.numel() == 1, "scaled_silu: w must have exactly one element, got shape ",
             shape_str(w.shape()));
    MT_CHECK(x.device() == w.device(), "scaled_silu: x is on ", x.device().str(), " but w is on ",
             w.device().str());
    MT_CHECK(w.dtype() == grad_dtype_for(x.dtype()), "scaled_silu: w must be ",
             dtype_name(grad_dtype_for(x.dtype())), " for ", dtype_name(x.dtype()), " x, got ",
             dtype_name(w.dtype()));
    Tensor xc = x.contiguous();
    Tensor wc = w.contiguous();
    Tensor y;
    if (inplace) {
      MT_CHECK(!ctx.needs_input_grad(0) && !ctx.needs_input_grad(1), "scaled_silu: inplace=true "
               "while a gradient is needed would overwrite x, which backward needs; use "
               "inplace=false (or run under NoGradGuard)");
      MT_CHECK(x.is_contiguous(), "scaled_silu: inplace=true needs a contiguous x, got strides ",
               shape_str(x.strides()), " for shape ", shape_str(x.shape()));
      y = x;
    } else {
      y = empty(x.shape(), x.dtype(), x.device());
    }
    kernel<ScaledSiLUForwardFn>(name, Phase::Forward, x.device())(xc, wc, y);
    if (inplace) y.bump_version();
    ctx.save_for_backward({xc, wc});
    return y;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    auto saved = ctx.saved_tensors();
    const Tensor &x = saved[0], &w = saved[1];
    Tensor dy = dys[0].contiguous();  // upstream gradients may be strided views
    Tensor dx, dw, sink;
    if (ctx.needs_input_grad(0)) dx = empty(x.shape(), x.dtype(), x.device());
    if (ctx.needs_input_grad(1)) {
      sink = ctx.grad_sink(1);  // w's .grad when w is a leaf: the kernel adds straight into it
      dw = sink.defined() ? sink : zeros(w.shape(), w.dtype(), w.device());
    }
    kernel<ScaledSiLUBackwardFn>(name, Phase::Backward, x.device())(x, w, dy, dx, dw);
    if (sink.defined()) dw = Tensor();  // already added into .grad
    return {dx, dw, Tensor()};  // one per forward argument: x, w, inplace (not differentiable)
  }
};

// ---- CPU reference kernels ----------------------------------------------------------------

void forward_cpu(const Tensor& x, const Tensor& w, const Tensor& y) {
  MT_DISPATCH_FLOATING(x.dtype(), "scaled_silu", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const scalar_t* xp = x.data<scalar_t>();
    scalar_t* yp = y.data<scalar_t>();
    const acc wv = acc(w.item());
    for (int64_t i = 0; i < x.numel(); ++i) {
      acc xv = cpu::to_acc(xp[i]);
      acc s = acc(1) / (acc(1) + std::exp(-xv));
      yp[i] = cpu::from_acc<scalar_t>(wv * xv * s);
    }
  });
}

// Accumulation: dx '=' (x's dtype, math in acc_t: f32, or f64 for f64 x); dw '+=' into w's
// .grad (the grad sink) or fresh zeros, in the grad dtype, the sum taken in double in index order.
void backward_cpu(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                  const Tensor& dw) {
  MT_DISPATCH_FLOATING(x.dtype(), "scaled_silu", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const scalar_t* xp = x.data<scalar_t>();
    const scalar_t* dyp = dy.data<scalar_t>();
    scalar_t* dxp = dx.defined() ? dx.data<scalar_t>() : nullptr;
    const acc wv = acc(w.item());
    double dw_sum = 0;  // the reference sums in double: it is the oracle the GPU is checked against
    for (int64_t i = 0; i < x.numel(); ++i) {
      acc xv = cpu::to_acc(xp[i]), g = cpu::to_acc(dyp[i]);
      acc s = acc(1) / (acc(1) + std::exp(-xv));  // recomputed, not saved
      if (dxp) dxp[i] = cpu::from_acc<scalar_t>(g * wv * (s + xv * s * (acc(1) - s)));
      dw_sum += double(g) * double(xv) * double(s);
    }
    if (dw.defined()) {
      // '+=': dw is w's .grad when it is a sink; a store here would drop earlier microbatches.
      double prev = dw.item();
      dw.fill_(prev + dw_sum);
    }
  });
}

}  // namespace

Tensor scaled_silu(const Tensor& x, const Tensor& w, bool inplace) {
  return ScaledSiLUFn::apply(x, w, inplace);
}

MT_DEFINE_OP(scaled_silu, "y = w*x*sigmoid(x); dx = dy*w*(s + x*s*(1-s)), dw += sum(dy*x*s)",
             ScaledSiLUForwardFn, ScaledSiLUBackwardFn);
MT_REGISTER_KERNEL(scaled_silu, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL(scaled_silu, Backward, CPU, backward_cpu);

}  // namespace mt
