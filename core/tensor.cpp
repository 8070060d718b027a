#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/rng.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/runtime.h"
#include "core/cuda/tensor_copy_cuda.h"
#include "core/cuda/tensor_ops.h"
#endif

namespace mt {

// ---- shapes -------------------------------------------------------------------------------

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The count of `s`; errors name `shown` (what the caller was given, e.g. view's shape with -1).
static int64_t checked_numel(const Shape& s, const char* call, const Shape& shown) {
  // The product of the non-zero dimensions must fit too: contiguous strides are formed from it.
  int64_t n = 1;
  bool empty = false;
  for (int64_t d : s) {
    MT_CHECK(d >= 0, call, ": negative dimension in shape ", shape_str(shown));
    empty = empty || d == 0;
    MT_CHECK(!__builtin_mul_overflow(n, std::max<int64_t>(d, 1), &n), call, ": shape ",
             shape_str(shown), " has more elements than an int64 can count");
  }
  return empty ? 0 : n;
}

int64_t numel_of(const Shape& s, const char* call) { return checked_numel(s, call, s); }

int64_t nbytes_of(const Shape& s, DType dtype, const char* call) {
  int64_t bytes = 0;
  MT_CHECK(!__builtin_mul_overflow(numel_of(s, call), int64_t(dtype_size(dtype)), &bytes), call,
           ": shape ", shape_str(s), " of ", dtype_name(dtype), " has more bytes than an int64 "
           "can count");
  return bytes;
}

static Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

// ---- element access -------------------------------------------------------------------------

double load_as_double(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f64: return static_cast<const double*>(base)[i];
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::bf16: return bf16_to_float(static_cast<const bf16*>(base)[i]);
    case DType::f16: return f16_to_float(static_cast<const f16*>(base)[i]);
    case DType::i32: return static_cast<const int32_t*>(base)[i];
    case DType::i64: return double(static_cast<const int64_t*>(base)[i]);
  }
  return 0;
}

void store_from_double(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f64: static_cast<double*>(base)[i] = v; break;
    case DType::f32: static_cast<float*>(base)[i] = float(v); break;
    // Two roundings (double -> float -> 16 bit) can differ from one in rare ties; values that
    // reach here from float (every kernel's output) round exactly once.
    case DType::bf16: static_cast<bf16*>(base)[i] = float_to_bf16(float(v)); break;
    case DType::f16: static_cast<f16*>(base)[i] = float_to_f16(float(v)); break;
    case DType::i32: static_cast<int32_t*>(base)[i] = saturate_to<int32_t>(v); break;
    case DType::i64: static_cast<int64_t*>(base)[i] = saturate_to<int64_t>(v); break;
  }
}

// ---- Tensor basics ------------------------------------------------------------------------

TensorImpl& Tensor::impl() const {
  MT_CHECK(impl_, "Tensor: use of an undefined tensor (default-constructed or a missing gradient)");
  return *impl_;
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  MT_CHECK(d >= -n && d < n, "Tensor::size: dim ", d, " out of range for shape ", shape_str(shape()));
  return shape()[d < 0 ? d + n : d];
}

bool Tensor::is_contiguous() const { return strides() == contiguous_strides(shape()) || numel() <= 1; }

void* Tensor::data_ptr() const {
  return static_cast<char*>(impl().storage->data()) + offset() * int64_t(dtype_size(dtype()));
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<f16>() { return DType::f16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }

template <class T> T* Tensor::data() const {
  MT_CHECK(dtype() == dtype_of<T>(), "Tensor::data: tensor has dtype ", dtype_name(dtype()),
           ", asked for ", dtype_name(dtype_of<T>()));
  return static_cast<T*>(data_ptr());
}
template double* Tensor::data<double>() const;
template float* Tensor::data<float>() const;
template bf16* Tensor::data<bf16>() const;
template f16* Tensor::data<f16>() const;
template int32_t* Tensor::data<int32_t>() const;
template int64_t* Tensor::data<int64_t>() const;

static Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl().storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(impl);
}

// ---- differentiable views and copies ------------------------------------------------------
// When a gradient is needed, view/transpose/slice/contiguous/clone/to are recorded as graph nodes
// (their forwards run the plain versions below, under the NoGradGuard that Function::apply sets).

