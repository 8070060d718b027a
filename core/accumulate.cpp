#include "core/accumulate.h"

#include "core/error.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/tensor_ops.h"
#include "core/cuda/runtime.h"
#endif

namespace mt {

void add_into(const Tensor& dst, const Tensor& src) {
  MT_CHECK(dst.shape() == src.shape() && dst.device() == src.device(), "add_into: cannot add ",
           shape_str(src.shape()), " on ", src.device().str(), " into ", shape_str(dst.shape()),
           " on ", dst.device().str());
  MT_CHECK(dst.is_contiguous(), "add_into: destination must be contiguous");
  Tensor s = src.to(dst.dtype()).contiguous();
  const int64_t n = dst.numel();
  if (dst.device().is_cpu()) {
    void* d = dst.data_ptr();
    const void* p = s.data_ptr();
    DType t = dst.dtype();
    if (t == DType::f32) {
      float* df = static_cast<float*>(d);
      const float* sf = static_cast<const float*>(p);
      for (int64_t i = 0; i < n; ++i) df[i] += sf[i];
    } else if (t == DType::f64) {
      double* dd = static_cast<double*>(d);
      const double* sd = static_cast<const double*>(p);
      for (int64_t i = 0; i < n; ++i) dd[i] += sd[i];
    } else {
      for (int64_t i = 0; i < n; ++i)
        store_from_double(d, t, i, load_as_double(d, t, i) + load_as_double(p, t, i));
    }
  } else {
#ifdef MT_WITH_CUDA
    cuda::set_device(dst.device().index);
    cuda::axpy(1.0f, s.data_ptr(), dst.data_ptr(), n, dst.dtype(), cuda::stream(dst.device().index));
#endif
  }
  dst.bump_version();
}

Tensor sum_of(const Tensor& a, const Tensor& b) {
  Tensor out = a.clone();
  add_into(out, b);
  return out;
}

}  // namespace mt
