// linear: the Function (the graph node's contract) and the CPU reference kernels.
// The math, the mixed-precision rule and what is saved are in linear.h.
#include "ops/linear/linear.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/autograd.h"
#include "core/registry.h"

namespace mt {
namespace {

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }

}  // namespace

Tensor as_matrix(const Tensor& t) {
  Shape lead(t.shape().begin(), t.shape().end() - 1);
  return t.view({numel_of(lead), t.size(-1)});
}

// The dtype rule: the GEMM runs in x's dtype. W (and b, which shares W's dtype) is either x's
// dtype or, under mixed precision, the fp32 master copy of the weights of a bf16/f16 x; then
// W_compute, when given, is the x-dtype copy of W the optimizer keeps fresh.
void check_linear_args(const char* op, const LinearInput& in, const Tensor& W, const Tensor& b,
                       const Tensor& W_compute, const Tensor& b_compute) {
  const std::string x = in.x, w = in.W, bn = in.b, xs = shape_str(in.shape);
  const std::string ws = W.defined() ? shape_str(W.shape()) : "undefined";
  MT_CHECK(!in.shape.empty() && is_floating(in.dtype), op, ": ", x, " must be a floating-point "
           "tensor with at least one dimension, got shape ", xs, " ", dtype_name(in.dtype));
  MT_CHECK(W.defined() && W.dim() == 2, op, ": ", w, " must be [out_features, in_features], got "
           "shape ", ws);
  MT_CHECK(in.shape.back() == W.size(1), op, ": ", x, " has shape ", xs, " but ", w,
           " has shape ", ws, "; ", x, "'s last dimension must equal ", w, "'s second");
  MT_CHECK(in.device == W.device(), op, ": ", x, " (shape ", xs, ") is on ", in.device.str(),
           " but ", w, " (shape ", ws, ") is on ", W.device().str());
  const bool mixed = in.dtype != W.dtype();
  MT_CHECK(!mixed || (is_16bit(in.dtype) && W.dtype() == DType::f32), op, ": ", x, " (shape ",
           xs, ") is ", dtype_name(in.dtype), " but ", w, " (shape ", ws, ") is ",
           dtype_name(W.dtype()), "; ", w, " must be ", x, "'s dtype, or f32 master weights for a "
           "bf16/f16 ", x);
  if (b.defined()) {
    MT_CHECK(b.dim() == 1 && b.size(0) == W.size(0), op, ": ", bn, " has shape ",
             shape_str(b.shape()), " but ", w, " has shape ", ws, "; ", bn, " must be [",
             W.size(0), "]");
    MT_CHECK(b.dtype() == W.dtype(), op, ": ", bn, " (shape ", shape_str(b.shape()), ") is ",
             dtype_name(b.dtype()), " but ", w, " (shape ", ws, ") is ", dtype_name(W.dtype()),
             "; ", bn, " must be ", w, "'s dtype");
    MT_CHECK(b.device() == W.device(), op, ": ", bn, " (shape ", shape_str(b.shape()), ") is on ",
             b.device().str(), " but ", w, " (shape ", ws, ") is on ", W.device().str());
  }
  if (W_compute.defined()) {
    MT_CHECK(mixed, op, ": ", w, "_compute was given but ", x, " and ", w, " are both ",
             dtype_name(in.dtype), "; it is the bf16/f16 copy of f32 master weights, for mixed "
             "precision only");
    MT_CHECK(W_compute.shape() == W.shape() && W_compute.dtype() == in.dtype, op, ": ", w,
             "_compute has shape ", shape_str(W_compute.shape()), " ",
             dtype_name(W_compute.dtype()), " but must be ", w, "'s shape ", ws, " in ", x,
             "'s dtype ", dtype_name(in.dtype));
    MT_CHECK(W_compute.device() == W.device(), op, ": ", w, "_compute (shape ",
             shape_str(W_compute.shape()), ") is on ", W_compute.device().str(), " but ", w,
             " (shape ", ws, ") is on ", W.device().str());
  }
  if (b_compute.defined()) {
    MT_CHECK(mixed && b.defined(), op, ": ", bn, "_compute was given without a bias, or with ", x,
             " and ", w, " both ", dtype_name(in.dtype), "; it is the bf16/f16 copy of an f32 "
             "bias, for mixed precision only");
    MT_CHECK(b_compute.shape() == b.shape() && b_compute.dtype() == in.dtype &&
                 b_compute.device() == b.device(),
             op, ": ", bn, "_compute has shape ", shape_str(b_compute.shape()), " ",
             dtype_name(b_compute.dtype()), " on ", b_compute.device().str(), " but must be ", bn,
             "'s shape ", shape_str(b.shape()), " in ", x, "'s dtype ", dtype_name(in.dtype),
             " on ", b.device().str());
  }
}

