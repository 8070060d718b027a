// Views along any dimension: narrow, permute, split and chunk (declared in core/tensor.h), what
// wiring attention heads by hand needs (minitrain's GPT does it in two kernels instead,
// ops/heads and attention_packed). A model could split its [B, T, 3C] projection into q, k, v
// as [B, H, T, d] and merge the heads back:
//
//   q, k, v = qkv.view({B, T, 3, H, d}).permute({2, 0, 3, 1, 4}).contiguous().chunk(3, 0)
//             (each [1, B, H, T, d]: .view({B, H, T, d}))
//   merged  = y.permute({0, 2, 1, 3}).contiguous().view({B, T, C})     (y [B, H, T, d])
//
// Each output shares its input's storage (no copy, as in PyTorch); contiguous() makes the one
// copy a kernel needs, with the strided gather Tensor already has on both devices. When the input
// needs a gradient each call is one graph node, whose backward is:
//
//   narrow(x, d, s, n)   dx = 0 except dx[..., s:s+n, ...] = dy           ('=' into a new tensor)
//   permute(x, p)        dx = permute(dy, p⁻¹)                              (a view of dy, no copy)
//   split(x, sizes, d)   dx[..., o_k:o_k+n_k, ...] = dy_k for every part k ('=' into one new
//                        tensor; zero only for the parts that received no gradient)
//
// The engine adds what they return into .grad (+=), so none needs a grad sink. split is one
// node for all its parts on purpose: three narrows would each fill a full-size zero gradient and
// the engine would sum the three, where split writes each element of dx once.
//
// Nothing here reads a value on the host: the backwards are a fill and strided copies on the
// framework stream, so they capture into a CUDA graph.
#include "core/autograd.h"
#include "core/error.h"
#include "core/tensor.h"

