// embedding: the Function (the graph node's contract) and the CPU reference kernels.
// The math, the order of the scatter-add and what is saved are in embedding.h.
#include "ops/embedding/embedding.h"

#include <vector>

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"

namespace mt {
namespace {

struct EmbeddingFn : Function<EmbeddingFn> {
  static constexpr const char* name = "embedding";

  static Tensor forward(Context& ctx, const Tensor& ids, const Tensor& W) {
    MT_CHECK(ids.dtype() == DType::i64, "embedding: ids (shape ", shape_str(ids.shape()),
             ") must be i64, got ", dtype_name(ids.dtype()));
    MT_CHECK(W.dim() == 2 && is_floating(W.dtype()), "embedding: W must be a floating-point "
             "[rows, C] table, got shape ", shape_str(W.shape()), " ", dtype_name(W.dtype()));
    MT_CHECK(ids.device() == W.device(), "embedding: ids (shape ", shape_str(ids.shape()),
             ") is on ", ids.device().str(), " but W (shape ", shape_str(W.shape()), ") is on ",
             W.device().str());
    Tensor ic = ids.contiguous(), wc = W.contiguous();
    Shape out_shape = ids.shape();
    out_shape.push_back(W.size(1));
    Tensor y = empty(out_shape, W.dtype(), W.device());
    kernel<EmbeddingForwardFn>(name, Phase::Forward, W.device())(
        ic.view({ic.numel()}), wc, y.view({ic.numel(), W.size(1)}));
    ctx.save_for_backward({ic});
    ctx.set("W_shape", W.shape());
    ctx.set("W_dtype", W.dtype());
    return y;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    if (!ctx.needs_input_grad(1)) return {Tensor(), Tensor()};
    const Tensor ids = ctx.saved_tensors()[0];
    const Shape w_shape = ctx.get<Shape>("W_shape");
    const DType w_dtype = ctx.get<DType>("W_dtype");
    Tensor dy = dys[0].contiguous();  // upstream gradients may be strided views
    Tensor sink = ctx.grad_sink(1);   // W's .grad when W is a leaf: the kernel adds into it
    Tensor dW = sink.defined() ? sink : zeros(w_shape, grad_dtype_for(w_dtype), dy.device());
    kernel<EmbeddingBackwardFn>(name, Phase::Backward, dy.device())(
        ids.view({ids.numel()}), dy.view({ids.numel(), w_shape[1]}), dW);
    if (sink.defined()) return {Tensor(), Tensor()};  // already added into .grad
    return {Tensor(), dW.to(w_dtype)};  // ids (integers, no gradient), W
  }
};

// ---- CPU reference kernels ----------------------------------------------------------------

void forward_cpu(const Tensor& ids, const Tensor& W, const Tensor& y) {
  MT_DISPATCH_FLOATING(W.dtype(), "embedding", [&] {
    const int64_t n = ids.numel(), V = W.size(0), C = W.size(1);
    const int64_t* ip = ids.data<int64_t>();
    for (int64_t p = 0; p < n; ++p) {
      const int64_t id = ip[p];
      if (id < 0 || id >= V) MT_THROW(bad_id_message(p, id, V));
      const scalar_t* src = W.data<scalar_t>() + id * C;
      scalar_t* dst = y.data<scalar_t>() + p * C;
      for (int64_t c = 0; c < C; ++c) dst[c] = src[c];
    }
  });
}

// dW '+=' (the grad dtype): each row's positions are summed in increasing order, in double, and
// the total added once, so the bits do not depend on where in the batch the other ids sit.
void backward_cpu(const Tensor& ids, const Tensor& dy, const Tensor& dW) {
  MT_DISPATCH_FLOATING(dy.dtype(), "embedding", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t n = ids.numel(), V = dW.size(0), C = dW.size(1);
    const int64_t* ip = ids.data<int64_t>();
    std::vector<double> sum(size_t(V * C), 0.0);
    std::vector<bool> touched(size_t(V), false);
    for (int64_t p = 0; p < n; ++p) {
      const int64_t id = ip[p];
      if (id < 0 || id >= V) MT_THROW(bad_id_message(p, id, V));
      touched[size_t(id)] = true;
      const scalar_t* g = dy.data<scalar_t>() + p * C;
      for (int64_t c = 0; c < C; ++c) sum[size_t(id * C + c)] += double(cpu::to_acc(g[c]));
    }
    acc* out = dW.data<acc>();
    for (int64_t v = 0; v < V; ++v)
      if (touched[size_t(v)])
        for (int64_t c = 0; c < C; ++c) out[v * C + c] += acc(sum[size_t(v * C + c)]);
  });
}

}  // namespace

std::string bad_id_message(int64_t position, int64_t id, int64_t rows) {
  return detail::concat("embedding: position ", position, " has id ", id, ", outside [0, ", rows,
                        ") for a table of ", rows, " rows");
}

Tensor embedding(const Tensor& ids, const Tensor& W) { return EmbeddingFn::apply(ids, W); }

MT_DEFINE_OP(embedding, "y[p] = W[ids[p]]; dW[v] += sum_{p: ids[p] = v} dy[p] (in order of p)",
             EmbeddingForwardFn, EmbeddingBackwardFn);
MT_REGISTER_KERNEL(embedding, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL(embedding, Backward, CPU, backward_cpu);

}  // namespace mt
