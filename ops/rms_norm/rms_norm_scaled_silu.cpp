// rms_norm_scaled_silu: the Function (the graph node's contract) and the CPU reference kernels.
// The math, what the fusion saves and the rounding it changes are in rms_norm_scaled_silu.h.
#include "ops/rms_norm/rms_norm_scaled_silu.h"

#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"

namespace mt {
namespace {

Tensor as_rows(const Tensor& t) { return t.view({t.numel() / t.size(-1), t.size(-1)}); }

struct RMSNormScaledSiLUFn : Function<RMSNormScaledSiLUFn> {
  static constexpr const char* name = "rms_norm_scaled_silu";

  static Tensor forward(Context& ctx, const Tensor& x, const Tensor& weight, const Tensor& w,
                        double eps) {
    MT_CHECK(x.dim() >= 1 && x.size(-1) > 0 && is_floating(x.dtype()), name, ": x must be a "
             "floating-point tensor with a non-empty last dimension, got shape ",
             shape_str(x.shape()), " ", dtype_name(x.dtype()));
    const int64_t d = x.size(-1);
    const DType gd = grad_dtype_for(x.dtype());
    MT_CHECK(weight.dim() == 1 && weight.size(0) == d, name, ": weight has shape ",
             shape_str(weight.shape()), " but x has shape ", shape_str(x.shape()),
             "; weight must be [", d, "], x's last dimension");
    MT_CHECK(w.numel() == 1, name, ": w must have exactly one element, got shape ",
             shape_str(w.shape()));
    MT_CHECK(weight.dtype() == gd && w.dtype() == gd, name, ": weight and w must be ",
             dtype_name(gd), " for ", dtype_name(x.dtype()), " x, got ", dtype_name(weight.dtype()),
             " and ", dtype_name(w.dtype()));
    MT_CHECK(x.device() == weight.device() && x.device() == w.device(), name, ": x is on ",
             x.device().str(), ", weight on ", weight.device().str(), " and w on ",
             w.device().str(), "; all three must be on one device");
    MT_CHECK(std::isfinite(eps) && eps >= 0, name, ": eps must be finite and >= 0, got ", eps);
    Tensor xc = x.contiguous(), gc = weight.contiguous(), wc = w.contiguous();
    Tensor y = empty(x.shape(), x.dtype(), x.device());
    Tensor rstd = empty({x.numel() / d}, gd, x.device());
    kernel<RMSNormScaledSiLUForwardFn>(name, Phase::Forward, x.device())(as_rows(xc), gc, wc, eps,
                                                                         as_rows(y), rstd);
    ctx.save_for_backward({xc, gc, wc, rstd});
    return y;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    auto saved = ctx.saved_tensors();
    const Tensor &x = saved[0], &weight = saved[1], &w = saved[2], &rstd = saved[3];
    Tensor dy = dys[0].contiguous();  // upstream gradients may be strided views
    Tensor dx, dweight, dw, weight_sink, w_sink;
    if (ctx.needs_input_grad(0)) dx = empty(x.shape(), x.dtype(), x.device());
    // The kernels compute both parameter gradients in the same pass, so both are allocated when
    // either is needed; an unneeded one goes to scratch and is dropped.
    if (ctx.needs_input_grad(1) || ctx.needs_input_grad(2)) {
      if (ctx.needs_input_grad(1)) weight_sink = ctx.grad_sink(1);  // the .grad, added into
      if (ctx.needs_input_grad(2)) w_sink = ctx.grad_sink(2);
      dweight = weight_sink.defined() ? weight_sink
                                      : zeros(weight.shape(), weight.dtype(), x.device());
      dw = w_sink.defined() ? w_sink : zeros(w.shape(), w.dtype(), x.device());
    }
    kernel<RMSNormScaledSiLUBackwardFn>(name, Phase::Backward, x.device())(
        as_rows(x), weight, w, rstd, as_rows(dy), dx.defined() ? as_rows(dx) : Tensor(), dweight,
        dw);
    if (weight_sink.defined() || !ctx.needs_input_grad(1)) dweight = Tensor();
    if (w_sink.defined() || !ctx.needs_input_grad(2)) dw = Tensor();
    return {dx, dweight, dw, Tensor()};  // x, weight, w, eps (not differentiable)
  }
};

// ---- CPU reference kernels ----------------------------------------------------------------
// weight, w, rstd, dweight and dw are acc_t<scalar_t>: the grad dtype (f32, f64 for f64 x).
// h is kept in acc_t, never rounded to scalar_t: the fused op's rounding.

void forward_cpu(const Tensor& x, const Tensor& weight, const Tensor& w, double eps,
                 const Tensor& y, const Tensor& rstd) {
  MT_DISPATCH_FLOATING(x.dtype(), "rms_norm_scaled_silu", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t rows = x.size(0), d = x.size(1);
    const acc* gp = weight.data<acc>();
    const acc ws = w.data<acc>()[0];
    acc* rp = rstd.data<acc>();
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* xr = x.data<scalar_t>() + r * d;
      scalar_t* yr = y.data<scalar_t>() + r * d;
      double sum_sq = 0;  // reduced in double: the reference is the oracle for the GPU
      for (int64_t j = 0; j < d; ++j) {
        const double v = cpu::to_acc(xr[j]);
        sum_sq += v * v;
      }
      const acc rs = acc(1 / std::sqrt(sum_sq / double(d) + eps));
      rp[r] = rs;
      for (int64_t j = 0; j < d; ++j) {
        const acc h = cpu::to_acc(xr[j]) * rs * gp[j];
        const acc s = acc(1) / (acc(1) + std::exp(-h));
        yr[j] = cpu::from_acc<scalar_t>(ws * h * s);
      }
    }
  });
}