static bool recording(const Tensor& t) { return GradMode::is_enabled() && t.requires_grad(); }

namespace {
struct ViewFn : Function<ViewFn> {
  static constexpr const char* name = "view";
  static Tensor forward(Context& ctx, const Tensor& x, const Shape& shape) {
    ctx.set("shape", x.shape());
    return x.view(shape);
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    return {dy[0].reshape(ctx.get<Shape>("shape")), Tensor()};
  }
};
struct TransposeFn : Function<TransposeFn> {
  static constexpr const char* name = "transpose";
  static Tensor forward(Context& ctx, const Tensor& x, int64_t d0, int64_t d1) {
    ctx.set("d0", d0);
    ctx.set("d1", d1);
    return x.transpose(d0, d1);
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    return {dy[0].transpose(ctx.get<int64_t>("d0"), ctx.get<int64_t>("d1")), Tensor(), Tensor()};
  }
};
struct SliceRowsFn : Function<SliceRowsFn> {
  static constexpr const char* name = "slice_rows";
  static Tensor forward(Context& ctx, const Tensor& x, int64_t begin, int64_t end) {
    ctx.set("shape", x.shape());
    ctx.set("begin", begin);
    ctx.set("end", end);
    return x.slice_rows(begin, end);
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    // Rows outside the slice get zero gradient.
    Tensor g = zeros(ctx.get<Shape>("shape"), dy[0].dtype(), dy[0].device());
    g.slice_rows(ctx.get<int64_t>("begin"), ctx.get<int64_t>("end")).copy_(dy[0]);
    return {g, Tensor(), Tensor()};
  }
};
struct CopyFn : Function<CopyFn> {  // contiguous(), clone(), to(dtype), to(device)
  static constexpr const char* name = "copy";
  static Tensor forward(Context& ctx, const Tensor& x, int kind, DType dtype, Device device) {
    ctx.set("dtype", x.dtype());
    ctx.set("device", x.device());
    switch (kind) {
      case 0: return x.contiguous();
      case 1: return x.clone();
      case 2: return x.to(dtype);
      default: return x.to(device);
    }
  }
  static GradList backward(Context& ctx, const GradList& dy) {
    return {dy[0].to(ctx.get<DType>("dtype")).to(ctx.get<Device>("device")), Tensor(), Tensor(),
            Tensor()};
  }
};
}  // namespace

// Views made outside autograd (recorded through the Functions above when a gradient is needed).
Tensor Tensor::view(const Shape& new_shape) const {
  if (recording(*this)) return ViewFn::apply(*this, new_shape);
  Shape shape = new_shape;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MT_CHECK(infer < 0, "view: only one dimension can be -1, got ", shape_str(new_shape));
      infer = int(i);
      shape[i] = 1;
    }
  }
  const int64_t known = checked_numel(shape, "view", new_shape);
  if (infer >= 0) {
    MT_CHECK(known > 0 && numel() % known == 0, "view: shape ", shape_str(new_shape),
             " is invalid for ", numel(), " elements of shape ", shape_str(this->shape()));
    shape[infer] = numel() / known;
  }
  MT_CHECK(infer >= 0 || known == numel(), "view: shape ", shape_str(new_shape), " is invalid for ",
           numel(), " elements of shape ", shape_str(this->shape()));
  MT_CHECK(is_contiguous(), "view: tensor of shape ", shape_str(this->shape()), " and strides ",
           shape_str(strides()), " is not contiguous; use reshape() (copies) instead");
  Tensor v = make_view(*this, shape, contiguous_strides(shape), offset());
  return v;
}

Tensor Tensor::reshape(const Shape& shape) const { return contiguous().view(shape); }

