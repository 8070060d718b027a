// gelu_mlp: the Function (the graph node's contract) and the CPU reference kernels.
// The math, the rounding, what is saved and the kernels are in gelu_mlp.h.
#include "ops/gelu_mlp/gelu_mlp.h"

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"
#include "ops/gelu/gelu_math.h"
#include "ops/linear/linear.h"

namespace mt {
namespace {

struct GeluMlpFn : Function<GeluMlpFn> {
  static constexpr const char* name = "gelu_mlp";

  static Tensor forward(Context& ctx, const Tensor& x, const Tensor& W1, const Tensor& b1,
                        const Tensor& W2, const Tensor& b2, const Tensor& W1_compute,
                        const Tensor& b1_compute, const Tensor& W2_compute,
                        const Tensor& b2_compute) {
    MT_CHECK(x.defined() && W1.defined(), name, ": x and W1 must be defined");
    check_linear_args(name, {x.shape(), x.dtype(), x.device(), "x", "W1", "b1"}, W1, b1,
                      W1_compute, b1_compute);
    // The second layer reads h = gelu(pre) [..., H], in x's dtype on x's device.
    Shape h_shape = x.shape();
    h_shape.back() = W1.size(0);
    check_linear_args(name, {h_shape, x.dtype(), x.device(), "h (the hidden activation)", "W2",
                             "b2"},
                      W2, b2, W2_compute, b2_compute);
    auto [W1c, b1c] = linear_operands(x, W1, b1, W1_compute, b1_compute);
    auto [W2c, b2c] = linear_operands(x, W2, b2, W2_compute, b2_compute);
    Tensor xc = x.contiguous();
    Tensor pre = empty(h_shape, x.dtype(), x.device());
    Tensor h = empty(h_shape, x.dtype(), x.device());
    Shape y_shape = x.shape();
    y_shape.back() = W2.size(0);
    Tensor y = empty(y_shape, x.dtype(), x.device());
    kernel<GeluMlpForwardFn>(name, Phase::Forward, x.device())(
        as_matrix(xc), W1c, b1c, W2c, b2c, as_matrix(pre), as_matrix(h), as_matrix(y));
    ctx.set("W1_dtype", W1.dtype());  // each layer's parameters keep their own dtype
    ctx.set("W2_dtype", W2.dtype());
    ctx.save_for_backward({xc, W1c, W2c, pre, h});
    return y;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    auto saved = ctx.saved_tensors();
    const Tensor &x = saved[0], &W1c = saved[1], &W2c = saved[2], &pre = saved[3], &h = saved[4];
    const DType grad_dtype = grad_dtype_for(x.dtype());
    Tensor dy = dys[0].contiguous();  // upstream gradients may be strided views
    // A parameter's gradient goes into its .grad when it is a leaf (the kernels add into it), else
    // into fresh zeros returned in its own dtype. Argument slots: W1 1, b1 2, W2 3, b2 4.
    struct Slot {
      size_t arg;
      Shape shape;
      DType dtype;
    };
    const Slot slots[] = {{1, W1c.shape(), ctx.get<DType>("W1_dtype")},
                          {2, {W1c.size(0)}, ctx.get<DType>("W1_dtype")},
                          {3, W2c.shape(), ctx.get<DType>("W2_dtype")},
                          {4, {W2c.size(0)}, ctx.get<DType>("W2_dtype")}};
    Tensor sinks[5], grads[5];
    for (const Slot& p : slots) {
      if (!ctx.needs_input_grad(p.arg)) continue;
      sinks[p.arg] = ctx.grad_sink(p.arg);
      grads[p.arg] = sinks[p.arg].defined() ? sinks[p.arg] : zeros(p.shape, grad_dtype, x.device());
    }
    Tensor dx = ctx.needs_input_grad(0) ? empty(x.shape(), x.dtype(), x.device()) : Tensor();
    // dpre only when something below the GELU needs a gradient.
    Tensor dpre = dx.defined() || grads[1].defined() || grads[2].defined()
                      ? empty(pre.shape(), x.dtype(), x.device())
                      : Tensor();
    auto m = [](const Tensor& t) { return t.defined() ? as_matrix(t) : Tensor(); };
    kernel<GeluMlpBackwardFn>(name, Phase::Backward, x.device())(
        as_matrix(x), W1c, W2c, as_matrix(pre), as_matrix(h), as_matrix(dy), m(dpre), m(dx),
        grads[1], grads[2], grads[3], grads[4]);
    // A sunk gradient is already in .grad; a returned one takes its parameter's dtype.
    for (const Slot& p : slots)
      if (grads[p.arg].defined())
        grads[p.arg] = sinks[p.arg].defined() ? Tensor() : grads[p.arg].to(p.dtype);
    // x, W1, b1, W2, b2, and the four compute copies (no gradient)
    return {dx, grads[1], grads[2], grads[3], grads[4], Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// ---- CPU reference kernels ----------------------------------------------------------------
// linear's CPU kernels for the GEMMs, gelu_math.h's formulas between them. 16-bit tensors are
// upcast to f32 (exactly), and pre's and g's fp32 values feed GELU and its derivative before
// anything is rounded, as the CUDA epilogues do (gelu_mlp.h).

LinearForwardFn* linear_forward_cpu() {
  return kernel<LinearForwardFn>("linear", Phase::Forward, kCPU);
}
LinearBackwardFn* linear_backward_cpu() {
  return kernel<LinearBackwardFn>("linear", Phase::Backward, kCPU);
}

void forward_cpu(const Tensor& x, const Tensor& W1, const Tensor& b1, const Tensor& W2,
                 const Tensor& b2, const Tensor& pre, const Tensor& h, const Tensor& y) {
  const DType acc = grad_dtype_for(x.dtype());  // f64 for f64, else f32
  const bool widened = acc != pre.dtype();
  Tensor pre_acc = widened ? empty(pre.shape(), acc) : pre;
  linear_forward_cpu()(x.to(acc), W1.to(acc), b1.defined() ? b1.to(acc) : b1, pre_acc);
  if (widened) pre.copy_(pre_acc);  // rounded once
  MT_DISPATCH_FLOATING(h.dtype(), "gelu_mlp", [&] {
    using A = cpu::acc_t<scalar_t>;
    const A* pp = pre_acc.data<A>();
    scalar_t* hp = h.data<scalar_t>();
    for (int64_t i = 0; i < h.numel(); ++i)
      hp[i] = cpu::from_acc<scalar_t>(gelu_math::tanh_forward(pp[i]));
  });
  linear_forward_cpu()(h, W2, b2, y);
}

void backward_cpu(const Tensor& x, const Tensor& W1, const Tensor& W2, const Tensor& pre,
                  const Tensor& h, const Tensor& dy, const Tensor& dpre, const Tensor& dx,
                  const Tensor& dW1, const Tensor& db1, const Tensor& dW2, const Tensor& db2) {
  const DType acc = grad_dtype_for(x.dtype());  // f64 for f64, else f32
  // g = dy · W2 in the accumulation dtype, beside dW2 and db2.
  Tensor g = dpre.defined() ? empty(pre.shape(), acc) : Tensor();
  if (g.defined() || dW2.defined() || db2.defined())
    linear_backward_cpu()(h.to(acc), W2.to(acc), dy.to(acc), g, dW2, db2);
  if (!dpre.defined()) return;
  MT_DISPATCH_FLOATING(dpre.dtype(), "gelu_mlp", [&] {
    using A = cpu::acc_t<scalar_t>;
    const A* gp = g.data<A>();
    const scalar_t* pp = pre.data<scalar_t>();
    scalar_t* dp = dpre.data<scalar_t>();
    for (int64_t i = 0; i < dpre.numel(); ++i)
      dp[i] = cpu::from_acc<scalar_t>(gp[i] * gelu_math::tanh_grad(cpu::to_acc(pp[i])));
  });
  linear_backward_cpu()(x, W1, dpre, dx, dW1, db1);
}

}  // namespace

Tensor gelu_mlp(const Tensor& x, const Tensor& W1, const Tensor& b1, const Tensor& W2,
                const Tensor& b2, const Tensor& W1_compute, const Tensor& b1_compute,
                const Tensor& W2_compute, const Tensor& b2_compute) {
  return GeluMlpFn::apply(x, W1, b1, W2, b2, W1_compute, b1_compute, W2_compute, b2_compute);
}

MT_DEFINE_OP(gelu_mlp,
             "y = gelu(x*W1^T + b1)*W2^T + b2; dpre = (dy*W2) o gelu'(pre), then linear's "
             "gradients for both layers",
             GeluMlpForwardFn, GeluMlpBackwardFn);
MT_REGISTER_KERNEL(gelu_mlp, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL(gelu_mlp, Backward, CPU, backward_cpu);

}  // namespace mt