// dx '='; dweight and dw '+=' (the .grads or fresh zeros), each summed in double in row order.
void backward_cpu(const Tensor& x, const Tensor& weight, const Tensor& w, const Tensor& rstd,
                  const Tensor& dy, const Tensor& dx, const Tensor& dweight, const Tensor& dw) {
  MT_DISPATCH_FLOATING(x.dtype(), "rms_norm_scaled_silu", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t rows = x.size(0), d = x.size(1);
    const acc* gp = weight.data<acc>();
    const acc ws = w.data<acc>()[0];
    const acc* rp = rstd.data<acc>();
    const bool params = dweight.defined();
    std::vector<double> dweight_sum(params ? size_t(d) : 0, 0.0);
    double dw_sum = 0;
    std::vector<acc> dh(static_cast<size_t>(d));  // one row of dL/dh
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* xr = x.data<scalar_t>() + r * d;
      const scalar_t* dyr = dy.data<scalar_t>() + r * d;
      const acc rs = rp[r];
      double dot = 0;  // Σ_j g·x̂ with g = dh·weight
      for (int64_t j = 0; j < d; ++j) {
        const acc xhat = cpu::to_acc(xr[j]) * rs, h = xhat * gp[j];
        const acc s = acc(1) / (acc(1) + std::exp(-h)), dyv = cpu::to_acc(dyr[j]);
        dh[size_t(j)] = dyv * ws * (s + h * s * (acc(1) - s));
        dot += double(dh[size_t(j)] * gp[j]) * double(xhat);
        if (params) {
          dw_sum += double(dyv) * double(h) * double(s);
          dweight_sum[size_t(j)] += double(dh[size_t(j)]) * double(xhat);
        }
      }
      if (!dx.defined()) continue;
      const acc mean_dot = acc(dot / double(d));
      scalar_t* dxr = dx.data<scalar_t>() + r * d;
      for (int64_t j = 0; j < d; ++j) {
        const acc xhat = cpu::to_acc(xr[j]) * rs;
        dxr[j] = cpu::from_acc<scalar_t>(rs * (dh[size_t(j)] * gp[j] - xhat * mean_dot));
      }
    }
    if (params) {  // '+=': these are the .grads when they are sinks
      acc* dgp = dweight.data<acc>();
      for (int64_t j = 0; j < d; ++j) dgp[j] += acc(dweight_sum[size_t(j)]);
      dw.data<acc>()[0] += acc(dw_sum);
    }
  });
}

}  // namespace

Tensor rms_norm_scaled_silu(const Tensor& x, const Tensor& weight, const Tensor& w, double eps) {
  return RMSNormScaledSiLUFn::apply(x, weight, w, eps);
}

MT_DEFINE_OP(rms_norm_scaled_silu,
             "h = x*rstd*g, y = w*h*sigmoid(h); dh = dy*w*(s + h*s*(1-s)), dw += sum(dy*h*s), "
             "then rms_norm's backward with dh",
             RMSNormScaledSiLUForwardFn, RMSNormScaledSiLUBackwardFn);
MT_REGISTER_KERNEL(rms_norm_scaled_silu, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL(rms_norm_scaled_silu, Backward, CPU, backward_cpu);

}  // namespace mt
