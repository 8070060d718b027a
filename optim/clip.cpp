#include "optim/clip.h"

#include <cmath>

#include "core/autograd.h"
#ifdef MT_WITH_CUDA
#include "core/cuda/runtime.h"
#include "optim/adamw_cuda.h"
#include "optim/clip_cuda.h"
#endif

namespace mt::optim {
namespace {

template <class T>
double sum_of_squares(const Tensor& grad) {
  const T* g = grad.data<T>();
  double s = 0;
  for (int64_t i = 0; i < grad.numel(); ++i) s += double(g[i]) * double(g[i]);
  return s;
}

template <class T>
void scale_in_place(const Tensor& grad, double factor) {
  T* g = grad.data<T>();
  for (int64_t i = 0; i < grad.numel(); ++i) g[i] = T(g[i] * factor);
}

Tensor clip_cpu(const std::vector<Tensor>& grads, double max_norm, const SumOverRanks& sum_over_ranks,
               bool f64) {
  double sq = 0;
  for (const Tensor& g : grads) sq += f64 ? sum_of_squares<double>(g) : sum_of_squares<float>(g);
  if (sum_over_ranks) {
    const Tensor t = full({1}, sq, DType::f64);
    sum_over_ranks(t);
    sq = t.item();
  }
  const double norm = std::sqrt(sq);
  const double factor = max_norm / (norm + 1e-6);
  if (factor < 1) {
    for (const Tensor& g : grads) {
      if (f64) scale_in_place<double>(g, factor);
      else scale_in_place<float>(g, factor);
      g.bump_version();
    }
  }
  return full({}, norm, f64 ? DType::f64 : DType::f32);
}

#ifdef MT_WITH_CUDA
Tensor clip_cuda(const std::vector<Tensor>& grads, double max_norm, const SumOverRanks& sum_over_ranks,
                const Device device) {
  cudaStream_t s = cuda::stream(device.index);
  std::vector<float*> ptrs;
  std::vector<int64_t> sizes;
  for (const Tensor& g : grads) {
    ptrs.push_back(g.data<float>());
    sizes.push_back(g.numel());
  }
  Tensor norm = empty({}, DType::f32, device), factor = empty({}, DType::f32, device);
  if (ptrs.empty()) norm.fill_(0.0);
  else cuda::grad_norm_sq(ptrs.data(), sizes.data(), int(ptrs.size()), norm.data<float>(), s);
  if (sum_over_ranks) sum_over_ranks(norm);
  cuda::clip_factor(norm.data<float>(), float(max_norm), factor.data<float>(), s);
  cuda::scale_by_device_scalar(ptrs.data(), sizes.data(), int(ptrs.size()), factor.data<float>(), s);
  cuda::sqrt_scalar(norm.data<float>(), s);
  for (const Tensor& g : grads) g.bump_version();
  return norm;
}
#endif

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm,
                       const SumOverRanks& sum_over_ranks) {
  MT_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got ", max_norm);
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  const Device device = params.empty() ? kCPU : params[0].device();
  // A rank whose part is empty still takes part in the sum over ranks.
  const bool f64 = grads.empty() ? !params.empty() && params[0].dtype() == DType::f64
                                 : grads[0].dtype() == DType::f64;
  if (grads.empty() && !sum_over_ranks) return zeros({}, DType::f32, device);
  for (const Tensor& g : grads)
    MT_CHECK(g.device() == grads[0].device() && g.dtype() == grads[0].dtype() && g.is_contiguous(),
             "clip_grad_norm_: every .grad must be contiguous and share one device and dtype; got ",
             dtype_name(g.dtype()), " on ", g.device().str(), " beside ", dtype_name(grads[0].dtype()),
             " on ", grads[0].device().str());
  NoGradGuard no_grad;
  if (device.is_cpu()) return clip_cpu(grads, max_norm, sum_over_ranks, f64);
#ifdef MT_WITH_CUDA
  MT_CHECK(!f64, "clip_grad_norm_: CUDA gradients must be f32, got f64");
  return clip_cuda(grads, max_norm, sum_over_ranks, device);
#else
  MT_THROW("clip_grad_norm_: gradients on ", device.str(), " in a build without CUDA");
#endif
}

}  // namespace mt::optim
