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

  static Tensor forward(Context& ctx, const Tensor& x, double p, uint64_t seed, uint64_t offset) {
    Tensor xc = x.contiguous();
    Tensor y = empty(x.shape(), x.dtype(), x.device());
    const uint32_t threshold = dropout_threshold(p);
    const double s = 1.0 / (1.0 - p);
    // The same kernel serves both phases: the mask depends only on (seed, offset, position).
    kernel<DropoutFn>(name, Phase::Forward, x.device())(xc, threshold, s, seed, offset, y);
    ctx.set("threshold", threshold);
    ctx.set("scale", s);
    ctx.set("seed", seed);
    ctx.set("offset", offset);
    return y;  // nothing saved: backward regenerates the mask
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    Tensor dy = dys[0].contiguous();  // upstream gradients may be strided views
    Tensor dx = empty(dy.shape(), dy.dtype(), dy.device());
    kernel<DropoutFn>(name, Phase::Backward, dy.device())(
        dy, ctx.get<uint32_t>("threshold"), ctx.get<double>("scale"), ctx.get<uint64_t>("seed"),
        ctx.get<uint64_t>("offset"), dx);
    return {dx, Tensor(), Tensor(), Tensor()};  // x; p, seed, offset (not differentiable)
  }
};

// ---- CPU reference kernel -------------------------------------------------------------------
// out '=' (in's dtype): in_i · s where word i of the Philox stream clears the threshold, else 0.
void apply_cpu(const Tensor& in, uint32_t threshold, double scale, uint64_t seed, uint64_t offset,
               const Tensor& out) {
  MT_DISPATCH_FLOATING(in.dtype(), "dropout", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const scalar_t* ip = in.data<scalar_t>();
    scalar_t* op = out.data<scalar_t>();
    const acc s = acc(scale);
    const int64_t n = in.numel();
    for (int64_t g = 0; g * 4 < n; ++g) {
      const philox::U32x4 r = philox::draw(seed, offset, uint64_t(g));
      for (int k = 0; k < 4 && g * 4 + k < n; ++k) {
        const int64_t i = g * 4 + k;
        op[i] = cpu::from_acc<scalar_t>(r.v[k] >= threshold ? cpu::to_acc(ip[i]) * s : acc(0));
      }
    }
  });
}

}  // namespace

uint32_t dropout_threshold(double p) {
  MT_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  const double t = std::round(std::ldexp(p, 32));
  return t >= 4294967295.0 ? 0xffffffffu : uint32_t(t);
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, bool training) {
  MT_CHECK(x.defined() && is_floating(x.dtype()), "dropout: x must be a floating-point tensor",
           x.defined() ? std::string(", got ") + dtype_name(x.dtype()) : std::string());
  MT_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  if (!training || p == 0) return x;  // the identity: no node, no copy
  return DropoutFnNode::apply(x, p, seed, offset);
}

MT_DEFINE_OP(dropout, "y = x*keep/(1-p), keep = philox(seed, offset, i) >= p*2^32; dx = dy*keep/(1-p)",
             DropoutFn, DropoutFn);
MT_REGISTER_KERNEL(dropout, Forward, CPU, apply_cpu);
MT_REGISTER_KERNEL(dropout, Backward, CPU, apply_cpu);

}  // namespace mt