void check_linear_args(const char* op, const Tensor& x, const Tensor& W, const Tensor& b,
                       const Tensor& W_compute, const Tensor& b_compute) {
  MT_CHECK(x.defined(), op, ": x is undefined");
  check_linear_args(op, {x.shape(), x.dtype(), x.device()}, W, b, W_compute, b_compute);
}

// The GEMM reads W in x's dtype: W itself, the optimizer's compute copy, or a cast made here. The
// bias as the epilogue adds it: the optimizer's rounded copy, else b itself (the kernel rounds it
// to x's dtype, as the copy is rounded).
LinearOperands linear_operands(const Tensor& x, const Tensor& W, const Tensor& b,
                               const Tensor& W_compute, const Tensor& b_compute) {
  Tensor Wc = x.dtype() == W.dtype() ? W : W_compute.defined() ? W_compute : W.to(x.dtype());
  Tensor bc = b_compute.defined() ? b_compute.contiguous()
              : b.defined()       ? b.to(grad_dtype_for(x.dtype())).contiguous()
                                  : Tensor();
  return {Wc.contiguous(), bc};
}

namespace {

struct LinearFn : Function<LinearFn> {
  static constexpr const char* name = "linear";

  static Tensor forward(Context& ctx, const Tensor& x, const Tensor& W, const Tensor& b,
                        const Tensor& W_compute, const Tensor& b_compute) {
    check_linear_args(name, x, W, b, W_compute, b_compute);
    auto [Wc, bc] = linear_operands(x, W, b, W_compute, b_compute);
    Tensor xc = x.contiguous();
    Shape y_shape = x.shape();
    y_shape.back() = W.size(0);
    Tensor y = empty(y_shape, x.dtype(), x.device());
    kernel<LinearForwardFn>(name, Phase::Forward, x.device())(as_matrix(xc), Wc, bc, as_matrix(y));
    ctx.set("W_dtype", W.dtype());
    ctx.save_for_backward({xc, Wc});  // W as the GEMM read it
    return y;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    auto saved = ctx.saved_tensors();
    const Tensor &x = saved[0], &Wc = saved[1];
    const DType grad_dtype = grad_dtype_for(x.dtype());
    Tensor dy = dys[0].contiguous();  // upstream gradients may be strided views
    Tensor dx, dW, db, dW_sink, db_sink;
    if (ctx.needs_input_grad(0)) dx = empty(x.shape(), x.dtype(), x.device());
    // W's and b's .grad when they are leaves: the kernel adds straight into them.
    if (ctx.needs_input_grad(1)) {
      dW_sink = ctx.grad_sink(1);
      dW = dW_sink.defined() ? dW_sink : zeros(Wc.shape(), grad_dtype, x.device());
    }
    if (ctx.needs_input_grad(2)) {
      db_sink = ctx.grad_sink(2);
      db = db_sink.defined() ? db_sink : zeros({Wc.size(0)}, grad_dtype, x.device());
    }
    kernel<LinearBackwardFn>(name, Phase::Backward, x.device())(
        as_matrix(x), Wc, as_matrix(dy), dx.defined() ? as_matrix(dx) : Tensor(), dW, db);
    // A sunk gradient is already in .grad; a returned one takes its argument's dtype.
    const DType param_dtype = ctx.get<DType>("W_dtype");
    if (dW.defined()) dW = dW_sink.defined() ? Tensor() : dW.to(param_dtype);
    if (db.defined()) db = db_sink.defined() ? Tensor() : db.to(param_dtype);
    return {dx, dW, db, Tensor(), Tensor()};  // x, W, b, W_compute and b_compute (no gradient)
  }
};

// ---- CPU reference kernels ----------------------------------------------------------------

// C [m, n] = A·B + beta·C in row-major storage, A [m, k] (stored [k, m] when trans_a) and
// B [k, n] (stored [n, k] when trans_b), through CBLAS.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, const T* b,
          T beta, T* c) {
  MT_CHECK(std::max({m, n, k}) <= INT_MAX, "linear: GEMM of ", m, " x ", n, " x ", k,
           " exceeds CBLAS's int dimensions");
  auto ld = [](int64_t cols) { return int(std::max<int64_t>(cols, 1)); };  // BLAS wants >= 1
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const int lda = ld(trans_a ? m : k), ldb = ld(trans_b ? k : n), ldc = ld(n);
  if constexpr (std::is_same_v<T, double>)
    cblas_dgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), 1.0, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_sgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), 1.0f, a, lda, b, ldb, beta, c, ldc);
}

