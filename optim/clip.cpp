#include "optim/clip.h"

#include <cmath>
#include <utility>

#include "core/autograd.h"
#include "core/registry.h"
#include "optim/kernels.h"

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
  MT_CHECK(out.device.is_cpu() || !out.f64, op, ": CUDA gradients must be f32, got f64");
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

// CUDA: the norm and the factor as f32 device scalars, then every gradient scaled by the factor,
// without waiting for the device.
Tensor clip_cuda(const Grads& g, double max_norm, const SumOverRanks& sum_over_ranks) {
  Tensor norm = empty({}, DType::f32, g.device), factor = empty({}, DType::f32, g.device);
  kernel<GradNormAndClipFactorFn>("grad_norm_and_clip_factor", Phase::Forward, g.device)(
      g.grads, max_norm, sum_over_ranks, norm, factor);
  kernel<ScaleGradsFn>("scale_grads", Phase::Forward, g.device)(g.grads, factor);
  for (const Tensor& t : g.grads) t.bump_version();
  return norm;
}

}  // namespace

MT_DEFINE_OP(grad_norm_and_clip_factor, "norm = sqrt(sum g^2); factor = min(1, max_norm/(norm + 1e-6))",
             GradNormAndClipFactorFn, void);
MT_OP_BACKENDS(grad_norm_and_clip_factor, CUDA);
MT_DEFINE_OP(scale_grads, "g *= factor (a device scalar) for every gradient", ScaleGradsFn, void);
MT_OP_BACKENDS(scale_grads, CUDA);

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm,
                       const SumOverRanks& sum_over_ranks) {
  const Grads g = gather(params, max_norm, sum_over_ranks, "clip_grad_norm_");
  if (g.none) return zeros({}, DType::f32, g.device);
  NoGradGuard no_grad;
  if (!g.device.is_cpu()) return clip_cuda(g, max_norm, sum_over_ranks);
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
  if (!cpu)
    return kernel<GradNormAndClipFactorFn>("grad_norm_and_clip_factor", Phase::Forward, g.device)(
        g.grads, max_norm, sum_over_ranks, norm_out, factor_out);
  const auto [norm, factor] = norm_and_factor_cpu(g, max_norm, sum_over_ranks);
  norm_out.fill_(norm);
  factor_out.fill_(factor);
}

}  // namespace mt::optim
