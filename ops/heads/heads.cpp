// split_heads and merge_heads: the Functions (the graph nodes' contract) and the CPU kernel.
// The math and the grid are in heads.h.
#include "ops/heads/heads.h"

#include <cstring>

#include "core/autograd.h"
#include "core/registry.h"

namespace mt {
namespace {

void check_heads(const char* op, const Tensor& t) {
  MT_CHECK(t.dim() == 4 && is_floating(t.dtype()), op, ": heads must be a floating-point [B, H, "
           "T, d] tensor, got ", shape_str(t.shape()), " ", dtype_name(t.dtype()));
}

struct SplitHeadsFn : Function<SplitHeadsFn> {
  static constexpr const char* name = "split_heads";

  static std::vector<Tensor> forward(Context& ctx, const Tensor& qkv, int64_t n_head) {
    MT_CHECK(qkv.dim() == 3 && is_floating(qkv.dtype()), "split_heads: qkv must be a "
             "floating-point [B, T, 3*C] tensor, got ", shape_str(qkv.shape()), " ",
             dtype_name(qkv.dtype()));
    MT_CHECK(n_head >= 1 && qkv.size(2) % (3 * n_head) == 0, "split_heads: the last dimension ",
             qkv.size(2), " is not 3 * n_head * d for n_head = ", n_head);
    const int64_t B = qkv.size(0), T = qkv.size(1), d = qkv.size(2) / (3 * n_head);
    std::vector<Tensor> heads;
    for (int p = 0; p < 3; ++p) heads.push_back(empty({B, n_head, T, d}, qkv.dtype(), qkv.device()));
    kernel<HeadsCopyFn>(name, Phase::Forward, qkv.device())(qkv.contiguous(), heads, true);
    ctx.set("shape", qkv.shape());
    return heads;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    const Shape shape = ctx.get<Shape>("shape");
    const Tensor* any = nullptr;  // a gradient that arrived: its shape is every part's
    for (const Tensor& g : dys) any = g.defined() ? &g : any;
    std::vector<Tensor> parts;
    for (const Tensor& g : dys)
      parts.push_back(g.defined() ? g.contiguous() : zeros(any->shape(), any->dtype(), any->device()));
    Tensor dqkv = empty(shape, any->dtype(), any->device());
    kernel<HeadsCopyFn>(name, Phase::Backward, dqkv.device())(dqkv, parts, false);
    return {dqkv, Tensor()};  // qkv, n_head (not differentiable)
  }
};

struct MergeHeadsFn : Function<MergeHeadsFn> {
  static constexpr const char* name = "merge_heads";

  static Tensor forward(Context& ctx, const Tensor& y) {
    check_heads("merge_heads", y);
    Tensor out = empty({y.size(0), y.size(2), y.size(1) * y.size(3)}, y.dtype(), y.device());
    kernel<HeadsCopyFn>(name, Phase::Forward, y.device())(out, {y.contiguous()}, false);
    ctx.set("shape", y.shape());  // [B, H, T, d]: H is not recoverable from out's [B, T, C]
    return out;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    const Tensor dout = dys[0].contiguous();
    Tensor dy = empty(ctx.get<Shape>("shape"), dout.dtype(), dout.device());
    kernel<HeadsCopyFn>(name, Phase::Backward, dout.device())(dout, {dy}, true);
    return {dy};
  }
};

// ---- CPU kernel -----------------------------------------------------------------------------
// Bytes moved row by row (d elements at a time): a permutation needs no arithmetic.
void heads_copy_cpu(const Tensor& packed, const std::vector<Tensor>& heads, bool to_heads) {
  const int64_t P = int64_t(heads.size()), B = heads[0].size(0), H = heads[0].size(1),
                T = heads[0].size(2), d = heads[0].size(3);
  const size_t row = size_t(d) * dtype_size(packed.dtype());
  auto* base = static_cast<char*>(packed.data_ptr());
  for (int64_t p = 0; p < P; ++p) {
    auto* hp = static_cast<char*>(heads[size_t(p)].data_ptr());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          char* head_row = hp + size_t((b * H + h) * T + t) * row;
          char* packed_row = base + size_t(((b * T + t) * P + p) * H + h) * row;
          if (to_heads) std::memcpy(head_row, packed_row, row);
          else std::memcpy(packed_row, head_row, row);
        }
  }
}

}  // namespace

std::vector<Tensor> split_heads(const Tensor& qkv, int64_t n_head) {
  return SplitHeadsFn::apply(qkv, n_head);
}

Tensor merge_heads(const Tensor& y) { return MergeHeadsFn::apply(y); }

MT_DEFINE_OP(split_heads, "q, k, v [B,H,T,d] = qkv [B,T,3*H*d] regrouped; dqkv = the inverse",
             HeadsCopyFn, HeadsCopyFn);
MT_DEFINE_OP(merge_heads, "out [B,T,H*d] = y [B,H,T,d] regrouped; dy = the inverse", HeadsCopyFn,
             HeadsCopyFn);
MT_REGISTER_KERNEL(split_heads, Forward, CPU, heads_copy_cpu);
MT_REGISTER_KERNEL(split_heads, Backward, CPU, heads_copy_cpu);
MT_REGISTER_KERNEL(merge_heads, Forward, CPU, heads_copy_cpu);
MT_REGISTER_KERNEL(merge_heads, Backward, CPU, heads_copy_cpu);

}  // namespace mt
