#pragma once
// mt::Tensor: a cheap handle (a shared pointer) to a strided view of shared Storage, plus the
// autograd fields. Copying a Tensor copies the handle, never the data, as in PyTorch.
//
//   storage ─┬─ Tensor a  (shape [4, 3], strides [3, 1], offset 0)
//            └─ Tensor b = a.transpose(0, 1)  (shape [3, 4], strides [1, 3], offset 0)
//
// Kernels take contiguous inputs; ops call contiguous() first (a no-op when already contiguous).
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/storage.h"

namespace mt {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
// Element and byte counts of a shape. A negative dimension, or a count that overflows int64
// (an absurd shape would otherwise wrap around and under-allocate), is an mt::Error naming
// `call` and the shape.
int64_t numel_of(const Shape& s, const char* call = "numel");
int64_t nbytes_of(const Shape& s, DType dtype, const char* call);

class Tensor;
struct Node;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape, strides;  // strides in elements
  int64_t offset = 0;    // in elements
  DType dtype = DType::f32;

  // Autograd. A leaf is a tensor no recorded op produced (grad_fn is empty).
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;      // leaf .grad: a buffer the leaf owns, accumulated with +=
  std::shared_ptr<Node> grad_fn;         // the op that produced this tensor (non-leaf)
  uint32_t output_nr = 0;                // which of grad_fn's outputs this tensor is
  std::weak_ptr<Node> grad_accumulator;  // a leaf's AccumulateGrad node, shared by all its uses
  // Called once per backward pass when this leaf's .grad has received every contribution of
  // that pass (the hook data parallelism uses to start reducing a gradient early).
  std::vector<std::function<void(const Tensor&)>> grad_ready_hooks;
  // Mixed precision: a parameter's copy in the compute dtype (bf16/f16) that GEMMs read. The
  // optimizer refreshes it in the same pass as the fp32 update (no separate cast per step).
  std::shared_ptr<TensorImpl> compute_copy;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t dim() const { return int64_t(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return numel_of(shape()); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  int64_t offset() const { return impl().offset; }
  bool is_contiguous() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }

  // Pointer to the first element (offset applied). data<T>() checks T against dtype().
  void* data_ptr() const;
  template <class T> T* data() const;

  // Views share storage. reshape copies only when the strides make a view impossible.
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor slice_rows(int64_t begin, int64_t end) const;  // rows [begin, end) of dim 0, a view
  // Views along any dimension (core/views.cpp, which gives each one's backward). A negative dim
  // counts from the end.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;  // [start, start + length)
  Tensor permute(const Shape& dims) const;  // out.size(i) = size(dims[i])
  // Consecutive parts of `dim` with the given sizes (they must add up to size(dim)), or `chunks`
  // equal parts (size(dim) must divide evenly): views recorded as one node with one output each.
  std::vector<Tensor> split(const std::vector<int64_t>& sizes, int64_t dim) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim) const;

  Tensor contiguous() const;            // this, or a contiguous copy
  Tensor clone() const;                 // always a fresh contiguous copy
  Tensor to(DType dtype) const;         // this when already that dtype
  Tensor to(Device device) const;       // this when already there
  // In-place writes are const: a Tensor is a handle, and writing through it does not change it.
  // They are not recorded by autograd: while it records (no NoGradGuard), a destination that
  // requires grad or is an op's output is an mt::Error; copy_ copies src's values, no history.
  const Tensor& copy_(const Tensor& src) const;  // same shape; converts dtype/device; bumps version
  const Tensor& fill_(double value) const;        // bumps version
  double item() const;                  // exactly one element, any dtype/device
  std::vector<double> to_vector() const;  // all elements in row-major order, as double

  // Autograd (see core/autograd.h for the engine).
  bool requires_grad() const { return impl().requires_grad; }
  Tensor& set_requires_grad(bool r = true);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  Tensor grad() const { return Tensor(impl().grad); }
  // g must have this tensor's shape and device (or be undefined: no gradient); the optimizers
  // read .grad element by element against the parameter.
  void set_grad(const Tensor& g);
  // Set to none (frees it; the default, as in PyTorch) or fill with zeros.
  void zero_grad(bool set_to_none = true);
  const std::shared_ptr<Node>& grad_fn() const { return impl().grad_fn; }
  Tensor detach() const;  // same storage, no history, requires_grad = false
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  void register_grad_ready_hook(std::function<void(const Tensor&)> hook);

  // Replaces this tensor's data (storage, shape, dtype, device) with `src`'s, keeping its
  // identity: every handle, the autograd leaf and its .grad hooks stay. Module::to(device) uses
  // it so a model's parameters move in place, as in PyTorch. Drops a .grad that no longer fits
  // (another device, shape or grad dtype).
  void set_data(const Tensor& src) const;
  Tensor compute_copy() const { return Tensor(impl().compute_copy); }
  void set_compute_copy(const Tensor& c) const { impl().compute_copy = c.impl_ptr(); }

  uint64_t version() const { return impl().storage->version(); }
  void bump_version() const { impl().storage->bump_version(); }

  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  std::string str() const;  // PyTorch-like: values (abbreviated when long), shape, dtype, device

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- factories ---------------------------------------------------------------------------
// Random factories draw from the default generator (core/rng.h), always on the CPU, and then
// copy to the device, so a seed gives the same numbers on every device.
Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = kCPU);
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = kCPU);
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = kCPU);
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = kCPU);
Tensor arange(int64_t n, DType dtype = DType::f32, Device device = kCPU);
Tensor rand(const Shape& shape, DType dtype = DType::f32, Device device = kCPU);   // U[0, 1)
Tensor randn(const Shape& shape, DType dtype = DType::f32, Device device = kCPU);  // N(0, 1)
Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                   DType dtype = DType::f32, Device device = kCPU);
Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                   DType dtype = DType::f32, Device device = kCPU);
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                   DType dtype = DType::i64, Device device = kCPU);

// ---- element access on the CPU -----------------------------------------------------------
// Reads/writes element i of a contiguous CPU buffer of dtype t, as double (exact for every dtype
// but i64 beyond 2^53, which labels never reach). Into i32 and i64 through saturate_to
// (core/dtype.h): toward zero, clamped, NaN to 0, as on the GPU.
double load_as_double(const void* base, DType t, int64_t i);
void store_from_double(void* base, DType t, int64_t i, double v);

}  // namespace mt
