#pragma once
// Small differentiable elementwise ops and reductions: what tests, losses and the trainer glue
// need around the fused ops. Shapes must match exactly (no broadcasting: a mismatch is an error
// naming both shapes).
//
//   add(a, b, alpha)  out = a + alpha·b      da = dy, db = alpha·dy            ('=' new tensors)
//   mul(a, b)         out = a·b              da = dy·b, db = dy·a
//   scale(x, c)       out = c·x              dx = c·dy
//   relu(x)           out = max(x, 0)        dx = dy·[x > 0]   (saves x)
//   sum(x)            out = Σ x (0-dim)      dx = dy broadcast
//   mean(x)           out = Σ x / n          dx = dy / n broadcast
//   mse_loss(a, b)    mean((a − b)²)
// Reductions accumulate in double on the CPU and in fp32 (fixed order) on CUDA, whatever the
// input dtype, and return the input dtype. Backwards write '=' into new tensors in the input's
// dtype (add hands dy itself on); the engine adds them into .grad (no grad sinks here).
#include "core/tensor.h"

namespace mt {

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double c);
Tensor relu(const Tensor& x);
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
Tensor mse_loss(const Tensor& a, const Tensor& b);

// Kernels (contiguous inputs, caller-allocated outputs written with '=').
using AddFn = void(const Tensor& a, const Tensor& b, double alpha, const Tensor& out);
using MulFn = void(const Tensor& a, const Tensor& b, const Tensor& out);
using ScaleFn = void(const Tensor& x, double c, const Tensor& out);
using ReluForwardFn = void(const Tensor& x, const Tensor& y);
using ReluBackwardFn = void(const Tensor& x, const Tensor& dy, const Tensor& dx);
using SumFn = void(const Tensor& x, const Tensor& out);              // out: one element
using BroadcastFn = void(const Tensor& scalar, double c, const Tensor& out);  // out[:] = c·scalar

}  // namespace mt