namespace mt {
namespace {

bool recording(const Tensor& t) { return GradMode::is_enabled() && t.requires_grad(); }

int64_t wrap_dim(const char* op, int64_t d, const Tensor& x) {
  const int64_t n = x.dim();
  MT_CHECK(d >= -n && d < n, op, ": dim ", d, " out of range for shape ", shape_str(x.shape()));
  return d < 0 ? d + n : d;
}

Tensor view_of(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl().storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(impl);
}

// The plain views, with checked (and wrapped) arguments.
Tensor narrow_view(const Tensor& x, int64_t d, int64_t start, int64_t length) {
  Shape shape = x.shape();
  shape[size_t(d)] = length;
  return view_of(x, shape, x.strides(), x.offset() + start * x.strides()[size_t(d)]);
}

Tensor permute_view(const Tensor& x, const Shape& dims) {
  Shape shape(dims.size()), strides(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    shape[i] = x.shape()[size_t(dims[i])];
    strides[i] = x.strides()[size_t(dims[i])];
  }
  return view_of(x, shape, strides, x.offset());
}

// dims wrapped to [0, n), or an error unless they are a permutation of 0..n-1.
Shape checked_permutation(const Tensor& x, const Shape& dims) {
  MT_CHECK(int64_t(dims.size()) == x.dim(), "permute: ", shape_str(dims), " has ", dims.size(),
           " dims but the tensor has shape ", shape_str(x.shape()));
  Shape p(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    p[i] = wrap_dim("permute", dims[i], x);
    MT_CHECK(!seen[size_t(p[i])], "permute: dim ", dims[i], " appears twice in ", shape_str(dims));
    seen[size_t(p[i])] = true;
  }
  return p;
}

struct NarrowFn : Function<NarrowFn> {
  static constexpr const char* name = "narrow";
  static Tensor forward(Context& ctx, const Tensor& x, int64_t d, int64_t start, int64_t length) {
    ctx.set("shape", x.shape());
    ctx.set("dim", d);
    ctx.set("start", start);
    return narrow_view(x, d, start, length);
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    Tensor dx = zeros(ctx.get<Shape>("shape"), dy[0].dtype(), dy[0].device());
    const int64_t d = ctx.get<int64_t>("dim");
    narrow_view(dx, d, ctx.get<int64_t>("start"), dy[0].size(d)).copy_(dy[0]);
    return {dx, Tensor(), Tensor(), Tensor()};
  }
};

struct PermuteFn : Function<PermuteFn> {
  static constexpr const char* name = "permute";
  static Tensor forward(Context& ctx, const Tensor& x, const Shape& dims) {
    Shape inverse(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) inverse[size_t(dims[i])] = int64_t(i);
    ctx.set("inverse", inverse);
    return permute_view(x, dims);
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    return {permute_view(dy[0], ctx.get<Shape>("inverse")), Tensor()};
  }
};

struct SplitFn : Function<SplitFn> {
  static constexpr const char* name = "split";
  static std::vector<Tensor> forward(Context& ctx, const Tensor& x,
                                     const std::vector<int64_t>& sizes, int64_t d) {
    ctx.set("shape", x.shape());
    ctx.set("sizes", sizes);
    ctx.set("dim", d);
    std::vector<Tensor> parts;
    int64_t start = 0;
    for (int64_t n : sizes) {
      parts.push_back(narrow_view(x, d, start, n));
      start += n;
    }
    return parts;
  }
  static GradList backward(Context& ctx, const GradList& dys) {
    const auto sizes = ctx.get<std::vector<int64_t>>("sizes");
    const int64_t d = ctx.get<int64_t>("dim");
    const Tensor* some = nullptr;  // at least one part received a gradient, or backward would not run
    bool all = true;
    for (const Tensor& g : dys) {
      if (g.defined()) some = &g;
      all = all && g.defined();
    }
    const Shape shape = ctx.get<Shape>("shape");
    // Every element is written below when every part has a gradient: no fill needed then.
    Tensor dx = all ? empty(shape, some->dtype(), some->device())
                    : zeros(shape, some->dtype(), some->device());
    int64_t start = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      if (dys[k].defined()) narrow_view(dx, d, start, sizes[k]).copy_(dys[k]);
      start += sizes[k];
    }
    return {dx, Tensor(), Tensor()};
  }
};

}  // namespace

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  const int64_t d = wrap_dim("narrow", dim, *this);
  MT_CHECK(start >= 0 && length >= 0 && start <= size(d) - length, "narrow: [", start, ", ",
           start, " + ", length, ") out of range for dim ", dim, " of shape ", shape_str(shape()));
  if (recording(*this)) return NarrowFn::apply(*this, d, start, length);
  return narrow_view(*this, d, start, length);
}

Tensor Tensor::permute(const Shape& dims) const {
  const Shape p = checked_permutation(*this, dims);
  if (recording(*this)) return PermuteFn::apply(*this, p);
  return permute_view(*this, p);
}

std::vector<Tensor> Tensor::split(const std::vector<int64_t>& sizes, int64_t dim) const {
  const int64_t d = wrap_dim("split", dim, *this);
  MT_CHECK(!sizes.empty(), "split: no sizes given for dim ", dim, " of shape ", shape_str(shape()));
  int64_t total = 0;
  for (int64_t n : sizes) MT_CHECK(n >= 0, "split: negative size ", n, " in ", shape_str(sizes));
  for (int64_t n : sizes) {  // checked before adding: huge sizes must not wrap around
    MT_CHECK(n <= size(d) - total, "split: sizes ", shape_str(sizes), " add up to more than dim ",
             dim, " of shape ", shape_str(shape()), " has (", size(d), ")");
    total += n;
  }
  MT_CHECK(total == size(d), "split: sizes ", shape_str(sizes), " add up to ", total, " but dim ",
           dim, " of shape ", shape_str(shape()), " has ", size(d));
  if (recording(*this)) return SplitFn::apply(*this, sizes, d);
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t n : sizes) {
    parts.push_back(narrow_view(*this, d, start, n));
    start += n;
  }
  return parts;
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim) const {
  const int64_t d = wrap_dim("chunk", dim, *this);
  MT_CHECK(chunks >= 1 && size(d) % chunks == 0, "chunk: ", chunks, " chunks do not divide dim ",
           dim, " of shape ", shape_str(shape()), " evenly");
  return split(std::vector<int64_t>(size_t(chunks), size(d) / chunks), d);
}

}  // namespace mt
