// layer_norm: the Function (the graph node's contract) and the CPU reference kernels.
// The math, the saved-vs-recomputed choice and the grids are in layer_norm.h.
#include "ops/layer_norm/layer_norm.h"

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"

namespace mt {
namespace {

// x [..., d] as [rows, d] (a view of a contiguous x).
Tensor as_rows(const Tensor& t) { return t.view({t.numel() / t.size(-1), t.size(-1)}); }

void check_param(const char* what, const Tensor& p, const Tensor& x) {
  const int64_t d = x.size(-1);
  MT_CHECK(p.dim() == 1 && p.size(0) == d, "layer_norm: ", what, " has shape ",
           shape_str(p.shape()), " but x has shape ", shape_str(x.shape()), "; ", what,
           " must be [", d, "], x's last dimension");
  MT_CHECK(p.dtype() == grad_dtype_for(x.dtype()), "layer_norm: ", what, " (shape ",
           shape_str(p.shape()), ") must be ", dtype_name(grad_dtype_for(x.dtype())), " for ",
           dtype_name(x.dtype()), " x, got ", dtype_name(p.dtype()));
  MT_CHECK(p.device() == x.device(), "layer_norm: x is on ", x.device().str(), " but ", what,
           " is on ", p.device().str());
}

// The forward of both Functions, r undefined for the plain LayerNorm: {s = x + r (undefined
// without r), y}; saves {the normalized rows (x or s), weight, mean, rstd}.
std::pair<Tensor, Tensor> forward_of(Context& ctx, const Tensor& x, const Tensor& r,
                                     const Tensor& weight, const Tensor& bias, double eps) {
  MT_CHECK(x.dim() >= 1 && x.size(-1) > 0 && is_floating(x.dtype()), "layer_norm: x must be a "
           "floating-point tensor with a non-empty last dimension, got shape ",
           shape_str(x.shape()), " ", dtype_name(x.dtype()));
  check_param("weight", weight, x);
  check_param("bias", bias, x);
  MT_CHECK(std::isfinite(eps) && eps >= 0, "layer_norm: eps must be finite and >= 0, got ", eps);
  const int64_t d = x.size(-1);
  Tensor xc = x.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
  Tensor sum = r.defined() ? empty(x.shape(), x.dtype(), x.device()) : Tensor();
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  Tensor mean = empty({x.numel() / d}, weight.dtype(), x.device());
  Tensor rstd = empty({x.numel() / d}, weight.dtype(), x.device());
  kernel<LayerNormForwardFn>("layer_norm", Phase::Forward, x.device())(
      as_rows(xc), r.defined() ? as_rows(r.contiguous()) : Tensor(), wc, bc, eps,
      sum.defined() ? as_rows(sum) : Tensor(), as_rows(y), mean, rstd);
  ctx.save_for_backward({sum.defined() ? sum : xc, wc, mean, rstd});
  return {sum, y};
}

// The LayerNorm's backward from its saved {x, weight, mean, rstd}, for upstream dy and the
// residual gradient dres (undefined: none) added into dx: {dx (undefined unless want_dx),
// dweight, dbias}. The parameters are inputs w_arg and w_arg + 1 of the node: their gradients
// go into their .grads when they are sinks (then returned undefined).
std::tuple<Tensor, Tensor, Tensor> backward_of(Context& ctx, const Tensor& dy_in,
                                               const Tensor& dres, bool want_dx, size_t w_arg) {
  auto saved = ctx.saved_tensors();
  const Tensor &x = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
  Tensor dy = dy_in.contiguous();  // upstream gradients may be strided views
  Tensor dx, dw, db, sink_w, sink_b;
  if (want_dx) dx = empty(x.shape(), x.dtype(), x.device());
  if (ctx.needs_input_grad(w_arg)) {
    sink_w = ctx.grad_sink(w_arg);  // weight's .grad when it is a leaf: the kernel adds into it
    dw = sink_w.defined() ? sink_w : zeros(w.shape(), w.dtype(), w.device());
  }
  if (ctx.needs_input_grad(w_arg + 1)) {
    sink_b = ctx.grad_sink(w_arg + 1);
    db = sink_b.defined() ? sink_b : zeros(w.shape(), w.dtype(), w.device());
  }
  kernel<LayerNormBackwardFn>("layer_norm", Phase::Backward, x.device())(
      as_rows(x), w, mean, rstd, as_rows(dy), dres.defined() ? as_rows(dres) : Tensor(),
      dx.defined() ? as_rows(dx) : Tensor(), dw, db);
  if (sink_w.defined()) dw = Tensor();  // already added into .grad
  if (sink_b.defined()) db = Tensor();
  return {dx, dw, db};
}

struct LayerNormFn : Function<LayerNormFn> {
  static constexpr const char* name = "layer_norm";

