#pragma once
// linear: y = x · Wᵀ + b, the layer of an MLP.
//
//   x [M, K] (leading dims flattened), W [N, K], b [N] (optional), y [M, N] in x's dtype.
//   W and b share one dtype: x's, or, for mixed precision, f32 master parameters of a bf16/f16 x.
//   Then the GEMM reads a compute-dtype copy of W (W_compute if given, refreshed by the optimizer;
//   else a cast made here), and the bias epilogue adds b rounded to x's dtype (b_compute if
//   given, the same rounding kept by the optimizer; else rounded here on every call). Passing
//   W_compute or b_compute when x and W already share a dtype is an error.
//
// Backward is two GEMMs and a reduce, with fp32 accumulation:
//   dX  = dY · W           [M, K]  '=' into a new tensor, x's dtype
//   dW += dYᵀ · X          [N, K]  '+=' straight into W's fp32 .grad (the grad sink: GEMM beta = 1)
//   db += Σ_rows dY        [N]     '+=' into b's fp32 .grad, fixed-order reduction
// The three are independent: in a CUDA graph capture of at most 512 rows, dW and db run on a
// side branch beside dX (linear.cu), so a replay overlaps them; eager runs them in order.
//
// Saved: x and W (both inputs; a GEMM cannot be cheaply recomputed from anything smaller).
#include "core/tensor.h"

namespace mt {

Tensor linear(const Tensor& x, const Tensor& W, const Tensor& b = Tensor(),
              const Tensor& W_compute = Tensor(), const Tensor& b_compute = Tensor());

// Kernels. x [M, K], W [N, K] in the compute dtype; b [N] in the grad dtype (f32, or f64 for
// f64 x), or for a bf16/f16 x possibly already in x's dtype (the rounded copy), or undefined;
// y [M, N] '='.
using LinearForwardFn = void(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& y);
// dx '=' (undefined: skip), dW '+=' [N, K] and db '+=' [N] in the grad dtype (undefined: skip).
using LinearBackwardFn = void(const Tensor& x, const Tensor& W, const Tensor& dy, const Tensor& dx,
                              const Tensor& dW, const Tensor& db);

// For ops built from linear layers (ops/gelu_mlp): linear's argument rules, as an mt::Error that
// names `op`; the W and b the GEMM reads (W in x's dtype, contiguous; the bias its epilogue adds);
// and x [..., K] as the matrix [M, K] its leading dimensions flatten into (x contiguous).
void check_linear_args(const char* op, const Tensor& x, const Tensor& W, const Tensor& b,
                       const Tensor& W_compute, const Tensor& b_compute);
// The same rules for a layer whose input is not a tensor yet (a fused op's hidden activation):
// its shape, dtype and device, and the names the messages give the three operands.
struct LinearInput {
  Shape shape;
  DType dtype;
  Device device;
  const char *x = "x", *W = "W", *b = "b";
};
void check_linear_args(const char* op, const LinearInput& in, const Tensor& W, const Tensor& b,
                       const Tensor& W_compute, const Tensor& b_compute);
struct LinearOperands {
  Tensor W, b;
};
LinearOperands linear_operands(const Tensor& x, const Tensor& W, const Tensor& b,
                               const Tensor& W_compute, const Tensor& b_compute);
Tensor as_matrix(const Tensor& x);

}  // namespace mt
