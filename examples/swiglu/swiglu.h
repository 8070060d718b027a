#pragma once
// swiglu: y = silu(a) · b = a · σ(a) · b, elementwise over two tensors of one shape. The gate of
// LLaMA-style MLPs: a = x·W_gateᵀ and b = x·W_upᵀ, then y goes through W_down.
//
// An op written outside minitrain, the way its own ops are: this header is the op's API, its
// Function (the graph node's contract), its CPU reference kernels and its definition in the op
// registry; swiglu.cu adds the CUDA kernels. docs/first_op.md walks through both.
//
// Gradients (s = σ(a), σ' = s·(1 − s)):
//   da = dy · b · (s + a · s · (1 − s))      d(a·s)/da = s + a·σ'(a)
//   db = dy · a · s
// Both are elementwise: every input element reaches exactly one output element, so each gets its
// gradient from that one element and nothing is summed. The backward is therefore ONE map (one
// grid, the forward's), which reads a, b, dy and writes da and db; compare scaled_silu, whose
// scalar w is broadcast to every element and so needs a reduce beside its map.
//
// Accumulation: da and db are written '=' into new tensors of a's dtype. a and b are activations,
// not parameters, so there is no grad sink here: if they ever are leaves, the engine adds the
// returned gradients into their fp32 .grad. (A sink pays off for parameters reduced over a batch,
// where the reduction's last pass can add straight into .grad; here it would only add a read.)
//
// Saved vs recomputed: backward saves a and b (inputs, which it cannot regenerate) and
// RECOMPUTES s = σ(a): one exp per element is far below the save-vs-recompute crossover (about 61
// flops per element for a 2-byte value on an H200), while saving s would write and re-read it.
//
// Grids (CUDA, swiglu.cu): forward and backward are both grid-stride maps over 16-byte packs
// (8 bf16/f16 or 4 f32 elements a thread a step) when every pointer is 16-byte aligned, else over
// single elements; the same grid for both, since both are maps.
#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"
#include "core/tensor.h"

namespace swiglu_example {

using mt::Tensor;

// The kernels every backend registers (inputs contiguous, outputs allocated by the caller).
// forward: y = silu(a)·b ('=', a's shape and dtype).
using SwiGLUForwardFn = void(const Tensor& a, const Tensor& b, const Tensor& y);
// backward: da and db ('=', a's dtype; undefined = not needed).
using SwiGLUBackwardFn = void(const Tensor& a, const Tensor& b, const Tensor& dy, const Tensor& da,
                              const Tensor& db);

struct SwiGLUFn : mt::Function<SwiGLUFn> {
  static constexpr const char* name = "swiglu";

  static Tensor forward(mt::Context& ctx, const Tensor& a, const Tensor& b) {
    MT_CHECK(a.shape() == b.shape(), "swiglu: a has shape ", mt::shape_str(a.shape()),
             " but b has shape ", mt::shape_str(b.shape()));
    MT_CHECK(a.dtype() == b.dtype(), "swiglu: a is ", mt::dtype_name(a.dtype()), " but b is ",
             mt::dtype_name(b.dtype()));
    MT_CHECK(a.device() == b.device(), "swiglu: a is on ", a.device().str(), " but b is on ",
             b.device().str());
    Tensor ac = a.contiguous(), bc = b.contiguous();  // kernels read plain arrays
    Tensor y = mt::empty(a.shape(), a.dtype(), a.device());
    mt::kernel<SwiGLUForwardFn>(name, mt::Phase::Forward, a.device())(ac, bc, y);
    ctx.save_for_backward({ac, bc});
    return y;
  }

  static mt::GradList backward(mt::Context& ctx, const mt::GradList& dys) {
    auto saved = ctx.saved_tensors();
    const Tensor &a = saved[0], &b = saved[1];
    const Tensor dy = dys[0].contiguous();  // upstream gradients may be strided views
    Tensor da, db;
    if (ctx.needs_input_grad(0)) da = mt::empty(a.shape(), a.dtype(), a.device());
    if (ctx.needs_input_grad(1)) db = mt::empty(b.shape(), b.dtype(), b.device());
    mt::kernel<SwiGLUBackwardFn>(name, mt::Phase::Backward, a.device())(a, b, dy, da, db);
    return {da, db};  // one per forward argument
  }
};

// ---- CPU reference kernels: plain loops, math in acc_t (fp32, or f64 for f64 inputs) ------

inline void forward_cpu(const Tensor& a, const Tensor& b, const Tensor& y) {
  MT_DISPATCH_FLOATING(a.dtype(), "swiglu", [&] {
    using acc = mt::cpu::acc_t<scalar_t>;
    const scalar_t *ap = a.data<scalar_t>(), *bp = b.data<scalar_t>();
    scalar_t* yp = y.data<scalar_t>();
    for (int64_t i = 0; i < a.numel(); ++i) {
      const acc av = mt::cpu::to_acc(ap[i]), s = acc(1) / (acc(1) + std::exp(-av));
      yp[i] = mt::cpu::from_acc<scalar_t>(av * s * mt::cpu::to_acc(bp[i]));
    }
  });
}

inline void backward_cpu(const Tensor& a, const Tensor& b, const Tensor& dy, const Tensor& da,
                         const Tensor& db) {
  MT_DISPATCH_FLOATING(a.dtype(), "swiglu", [&] {
    using acc = mt::cpu::acc_t<scalar_t>;
    const scalar_t *ap = a.data<scalar_t>(), *bp = b.data<scalar_t>(), *gp = dy.data<scalar_t>();
    scalar_t* dap = da.defined() ? da.data<scalar_t>() : nullptr;
    scalar_t* dbp = db.defined() ? db.data<scalar_t>() : nullptr;
    for (int64_t i = 0; i < a.numel(); ++i) {
      const acc av = mt::cpu::to_acc(ap[i]), g = mt::cpu::to_acc(gp[i]);
      const acc s = acc(1) / (acc(1) + std::exp(-av));  // recomputed, not saved
      if (dap) dap[i] = mt::cpu::from_acc<scalar_t>(g * mt::cpu::to_acc(bp[i]) * (s + av * s * (acc(1) - s)));
      if (dbp) dbp[i] = mt::cpu::from_acc<scalar_t>(g * av * s);
    }
  });
}

// The op users call.
inline Tensor swiglu(const Tensor& a, const Tensor& b) { return SwiGLUFn::apply(a, b); }

// Registered once per program however many files include this header (the _IN_HEADER macros
// define inline variables). verify_ops() then checks, at startup, that a CUDA build also has
// swiglu.cu's kernels with these signatures.
MT_DEFINE_OP_IN_HEADER(swiglu, "y = silu(a)*b; da = dy*b*(s + a*s*(1-s)), db = dy*a*s",
                       SwiGLUForwardFn, SwiGLUBackwardFn);
MT_REGISTER_KERNEL_IN_HEADER(swiglu, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL_IN_HEADER(swiglu, Backward, CPU, backward_cpu);

}  // namespace swiglu_example