  static Tensor forward(Context& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        double eps) {
    return forward_of(ctx, x, Tensor(), weight, bias, eps).second;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    auto [dx, dw, db] = backward_of(ctx, dys[0], Tensor(), ctx.needs_input_grad(0), 1);
    return {dx, dw, db, Tensor()};  // x, weight, bias, eps (not differentiable)
  }
};

struct AddLayerNormFn : Function<AddLayerNormFn> {
  static constexpr const char* name = "add_layer_norm";

  static std::vector<Tensor> forward(Context& ctx, const Tensor& x, const Tensor& r,
                                     const Tensor& weight, const Tensor& bias, double eps) {
    MT_CHECK(r.shape() == x.shape() && r.dtype() == x.dtype() && r.device() == x.device(),
             "add_layer_norm: the residual r must match x, got x ", shape_str(x.shape()), " ",
             dtype_name(x.dtype()), " on ", x.device().str(), " and r ", shape_str(r.shape()),
             " ", dtype_name(r.dtype()), " on ", r.device().str());
    auto [sum, y] = forward_of(ctx, x, r, weight, bias, eps);
    return {sum, y};
  }

  // dys: {ds, dy}, either undefined when that output got no gradient.
  static GradList backward(Context& ctx, const GradList& dys) {
    const Tensor &ds = dys[0], &dy = dys[1];
    const bool want = ctx.needs_input_grad(0) || ctx.needs_input_grad(1);
    Tensor dsum = ds, dw, db;
    if (dy.defined()) {
      std::tie(dsum, dw, db) =
          backward_of(ctx, dy, want && ds.defined() ? ds.contiguous() : Tensor(), want, 2);
    }
    if (!want) dsum = Tensor();
    // s = x + r: one gradient for both (the engine sums out of place, so sharing it is safe).
    return {ctx.needs_input_grad(0) ? dsum : Tensor(), ctx.needs_input_grad(1) ? dsum : Tensor(),
            dw, db, Tensor()};
  }
};

// ---- CPU reference kernels ----------------------------------------------------------------
// weight, bias, mean, rstd, dweight, dbias are acc_t<scalar_t>: the grad dtype.

// residual: the row is first s = x + residual, rounded to scalar_t as add rounds it, into sum.
void forward_cpu(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                 double eps, const Tensor& sum_out, const Tensor& y, const Tensor& mean,
                 const Tensor& rstd) {
  MT_DISPATCH_FLOATING(x.dtype(), "layer_norm", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t rows = x.size(0), d = x.size(1);
    const acc* wp = weight.data<acc>();
    const acc* bp = bias.data<acc>();
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* xr = x.data<scalar_t>() + r * d;
      if (residual.defined()) {
        const scalar_t* rr = residual.data<scalar_t>() + r * d;
        scalar_t* sr = sum_out.data<scalar_t>() + r * d;
        for (int64_t j = 0; j < d; ++j)
          sr[j] = cpu::from_acc<scalar_t>(cpu::to_acc(xr[j]) + cpu::to_acc(rr[j]));
        xr = sr;
      }
      scalar_t* yr = y.data<scalar_t>() + r * d;
      double sum = 0;  // the reference reduces in double, two passes: it is the GPU's oracle
      for (int64_t j = 0; j < d; ++j) sum += double(cpu::to_acc(xr[j]));
      const double mu = sum / double(d);
      double sq = 0;
      for (int64_t j = 0; j < d; ++j) {
        const double c = double(cpu::to_acc(xr[j])) - mu;
        sq += c * c;
      }
      const acc m = acc(mu), rs = acc(1 / std::sqrt(sq / double(d) + eps));
      mean.data<acc>()[r] = m;
      rstd.data<acc>()[r] = rs;
      for (int64_t j = 0; j < d; ++j)
        yr[j] = cpu::from_acc<scalar_t>((cpu::to_acc(xr[j]) - m) * rs * wp[j] + bp[j]);
    }
  });
}