void Tensor::set_grad(const Tensor& g) {
  // As the engine would make it: backward adds into it as it is (an f16 .grad of an f32 leaf
  // silently lost the low bits of every sum).
  MT_CHECK(!g.defined() || (g.shape() == shape() && g.device() == device() &&
                            g.dtype() == grad_dtype_for(dtype()) && g.is_contiguous()),
           "set_grad: a gradient of shape ", shape_str(g.shape()), ", ", dtype_name(g.dtype()),
           g.is_contiguous() ? "" : ", strided,", " on ", g.device().str(),
           " for a tensor of shape ", shape_str(shape()), " on ", device().str(), " (its .grad: ",
           dtype_name(grad_dtype_for(dtype())), ", contiguous)");
  impl().grad = g.impl_;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  int64_t n = dim();
  MT_CHECK(d0 >= -n && d0 < n && d1 >= -n && d1 < n, "transpose: dims (", d0, ", ", d1,
           ") out of range for shape ", shape_str(shape()));
  if (recording(*this)) return TransposeFn::apply(*this, d0, d1);
  if (d0 < 0) d0 += n;
  if (d1 < 0) d1 += n;
  Shape sh = shape(), st = strides();
  std::swap(sh[d0], sh[d1]);
  std::swap(st[d0], st[d1]);
  return make_view(*this, sh, st, offset());
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MT_CHECK(dim() >= 1 && 0 <= begin && begin <= end && end <= shape()[0], "slice_rows: [", begin,
           ", ", end, ") out of range for shape ", shape_str(shape()));
  if (recording(*this)) return SliceRowsFn::apply(*this, begin, end);
  Shape sh = shape();
  sh[0] = end - begin;
  return make_view(*this, sh, strides(), offset() + begin * strides()[0]);
}