// f64 and f32: x, W, y and b all of type T.
template <class T>
void forward_typed(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = W.size(0);
  T* yp = y.data<T>();
  gemm<T>(false, true, M, N, K, x.data<T>(), W.data<T>(), T(0), yp);  // y = x·Wᵀ
  if (!b.defined()) return;
  const T* bp = b.data<T>();
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) yp[i * N + j] += bp[j];
}

void forward_cpu(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& y) {
  if (is_16bit(x.dtype())) {
    // The fp32 GEMM on upcast copies (exact), its result rounded once.
    Tensor y32 = empty(y.shape(), DType::f32);
    forward_cpu(x.to(DType::f32), W.to(DType::f32), b.defined() ? b.to(DType::f32) : b, y32);
    y.copy_(y32);
  } else if (x.dtype() == DType::f64) {
    forward_typed<double>(x, W, b, y);
  } else {
    forward_typed<float>(x, W, b, y);
  }
}

// Accumulation, in T (f32 or f64; 16-bit inputs arrive upcast to f32): dx '=' (GEMM beta 0);
// dW '+=' (GEMM beta 1) and db '+=' into the .grad sinks or fresh zeros.
template <class T>
void backward_typed(const Tensor& x, const Tensor& W, const Tensor& dy, const Tensor& dx,
                    const Tensor& dW, const Tensor& db) {
  const int64_t M = x.size(0), K = x.size(1), N = W.size(0);
  const T* dyp = dy.data<T>();
  // dx = dy·W
  if (dx.defined()) gemm<T>(false, false, M, K, N, dyp, W.data<T>(), T(0), dx.data<T>());
  // dW += dyᵀ·x, beta = 1: dW is W's .grad when it is a sink; beta = 0 would drop earlier
  // microbatches.
  if (dW.defined()) gemm<T>(true, false, N, K, M, dyp, x.data<T>(), T(1), dW.data<T>());
  if (db.defined()) {
    std::vector<double> col_sums(size_t(N), 0.0);  // fixed row order: the same bits every run
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) col_sums[size_t(j)] += double(dyp[i * N + j]);
    T* dbp = db.data<T>();
    for (int64_t j = 0; j < N; ++j) dbp[j] += T(col_sums[size_t(j)]);  // '+=', as for dW
  }
}

void backward_cpu(const Tensor& x, const Tensor& W, const Tensor& dy, const Tensor& dx,
                  const Tensor& dW, const Tensor& db) {
  if (is_16bit(x.dtype())) {
    // fp32 GEMMs on upcast copies: dW and db are fp32 already, dx is rounded once.
    Tensor dx32 = dx.defined() ? empty(dx.shape(), DType::f32) : Tensor();
    backward_cpu(x.to(DType::f32), W.to(DType::f32), dy.to(DType::f32), dx32, dW, db);
    if (dx.defined()) dx.copy_(dx32);
  } else if (x.dtype() == DType::f64) {
    backward_typed<double>(x, W, dy, dx, dW, db);
  } else {
    backward_typed<float>(x, W, dy, dx, dW, db);
  }
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& W_compute,
              const Tensor& b_compute) {
  return LinearFn::apply(x, W, b, W_compute, b_compute);
}

MT_DEFINE_OP(linear, "y = x*W^T + b; dx = dy*W, dW += dy^T*x, db += sum_rows(dy)",
             LinearForwardFn, LinearBackwardFn);
MT_REGISTER_KERNEL(linear, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL(linear, Backward, CPU, backward_cpu);

}  // namespace mt