// Accumulation: dx '=' (x's dtype, math in acc_t); dweight and dbias '+=' into the .grads (the
// sinks) or fresh zeros, each column summed in double over the rows in order.
// dresidual: added to dx before its one rounding.
void backward_cpu(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                  const Tensor& dy, const Tensor& dresidual, const Tensor& dx,
                  const Tensor& dweight, const Tensor& dbias) {
  MT_CHECK(!dresidual.defined() || dx.defined(), "layer_norm: a residual gradient needs dx");
  MT_DISPATCH_FLOATING(x.dtype(), "layer_norm", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t rows = x.size(0), d = x.size(1);
    const acc* wp = weight.data<acc>();
    std::vector<double> dw_sum(size_t(d), 0.0), db_sum(size_t(d), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* xr = x.data<scalar_t>() + r * d;
      const scalar_t* dyr = dy.data<scalar_t>() + r * d;
      const acc m = mean.data<acc>()[r], rs = rstd.data<acc>()[r];
      double sum_g = 0, sum_gx = 0;
      for (int64_t j = 0; j < d; ++j) {
        const acc xhat = (cpu::to_acc(xr[j]) - m) * rs, dyv = cpu::to_acc(dyr[j]);
        const acc g = dyv * wp[j];
        sum_g += double(g);
        sum_gx += double(g) * double(xhat);
        dw_sum[size_t(j)] += double(dyv) * double(xhat);
        db_sum[size_t(j)] += double(dyv);
      }
      if (!dx.defined()) continue;
      const acc mg = acc(sum_g / double(d)), mgx = acc(sum_gx / double(d));
      scalar_t* dxr = dx.data<scalar_t>() + r * d;
      const scalar_t* drr = dresidual.defined() ? dresidual.data<scalar_t>() + r * d : nullptr;
      for (int64_t j = 0; j < d; ++j) {
        const acc xhat = (cpu::to_acc(xr[j]) - m) * rs;  // recomputed
        const acc g = cpu::to_acc(dyr[j]) * wp[j];
        const acc v = rs * (g - mg - xhat * mgx);
        dxr[j] = cpu::from_acc<scalar_t>(drr != nullptr ? v + cpu::to_acc(drr[j]) : v);
      }
    }
    // '+=': these are the .grads when they are sinks; a store would drop earlier microbatches.
    if (dweight.defined())
      for (int64_t j = 0; j < d; ++j) dweight.data<acc>()[j] += acc(dw_sum[size_t(j)]);
    if (dbias.defined())
      for (int64_t j = 0; j < d; ++j) dbias.data<acc>()[j] += acc(db_sum[size_t(j)]);
  });
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  return LayerNormFn::apply(x, weight, bias, eps);
}

std::vector<Tensor> add_layer_norm(const Tensor& x, const Tensor& r, const Tensor& weight,
                                   const Tensor& bias, double eps) {
  return AddLayerNormFn::apply(x, r, weight, bias, eps);
}

MT_DEFINE_OP(layer_norm,
             "y = (x-mean)*rstd*w + b (x = x + residual when given); "
             "dx = rstd*(g - mean(g) - xh*mean(g*xh)) (+ dresidual), dw += sum(dy*xh), "
             "db += sum(dy)",
             LayerNormForwardFn, LayerNormBackwardFn);
MT_REGISTER_KERNEL(layer_norm, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL(layer_norm, Backward, CPU, backward_cpu);

}  // namespace mt