// Visits the storage offsets of a strided tensor in row-major order (CPU only).
template <class F>
static void for_each_offset(const Shape& shape, const Shape& strides, int64_t base, F&& f) {
  int64_t n = numel_of(shape);
  if (n == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  int64_t off = base;
  for (int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) { off += strides[d]; break; }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

// dst (contiguous, fresh) <- src (any strides/dtype) on the same device.
static void copy_same_device(const Tensor& src, const Tensor& dst) {
  if (src.device().is_cpu()) {
    const void* sbase = src.impl().storage->data();
    void* dbase = dst.data_ptr();
    if (src.is_contiguous() && src.dtype() == dst.dtype()) {
      std::memcpy(dbase, src.data_ptr(), src.nbytes());
      return;
    }
    DType st = src.dtype(), dt = dst.dtype();
    for_each_offset(src.shape(), src.strides(), src.offset(), [&](int64_t i, int64_t off) {
      store_from_double(dbase, dt, i, load_as_double(sbase, st, off));
    });
    return;
  }
#ifdef MT_WITH_CUDA
  // A contiguous source among f32/bf16/f16 (the per-microbatch cast of a batch to the compute
  // dtype) takes the vectorized cast: the same single rounding as the strided gather below, at
  // copy bandwidth instead of an index division per element.
  auto half_or_float = [](DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; };
  const int device = src.device().index;
  if (src.is_contiguous() && half_or_float(src.dtype()) && half_or_float(dst.dtype())) {
    cuda::set_device(device);
    cuda::cast(src.data_ptr(), src.dtype(), dst.data_ptr(), dst.dtype(), src.numel(),
               cuda::stream(device));
    return;
  }
  cuda::copy_strided(src.impl().storage->data(), src.dtype(), src.shape(), src.strides(),
                     src.offset(), dst.data_ptr(), dst.dtype(), device);
#endif
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  if (recording(*this)) return CopyFn::apply(*this, 0, dtype(), device());
  Tensor out = empty(shape(), dtype(), device());
  copy_same_device(*this, out);
  return out;
}

Tensor Tensor::clone() const {
  if (recording(*this)) return CopyFn::apply(*this, 1, dtype(), device());
  Tensor out = empty(shape(), dtype(), device());
  copy_same_device(*this, out);
  return out;
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  if (recording(*this)) return CopyFn::apply(*this, 2, t, device());
  Tensor out = empty(shape(), t, device());
  copy_same_device(*this, out);
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  if (recording(*this)) return CopyFn::apply(*this, 3, dtype(), d);
  Tensor src = contiguous();
  Tensor out = empty(shape(), dtype(), d);
#ifdef MT_WITH_CUDA
  if (src.device().is_cpu() && d.is_cuda()) {
    cuda::copy_h2d(out.data_ptr(), src.data_ptr(), src.nbytes(), d.index);
  } else if (src.device().is_cuda() && d.is_cpu()) {
    cuda::copy_d2h_sync(out.data_ptr(), src.data_ptr(), src.nbytes(), src.device().index);
  } else {
    // Between two GPUs: through the host keeps this simple; data parallelism uses NCCL instead.
    return src.to(kCPU).to(d);
  }
#else
  MT_THROW("Tensor::to: cannot move to ", d.str(), ": minitrain was built without CUDA");
#endif
  return out;
}

namespace {

// In-place writes are not recorded by autograd. Into a tensor of the graph (a leaf that requires
// grad, an op's output) a later backward would be silently wrong, its gradient flowing through
// values that are no longer there, so such a write is refused while gradients are recorded, as
// PyTorch refuses one into a leaf. The values copied from a source are only values: the
// destination gets no history (copy_ is dst.copy_(src.detach())).
void check_untracked_write(const char* op, const Tensor& dst) {
  MT_CHECK(!GradMode::is_enabled() || (!dst.requires_grad() && dst.grad_fn() == nullptr), op,
           ": the destination takes part in autograd (it requires grad or is an op's output), "
           "and an in-place write is not recorded; write under a NoGradGuard, or into a "
           "detach()ed tensor");
}

}  // namespace

const Tensor& Tensor::copy_(const Tensor& src) const {
  check_untracked_write("copy_", *this);
  MT_CHECK(src.shape() == shape(), "copy_: source shape ", shape_str(src.shape()),
           " does not match destination shape ", shape_str(shape()));
  Tensor s = src.device() == device() ? src : src.to(device());
  // A source that shares this storage (a.copy_(a.t())) would be read after parts of it were
  // written: staged through a copy of its own.
  if (s.impl().storage == impl().storage) s = s.clone();
  if (is_contiguous()) {
    copy_same_device(s, *this);
  } else {
    // Write into a strided destination through a contiguous staging copy.
    Tensor staged = s.to(dtype()).contiguous();
    void* dbase = impl().storage->data();
    const void* sp = staged.data_ptr();
    DType t = dtype();
    if (device().is_cpu()) {
      for_each_offset(shape(), strides(), offset(), [&](int64_t i, int64_t off) {
        store_from_double(dbase, t, off, load_as_double(sp, t, i));
      });
    } else {
#ifdef MT_WITH_CUDA
      cuda::copy_to_strided(sp, dbase, t, shape(), strides(), offset(), device().index);
#endif
    }
  }
  bump_version();
  return *this;
}

const Tensor& Tensor::fill_(double value) const {
  check_untracked_write("fill_", *this);
  if (device().is_cpu()) {
    void* base = impl().storage->data();
    DType t = dtype();
    for_each_offset(shape(), strides(), offset(),
                    [&](int64_t, int64_t off) { store_from_double(base, t, off, value); });
  } else {
#ifdef MT_WITH_CUDA
    MT_CHECK(is_contiguous(), "fill_: non-contiguous CUDA tensors are not supported");
    cuda::fill_tensor(data_ptr(), value, numel(), dtype(), device().index);
#endif
  }
  bump_version();
  return *this;
}

double Tensor::item() const {
  MT_CHECK(numel() == 1, "item: tensor of shape ", shape_str(shape()), " has ", numel(),
           " elements; item() needs exactly one");
  Tensor c = to(kCPU);
  return load_as_double(c.data_ptr(), c.dtype(), 0);
}

std::vector<double> Tensor::to_vector() const {
  Tensor c = to(kCPU).contiguous();
  std::vector<double> v(size_t(c.numel()));
  for (int64_t i = 0; i < c.numel(); ++i) v[size_t(i)] = load_as_double(c.data_ptr(), c.dtype(), i);
  return v;
}

// ---- autograd fields ----------------------------------------------------------------------

Tensor& Tensor::set_requires_grad(bool r) {
  MT_CHECK(!r || is_floating(dtype()), "set_requires_grad: only floating-point tensors can require "
           "gradients, got ", dtype_name(dtype()));
  MT_CHECK(is_leaf(), "set_requires_grad: can only be changed on a leaf tensor; use detach()");
  impl().requires_grad = r;
  return *this;
}

void Tensor::zero_grad(bool set_to_none) {
  if (!impl().grad) return;
  if (set_to_none) impl().grad.reset();
  else Tensor(impl().grad).fill_(0.0);
}

void Tensor::set_data(const Tensor& src) const {
  TensorImpl& me = impl();
  const TensorImpl& o = src.impl();
  me.storage = o.storage;
  me.shape = o.shape;
  me.strides = o.strides;
  me.offset = o.offset;
  me.dtype = o.dtype;
  if (me.grad) {
    Tensor g(me.grad);
    if (g.device() != src.device() || g.shape() != src.shape() ||
        g.dtype() != grad_dtype_for(src.dtype()))
      me.grad.reset();
  }
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), offset()); }

