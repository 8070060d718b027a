#include "optim/clip.h"

#include <cmath>
#include <utility>

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

// The gradients clipping acts on: every parameter's .grad, checked to share one device and
// dtype (f32 on CUDA). f64: whether they are f64 (for a
// rank with none, whether its parameters are). none: no gradients and no sum over ranks, where
// there is nothing to compute (the norm is 0) and nothing to check.
struct Grads {
  std::vector<Tensor> grads;
  Device device;
  bool f64, none;
};

Grads gather(const std::vector<Tensor>& params, double max_norm, const SumOverRanks& sum_over_ranks,
             const char* op) {
  MT_CHECK(max_norm > 0, op, ": max_norm must be positive, got ", max_norm);
  Grads out{{}, params.empty() ? kCPU : params[0].device(), false, false};
  for (const Tensor& p : params)
    if (p.grad().defined()) out.grads.push_back(p.grad());
  const std::vector<Tensor>& grads = out.grads;
  // A rank whose part is empty still takes part in the sum over ranks.
  out.f64 = grads.empty() ? !params.empty() && params[0].dtype() == DType::f64
                          : grads[0].dtype() == DType::f64;
  out.none = grads.empty() && !sum_over_ranks;
  if (out.none) return out;
  for (const Tensor& g : grads)
    MT_CHECK(g.device() == grads[0].device() && g.dtype() == grads[0].dtype() && g.is_contiguous(),
             op, ": every .grad must be contiguous and share one device and dtype; got ",
             dtype_name(g.dtype()), " on ", g.device().str(), " beside ", dtype_name(grads[0].dtype()),
             " on ", grads[0].device().str());
#ifdef MT_WITH_CUDA
  MT_CHECK(out.device.is_cpu() || !out.f64, op, ": CUDA gradients must be f32, got f64");
#else
  MT_CHECK(out.device.is_cpu(), op, ": gradients on ", out.device.str(), " in a build without CUDA");
#endif
  return out;
}

// norm = sqrt(Σ g²) (summed over the ranks) and factor = min(1, max_norm / (norm + 1e-6)), in
// double. A NaN norm gives factor 1, as the in-place clip then leaves .grad alone.
std::pair<double, double> norm_and_factor_cpu(const Grads& g, double max_norm,
                                              const SumOverRanks& sum_over_ranks) {
  double sq = 0;
  for (const Tensor& t : g.grads) sq += g.f64 ? sum_of_squares<double>(t) : sum_of_squares<float>(t);
  if (sum_over_ranks) {
    const Tensor t = full({1}, sq, DType::f64);
    sum_over_ranks(t);
    sq = t.item();
  }
  const double norm = std::sqrt(sq);
  const double factor = max_norm / (norm + 1e-6);
  return {norm, factor < 1 ? factor : 1.0};
}

Tensor clip_cpu(const Grads& g, double max_norm, const SumOverRanks& sum_over_ranks) {
  const auto [norm, factor] = norm_and_factor_cpu(g, max_norm, sum_over_ranks);
  if (factor < 1) {
    for (const Tensor& t : g.grads) {
      if (g.f64) scale_in_place<double>(t, factor);
      else scale_in_place<float>(t, factor);
      t.bump_version();
    }
  }
  return full({}, norm, g.f64 ? DType::f64 : DType::f32);
}

#ifdef MT_WITH_CUDA
// The gradients' device pointers and sizes, as the multi-tensor kernels take them.
struct DevicePtrs {
  std::vector<float*> ptrs;
  std::vector<int64_t> sizes;
};

DevicePtrs device_ptrs(const Grads& g) {
  DevicePtrs out;
  for (const Tensor& t : g.grads) {
    out.ptrs.push_back(t.data<float>());
    out.sizes.push_back(t.numel());
  }
  return out;
}

// *norm = sqrt(Σ g²) (summed over the ranks) and *factor = min(1, max_norm / (norm + 1e-6)), f32
// device scalars, without waiting for the device.
void norm_and_factor_cuda(const DevicePtrs& d, double max_norm, const SumOverRanks& sum_over_ranks,
                          const Tensor& norm, const Tensor& factor) {
  cudaStream_t s = cuda::stream(norm.device().index);
  if (d.ptrs.empty()) norm.fill_(0.0);
  else cuda::grad_norm_sq(d.ptrs.data(), d.sizes.data(), int(d.ptrs.size()), norm.data<float>(), s);
  if (sum_over_ranks) sum_over_ranks(norm);
  cuda::clip_factor(norm.data<float>(), float(max_norm), factor.data<float>(), s);
  cuda::sqrt_scalar(norm.data<float>(), s);
  norm.bump_version();
  factor.bump_version();
}

Tensor clip_cuda(const Grads& g, double max_norm, const SumOverRanks& sum_over_ranks) {
  const DevicePtrs d = device_ptrs(g);
  Tensor norm = empty({}, DType::f32, g.device), factor = empty({}, DType::f32, g.device);
  norm_and_factor_cuda(d, max_norm, sum_over_ranks, norm, factor);
  cuda::scale_by_device_scalar(d.ptrs.data(), d.sizes.data(), int(d.ptrs.size()), factor.data<float>(),
                               cuda::stream(g.device.index));
  for (const Tensor& t : g.grads) t.bump_version();
  return norm;
}
#endif

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm,
                       const SumOverRanks& sum_over_ranks) {
  const Grads g = gather(params, max_norm, sum_over_ranks, "clip_grad_norm_");
  if (g.none) return zeros({}, DType::f32, g.device);
  NoGradGuard no_grad;
#ifdef MT_WITH_CUDA
  if (g.device.is_cuda()) return clip_cuda(g, max_norm, sum_over_ranks);
#endif
  return clip_cpu(g, max_norm, sum_over_ranks);
}

void grad_norm_and_clip_factor(const std::vector<Tensor>& params, double max_norm,
                               const Tensor& norm_out, const Tensor& factor_out,
                               const SumOverRanks& sum_over_ranks) {
  const Grads g = gather(params, max_norm, sum_over_ranks, "grad_norm_and_clip_factor");
  const bool cpu = g.device.is_cpu();
  MT_CHECK(norm_out.defined() && factor_out.defined() && norm_out.dim() == 0 && factor_out.dim() == 0 &&
               norm_out.device() == g.device && factor_out.device() == g.device,
           "grad_norm_and_clip_factor: norm_out and factor_out must be 0-dim tensors on ", g.device.str());
  MT_CHECK(cpu ? (norm_out.dtype() == DType::f32 || norm_out.dtype() == DType::f64) &&
                     factor_out.dtype() == DType::f64
               : norm_out.dtype() == DType::f32 && factor_out.dtype() == DType::f32,
           "grad_norm_and_clip_factor: on ", g.device.str(), " norm_out must be ",
           cpu ? "f32 or f64" : "f32", " and factor_out ", cpu ? "f64" : "f32", ", got ",
           dtype_name(norm_out.dtype()), " and ", dtype_name(factor_out.dtype()));
  NoGradGuard no_grad;
  if (g.none) {
    norm_out.fill_(0.0);
    factor_out.fill_(1.0);
    return;
  }
#ifdef MT_WITH_CUDA
  if (!cpu) return norm_and_factor_cuda(device_ptrs(g), max_norm, sum_over_ranks, norm_out, factor_out);
#endif
  const auto [norm, factor] = norm_and_factor_cpu(g, max_norm, sum_over_ranks);
  norm_out.fill_(norm);
  factor_out.fill_(factor);
}

}  // namespace mt::optim
