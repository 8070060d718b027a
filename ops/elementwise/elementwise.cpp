// Elementwise ops: Functions and CPU kernels. See elementwise.h for the math.
#include "ops/elementwise/elementwise.h"

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"

namespace mt {
namespace {

void check_same(const char* op, const Tensor& a, const Tensor& b) {
  MT_CHECK(a.shape() == b.shape(), op, ": shapes ", shape_str(a.shape()), " and ",
           shape_str(b.shape()), " differ (no broadcasting)");
  MT_CHECK(a.dtype() == b.dtype(), op, ": dtypes ", dtype_name(a.dtype()), " and ",
           dtype_name(b.dtype()), " differ");
  MT_CHECK(a.device() == b.device(), op, ": devices ", a.device().str(), " and ",
           b.device().str(), " differ");
}

Tensor like(const Tensor& x) { return empty(x.shape(), x.dtype(), x.device()); }

Tensor run_scale(const Tensor& x, double c) {
  Tensor out = like(x);
  kernel<ScaleFn>("scale", Phase::Forward, x.device())(x.contiguous(), c, out);
  return out;
}
Tensor run_mul(const Tensor& a, const Tensor& b) {
  Tensor out = like(a);
  kernel<MulFn>("mul", Phase::Forward, a.device())(a.contiguous(), b.contiguous(), out);
  return out;
}
// dy (one element) spread over `shape`, times c.
Tensor broadcast(const Tensor& dy, double c, const Tensor& like_x) {
  Tensor out = like(like_x);
  kernel<BroadcastFn>("sum", Phase::Backward, dy.device())(dy.contiguous(), c, out);
  return out;
}

struct AddFnNode : Function<AddFnNode> {
  static constexpr const char* name = "add";
  static Tensor forward(Context& ctx, const Tensor& a, const Tensor& b, double alpha) {
    check_same(name, a, b);
    ctx.set("alpha", alpha);
    Tensor out = like(a);
    kernel<AddFn>(name, Phase::Forward, a.device())(a.contiguous(), b.contiguous(), alpha, out);
    return out;
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    double alpha = ctx.get<double>("alpha");
    Tensor db;
    if (ctx.needs_input_grad(1)) db = alpha == 1.0 ? dy[0] : run_scale(dy[0], alpha);
    return {ctx.needs_input_grad(0) ? dy[0] : Tensor(), db, Tensor()};
  }
};

struct MulFnNode : Function<MulFnNode> {
  static constexpr const char* name = "mul";
  static Tensor forward(Context& ctx, const Tensor& a, const Tensor& b) {
    check_same(name, a, b);
    ctx.save_for_backward({a, b});
    return run_mul(a, b);
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    auto s = ctx.saved_tensors();
    return {ctx.needs_input_grad(0) ? run_mul(dy[0], s[1]) : Tensor(),
            ctx.needs_input_grad(1) ? run_mul(dy[0], s[0]) : Tensor()};
  }
};

struct ScaleFnNode : Function<ScaleFnNode> {
  static constexpr const char* name = "scale";
  static Tensor forward(Context& ctx, const Tensor& x, double c) {
    ctx.set("c", c);
    return run_scale(x, c);
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    return {run_scale(dy[0], ctx.get<double>("c")), Tensor()};
  }
};

struct ReluFnNode : Function<ReluFnNode> {
  static constexpr const char* name = "relu";
  static Tensor forward(Context& ctx, const Tensor& x) {
    Tensor xc = x.contiguous(), y = like(x);
    kernel<ReluForwardFn>(name, Phase::Forward, x.device())(xc, y);
    ctx.save_for_backward({xc});
    return y;
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    Tensor x = ctx.saved_tensors()[0], dx = like(x);
    kernel<ReluBackwardFn>(name, Phase::Backward, x.device())(x, dy[0].contiguous(), dx);
    return {dx};
  }
};

struct SumFnNode : Function<SumFnNode> {
  static constexpr const char* name = "sum";
  static Tensor forward(Context& ctx, const Tensor& x, double c) {
    ctx.set("c", c);
    ctx.save_for_backward({x.detach()});  // only its shape and device are needed
    Tensor out = empty({}, x.dtype(), x.device());
    kernel<SumFn>(name, Phase::Forward, x.device())(x.contiguous(), out);
    return c == 1.0 ? out : run_scale(out, c);
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    return {broadcast(dy[0], ctx.get<double>("c"), ctx.saved_tensors()[0]), Tensor()};
  }
};

// ---- CPU kernels --------------------------------------------------------------------------

template <class F>
void map2_cpu(const char* op, const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  MT_DISPATCH_FLOATING(a.dtype(), op, [&] {
    const scalar_t *ap = a.data<scalar_t>(), *bp = b.data<scalar_t>();
    scalar_t* op_ = out.data<scalar_t>();
    for (int64_t i = 0; i < a.numel(); ++i)
      op_[i] = cpu::from_acc<scalar_t>(f(cpu::to_acc(ap[i]), cpu::to_acc(bp[i])));
  });
}

void add_cpu(const Tensor& a, const Tensor& b, double alpha, const Tensor& out) {
  map2_cpu("add", a, b, out, [alpha](auto x, auto y) { return x + decltype(x)(alpha) * y; });
}
void mul_cpu(const Tensor& a, const Tensor& b, const Tensor& out) {
  map2_cpu("mul", a, b, out, [](auto x, auto y) { return x * y; });
}
void scale_cpu(const Tensor& x, double c, const Tensor& out) {
  map2_cpu("scale", x, x, out, [c](auto v, auto) { return decltype(v)(c) * v; });
}
void relu_forward_cpu(const Tensor& x, const Tensor& y) {
  map2_cpu("relu", x, x, y, [](auto v, auto) { return v > 0 ? v : decltype(v)(0); });
}
// dx '=' a new tensor in x's dtype (the engine adds it into .grad); likewise broadcast_cpu.
void relu_backward_cpu(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  map2_cpu("relu", x, dy, dx, [](auto v, auto g) { return v > 0 ? g : decltype(v)(0); });
}
void sum_cpu(const Tensor& x, const Tensor& out) {
  MT_DISPATCH_FLOATING(x.dtype(), "sum", [&] {
    const scalar_t* p = x.data<scalar_t>();
    double s = 0;
    for (int64_t i = 0; i < x.numel(); ++i) s += double(cpu::to_acc(p[i]));
    out.data<scalar_t>()[0] = cpu::from_acc<scalar_t>(cpu::acc_t<scalar_t>(s));
  });
}
void broadcast_cpu(const Tensor& scalar, double c, const Tensor& out) {
  MT_DISPATCH_FLOATING(out.dtype(), "sum", [&] {
    auto v = cpu::acc_t<scalar_t>(c) * cpu::to_acc(scalar.data<scalar_t>()[0]);
    scalar_t* p = out.data<scalar_t>();
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = cpu::from_acc<scalar_t>(v);
  });
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) { return AddFnNode::apply(a, b, alpha); }
Tensor sub(const Tensor& a, const Tensor& b) { return add(a, b, -1.0); }
Tensor mul(const Tensor& a, const Tensor& b) { return MulFnNode::apply(a, b); }
Tensor scale(const Tensor& x, double c) { return ScaleFnNode::apply(x, c); }
Tensor relu(const Tensor& x) { return ReluFnNode::apply(x); }
Tensor sum(const Tensor& x) { return SumFnNode::apply(x, 1.0); }
Tensor mean(const Tensor& x) {
  MT_CHECK(x.numel() > 0, "mean: empty tensor of shape ", shape_str(x.shape()));
  return SumFnNode::apply(x, 1.0 / double(x.numel()));
}
Tensor mse_loss(const Tensor& a, const Tensor& b) {
  Tensor d = sub(a, b);
  return mean(mul(d, d));
}

MT_DEFINE_OP(add, "out = a + alpha*b", AddFn, void);
MT_REGISTER_KERNEL(add, Forward, CPU, add_cpu);
MT_DEFINE_OP(mul, "out = a*b", MulFn, void);
MT_REGISTER_KERNEL(mul, Forward, CPU, mul_cpu);
MT_DEFINE_OP(scale, "out = c*x", ScaleFn, void);
MT_REGISTER_KERNEL(scale, Forward, CPU, scale_cpu);
MT_DEFINE_OP(relu, "y = max(x, 0); dx = dy*[x > 0]", ReluForwardFn, ReluBackwardFn);
MT_REGISTER_KERNEL(relu, Forward, CPU, relu_forward_cpu);
MT_REGISTER_KERNEL(relu, Backward, CPU, relu_backward_cpu);
MT_DEFINE_OP(sum, "out = c*sum(x); dx = c*dy (broadcast)", SumFn, BroadcastFn);
MT_REGISTER_KERNEL(sum, Forward, CPU, sum_cpu);
MT_REGISTER_KERNEL(sum, Backward, CPU, broadcast_cpu);

}  // namespace mt
