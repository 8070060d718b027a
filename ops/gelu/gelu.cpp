// gelu: the Function (the graph node's contract) and the CPU reference kernels.
// The math, the saved-vs-recomputed choice and the grids are in gelu.h.
#include "ops/gelu/gelu.h"

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"
#include "ops/gelu/gelu_math.h"

namespace mt {
namespace {

struct GeluFn : Function<GeluFn> {
  static constexpr const char* name = "gelu";

  static Tensor forward(Context& ctx, const Tensor& x, GeluApprox approx) {
    MT_CHECK(is_floating(x.dtype()), "gelu: x must be floating-point, got ",
             dtype_name(x.dtype()), " of shape ", shape_str(x.shape()));
    MT_CHECK(approx == GeluApprox::Tanh || approx == GeluApprox::Erf, "gelu: unknown approx ",
             int(approx), " (expected GeluApprox::Tanh or GeluApprox::Erf)");
    Tensor xc = x.contiguous();
    Tensor y = empty(x.shape(), x.dtype(), x.device());
    kernel<GeluForwardFn>(name, Phase::Forward, x.device())(xc, approx, y);
    ctx.set("approx", approx);
    ctx.save_for_backward({xc});
    return y;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    const Tensor x = ctx.saved_tensors()[0];
    Tensor dy = dys[0].contiguous();  // upstream gradients may be strided views
    Tensor dx = empty(x.shape(), x.dtype(), x.device());
    kernel<GeluBackwardFn>(name, Phase::Backward, x.device())(x, dy, ctx.get<GeluApprox>("approx"),
                                                              dx);
    return {dx, Tensor()};  // one per forward argument: x, approx (not differentiable)
  }
};

// ---- CPU reference kernels ----------------------------------------------------------------
// Math in acc_t (f32, f64 for f64), the formulas of gelu_math.h, each result rounded once.

void forward_cpu(const Tensor& x, GeluApprox approx, const Tensor& y) {
  MT_DISPATCH_FLOATING(x.dtype(), "gelu", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const scalar_t* xp = x.data<scalar_t>();
    scalar_t* yp = y.data<scalar_t>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const acc v = cpu::to_acc(xp[i]);
      yp[i] = cpu::from_acc<scalar_t>(approx == GeluApprox::Tanh ? gelu_math::tanh_forward(v)
                                                                 : gelu_math::erf_forward(v));
    }
  });
}

// dx '=' (a new tensor in x's dtype); nothing is added into.
void backward_cpu(const Tensor& x, const Tensor& dy, GeluApprox approx, const Tensor& dx) {
  MT_DISPATCH_FLOATING(x.dtype(), "gelu", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const scalar_t* xp = x.data<scalar_t>();
    const scalar_t* gp = dy.data<scalar_t>();
    scalar_t* dxp = dx.data<scalar_t>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const acc v = cpu::to_acc(xp[i]);
      const acc d = approx == GeluApprox::Tanh ? gelu_math::tanh_grad(v) : gelu_math::erf_grad(v);
      dxp[i] = cpu::from_acc<scalar_t>(cpu::to_acc(gp[i]) * d);
    }
  });
}

}  // namespace

Tensor gelu(const Tensor& x, GeluApprox approx) { return GeluFn::apply(x, approx); }

MT_DEFINE_OP(gelu, "y = x*Phi(x) (tanh or erf form); dx = dy*(Phi(x) + x*phi(x))", GeluForwardFn,
             GeluBackwardFn);
MT_REGISTER_KERNEL(gelu, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL(gelu, Backward, CPU, backward_cpu);

}  // namespace mt
