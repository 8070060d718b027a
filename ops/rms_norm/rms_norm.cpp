// rms_norm: the Function (the graph node's contract) and the CPU reference kernels.
// The math and the saved-vs-recomputed choice are in rms_norm.h.
#include "ops/rms_norm/rms_norm.h"

#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"

namespace mt {
namespace {

// x [..., d] as [rows, d] (a view of a contiguous x).
Tensor as_rows(const Tensor& t) { return t.view({t.numel() / t.size(-1), t.size(-1)}); }

struct RMSNormFn : Function<RMSNormFn> {
  static constexpr const char* name = "rms_norm";

  static Tensor forward(Context& ctx, const Tensor& x, const Tensor& weight, double eps) {
    MT_CHECK(x.dim() >= 1 && x.size(-1) > 0 && is_floating(x.dtype()), "rms_norm: x must be a "
             "floating-point tensor with a non-empty last dimension, got shape ",
             shape_str(x.shape()), " ", dtype_name(x.dtype()));
    const int64_t d = x.size(-1);
    MT_CHECK(weight.dim() == 1 && weight.size(0) == d, "rms_norm: weight has shape ",
             shape_str(weight.shape()), " but x has shape ", shape_str(x.shape()),
             "; weight must be [", d, "], x's last dimension");
    MT_CHECK(weight.dtype() == grad_dtype_for(x.dtype()), "rms_norm: weight (shape ",
             shape_str(weight.shape()), ") must be ", dtype_name(grad_dtype_for(x.dtype())),
             " for ", dtype_name(x.dtype()), " x (shape ", shape_str(x.shape()), "), got ",
             dtype_name(weight.dtype()));
    MT_CHECK(x.device() == weight.device(), "rms_norm: x (shape ", shape_str(x.shape()), ") is on ",
             x.device().str(), " but weight (shape ", shape_str(weight.shape()), ") is on ",
             weight.device().str());
    MT_CHECK(std::isfinite(eps) && eps >= 0, "rms_norm: eps must be finite and >= 0, got ", eps);
    Tensor xc = x.contiguous(), wc = weight.contiguous();
    Tensor y = empty(x.shape(), x.dtype(), x.device());
    Tensor rstd = empty({x.numel() / d}, weight.dtype(), x.device());
    kernel<RMSNormForwardFn>(name, Phase::Forward, x.device())(as_rows(xc), wc, eps, as_rows(y),
                                                               rstd);
    ctx.save_for_backward({xc, wc, rstd});
    return y;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    auto saved = ctx.saved_tensors();
    const Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    Tensor dy = dys[0].contiguous();  // upstream gradients may be strided views
    Tensor dx, dw, sink;
    if (ctx.needs_input_grad(0)) dx = empty(x.shape(), x.dtype(), x.device());
    if (ctx.needs_input_grad(1)) {
      sink = ctx.grad_sink(1);  // weight's .grad when weight is a leaf: the kernel adds into it
      dw = sink.defined() ? sink : zeros(w.shape(), w.dtype(), w.device());
    }
    kernel<RMSNormBackwardFn>(name, Phase::Backward, x.device())(
        as_rows(x), w, rstd, as_rows(dy), dx.defined() ? as_rows(dx) : Tensor(), dw);
    if (sink.defined()) dw = Tensor();  // already added into .grad
    return {dx, dw, Tensor()};  // one per forward argument: x, weight, eps (not differentiable)
  }
};

// ---- CPU reference kernels ----------------------------------------------------------------
// weight, rstd and dweight are acc_t<scalar_t>: the grad dtype (f32, f64 for f64 x).

void forward_cpu(const Tensor& x, const Tensor& weight, double eps, const Tensor& y,
                 const Tensor& rstd) {
  MT_DISPATCH_FLOATING(x.dtype(), "rms_norm", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t rows = x.size(0), d = x.size(1);
    const acc* wp = weight.data<acc>();
    acc* rp = rstd.data<acc>();
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* xr = x.data<scalar_t>() + r * d;
      scalar_t* yr = y.data<scalar_t>() + r * d;
      double sum_sq = 0;  // the reference reduces in double: it is the oracle for the GPU
      for (int64_t j = 0; j < d; ++j) {
        const double v = cpu::to_acc(xr[j]);
        sum_sq += v * v;
      }
      const acc rs = acc(1 / std::sqrt(sum_sq / double(d) + eps));
      rp[r] = rs;
      for (int64_t j = 0; j < d; ++j)
        yr[j] = cpu::from_acc<scalar_t>(cpu::to_acc(xr[j]) * rs * wp[j]);
    }
  });
}

// Accumulation: dx '=' (x's dtype, math in acc_t); dweight '+=' into weight's .grad (the grad
// sink) or fresh zeros, in the grad dtype, each column summed in double over the rows in order.
void backward_cpu(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                  const Tensor& dx, const Tensor& dweight) {
  MT_DISPATCH_FLOATING(x.dtype(), "rms_norm", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t rows = x.size(0), d = x.size(1);
    const acc* wp = weight.data<acc>();
    const acc* rp = rstd.data<acc>();
    std::vector<double> dw_sum(dweight.defined() ? size_t(d) : 0, 0.0);  // fixed row order
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* xr = x.data<scalar_t>() + r * d;
      const scalar_t* dyr = dy.data<scalar_t>() + r * d;
      const acc rs = rp[r];
      double dot = 0;  // Σ_j g·x̂, the row's projection term
      for (int64_t j = 0; j < d; ++j) {
        const acc xhat = cpu::to_acc(xr[j]) * rs, g = cpu::to_acc(dyr[j]) * wp[j];
        dot += double(g) * double(xhat);
        if (dweight.defined()) dw_sum[size_t(j)] += double(cpu::to_acc(dyr[j])) * double(xhat);
      }
      if (!dx.defined()) continue;
      const acc mean_dot = acc(dot / double(d));
      scalar_t* dxr = dx.data<scalar_t>() + r * d;
      for (int64_t j = 0; j < d; ++j) {
        const acc xhat = cpu::to_acc(xr[j]) * rs, g = cpu::to_acc(dyr[j]) * wp[j];  // recomputed
        dxr[j] = cpu::from_acc<scalar_t>(rs * (g - xhat * mean_dot));
      }
    }
    if (dweight.defined()) {
      // '+=': dweight is weight's .grad when it is a sink; a store would drop earlier microbatches.
      acc* dwp = dweight.data<acc>();
      for (int64_t j = 0; j < d; ++j) dwp[j] += acc(dw_sum[size_t(j)]);
    }
  });
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return RMSNormFn::apply(x, weight, eps);
}

MT_DEFINE_OP(rms_norm, "y = x*rstd*w; dx = rstd*(g - xh*mean(g*xh)), dw += sum_rows(dy*xh)",
             RMSNormForwardFn, RMSNormBackwardFn);
MT_REGISTER_KERNEL(rms_norm, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL(rms_norm, Backward, CPU, backward_cpu);

}  // namespace mt