void Tensor::register_grad_ready_hook(std::function<void(const Tensor&)> hook) {
  MT_CHECK(is_leaf() && requires_grad(),
           "register_grad_ready_hook: only leaves that require grad have a .grad to watch");
  impl().grad_ready_hooks.push_back(std::move(hook));
}

// ---- printing -----------------------------------------------------------------------------

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  Tensor c = to(kCPU).contiguous();
  const int64_t n = c.numel();
  const bool abbreviate = n > 1000;  // like PyTorch: first and last 3 per dimension
  const bool integral = !is_floating(dtype());
  std::ostringstream os;
  os << "tensor(";
  std::vector<int64_t> st = contiguous_strides(c.shape());
  // Recursive printer over dimensions (depth is the tensor's rank, which is small).
  std::function<void(int64_t, int64_t)> rec = [&](int64_t d, int64_t base) {
    if (d == c.dim()) {
      double v = load_as_double(c.data_ptr(), c.dtype(), base);
      if (integral) os << int64_t(v);
      else os << std::fixed << std::setprecision(4) << v;
      return;
    }
    os << "[";
    int64_t len = c.shape()[d];
    for (int64_t i = 0; i < len; ++i) {
      if (abbreviate && len > 6 && i == 3) {
        os << "..., ";
        i = len - 3;
      }
      rec(d + 1, base + i * st[d]);
      if (i + 1 < len) os << ", ";
    }
    os << "]";
  };
  rec(0, 0);
  os << ", shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype())
     << ", device=" << device().str();
  if (requires_grad()) os << ", requires_grad=true";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

// ---- factories ----------------------------------------------------------------------------

Tensor empty(const Shape& shape, DType dtype, Device device) {
  const int64_t nbytes = nbytes_of(shape, dtype, "empty");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::allocate(size_t(nbytes), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(impl);
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

// Fills a CPU f64 buffer element by element, then converts/moves it.
template <class F>
static Tensor generate(const Shape& shape, DType dtype, Device device, F&& gen) {
  Tensor host = empty(shape, DType::f64, kCPU);
  double* p = host.data<double>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = gen(i);
  return host.to(dtype).to(device);
}

Tensor arange(int64_t n, DType dtype, Device device) {
  return generate({n}, dtype, device, [](int64_t i) { return double(i); });
}
Tensor rand(const Shape& shape, DType dtype, Device device) {
  auto& g = default_generator();
  return generate(shape, dtype, device, [&](int64_t) { return g.uniform(); });
}
Tensor randn(const Shape& shape, DType dtype, Device device) {
  auto& g = default_generator();
  return generate(shape, dtype, device, [&](int64_t) { return g.normal(); });
}

template <class T>
static Tensor from_values(const std::vector<T>& values, const Shape& shape, DType dtype, Device device) {
  MT_CHECK(int64_t(values.size()) == numel_of(shape, "from_vector"), "from_vector: ", values.size(),
           " values do not fill shape ", shape_str(shape));
  return generate(shape, dtype, device, [&](int64_t i) { return double(values[size_t(i)]); });
}
Tensor from_vector(const std::vector<double>& v, const Shape& s, DType t, Device d) { return from_values(v, s, t, d); }
Tensor from_vector(const std::vector<float>& v, const Shape& s, DType t, Device d) { return from_values(v, s, t, d); }
Tensor from_vector(const std::vector<int64_t>& v, const Shape& s, DType t, Device d) {
  MT_CHECK(int64_t(v.size()) == numel_of(s, "from_vector"), "from_vector: ", v.size(), " values do not fill shape ",
           shape_str(s));
  Tensor host = empty(s, DType::i64, kCPU);
  std::copy(v.begin(), v.end(), host.data<int64_t>());
  return host.to(t).to(d);
}

}  // namespace mt
