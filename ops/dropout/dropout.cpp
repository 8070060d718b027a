// dropout: the Function (the graph node's contract) and the CPU reference kernel.
// The math, the mask's counter-based RNG and why nothing is saved are in dropout.h.
#include "ops/dropout/dropout.h"

#include <cmath>

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"
#include "ops/dropout/philox.h"

namespace mt {
namespace {

struct DropoutFnNode : Function<DropoutFnNode> {
  static constexpr const char* name = "dropout";

  static Tensor forward(Context& ctx, const Tensor& x, double p, uint64_t seed, uint64_t offset,
                        const Tensor& base) {
    Tensor xc = x.contiguous();
    Tensor y = empty(x.shape(), x.dtype(), x.device());
    const uint32_t threshold = dropout_threshold(p);
    const double s = 1.0 / (1.0 - p);
    // The same kernel serves both phases: the mask depends only on (seed, offset, position).
    kernel<DropoutFn>(name, Phase::Forward, x.device())(xc, threshold, s, seed, offset, base, y);
    ctx.set("threshold", threshold);
    ctx.set("scale", s);
    ctx.set("seed", seed);
    ctx.set("offset", offset);
    // The word itself, read again by the backward's kernel (dropout.h): saved so that its
    // version is checked, since a word moved in between would draw another mask.
    ctx.save_for_backward({base});
    return y;  // no activation saved: backward regenerates the mask
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    Tensor dy = dys[0].contiguous();  // upstream gradients may be strided views
    Tensor dx = empty(dy.shape(), dy.dtype(), dy.device());
    kernel<DropoutFn>(name, Phase::Backward, dy.device())(
        dy, ctx.get<uint32_t>("threshold"), ctx.get<double>("scale"), ctx.get<uint64_t>("seed"),
        ctx.get<uint64_t>("offset"), ctx.saved_tensors()[0], dx);
    return {dx, Tensor(), Tensor(), Tensor(), Tensor()};  // x; p, seed, offset, base: none
  }
};

// ---- CPU reference kernel -------------------------------------------------------------------
// out '=' (in's dtype): in_i · s where 16-bit half i of the Philox stream clears the threshold,
// else 0.
void apply_cpu(const Tensor& in, uint32_t threshold, double scale, uint64_t seed,
               uint64_t call_offset, const Tensor& base, const Tensor& out) {
  const uint64_t offset = call_offset + (base.defined() ? uint64_t(base.data<int64_t>()[0]) : 0);
  MT_DISPATCH_FLOATING(in.dtype(), "dropout", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const scalar_t* ip = in.data<scalar_t>();
    scalar_t* op = out.data<scalar_t>();
    const acc s = acc(scale);
    const int64_t n = in.numel();
    for (int64_t g = 0; g * 8 < n; ++g) {
      const philox::U32x4 r = philox::draw(seed, offset, uint64_t(g));
      for (int k = 0; k < 8 && g * 8 + k < n; ++k) {
        const int64_t i = g * 8 + k;
        op[i] = cpu::from_acc<scalar_t>(philox::half16(r, k) >= threshold ? cpu::to_acc(ip[i]) * s
                                                                          : acc(0));
      }
    }
  });
}

// A CPU run is never captured: always the eager rule.
void advance_base_cpu(const Tensor& base, uint64_t value, uint64_t /*stride*/) {
  base.data<int64_t>()[0] = int64_t(value);
}

void check_base(const char* what, const Tensor& base, Device device) {
  MT_CHECK(base.dtype() == DType::i64 && base.numel() == 1 && base.is_contiguous(), what,
           ": the offset base must be one i64 element, got shape ", shape_str(base.shape()), " ",
           dtype_name(base.dtype()));
  MT_CHECK(base.device() == device, what, ": the offset base is on ", base.device().str(),
           " but x is on ", device.str());
}

}  // namespace

uint32_t dropout_threshold(double p) {
  MT_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  return uint32_t(std::round(std::ldexp(p, 16)));  // 65536 (p near 1) drops every element
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, bool training,
               const Tensor& base) {
  MT_CHECK(x.defined() && is_floating(x.dtype()), "dropout: x must be a floating-point tensor",
           x.defined() ? std::string(", got ") + dtype_name(x.dtype()) : std::string());
  MT_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  if (base.defined()) check_base("dropout", base, x.device());
  if (!training || p == 0) return x;  // the identity: no node, no copy
  return DropoutFnNode::apply(x, p, seed, offset, base);
}

void advance_dropout_base(const Tensor& base, uint64_t value, uint64_t stride) {
  MT_CHECK(base.defined(), "advance_dropout_base: the offset base is undefined");
  check_base("advance_dropout_base", base, base.device());
  kernel<DropoutBaseFn>("dropout_base", Phase::Forward, base.device())(base, value, stride);
  base.bump_version();  // a write: a forward that saved the word finds it moved at backward
}

MT_DEFINE_OP(dropout,
             "y = x*keep/(1-p), keep = philox16(seed, offset + base, i) >= p*2^16; "
             "dx = dy*keep/(1-p)",
             DropoutFn, DropoutFn);
MT_REGISTER_KERNEL(dropout, Forward, CPU, apply_cpu);
MT_REGISTER_KERNEL(dropout, Backward, CPU, apply_cpu);
MT_DEFINE_OP(dropout_base, "base = value (eager) or base += stride (captured)", DropoutBaseFn, void);
MT_REGISTER_KERNEL(dropout_base, Forward, CPU, advance_base_cpu);

}  // namespace mt
