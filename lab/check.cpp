#include "lab/check.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"

namespace mt::lab {

SiluGrads silu_backward_reference(const std::vector<float>& x, float w,
                                  const std::vector<float>& dy) {
  MT_CHECK(x.size() == dy.size(), "silu_backward_reference: x has ", x.size(), " elements, dy ",
           dy.size());
  SiluGrads r;
  r.dx.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xv = x[i], g = dy[i], s = 1 / (1 + std::exp(-xv));
    r.dx[i] = g * w * (s + xv * s * (1 - s));
    r.dw += g * xv * s;
    r.dw_scale += std::abs(g * xv * s);
  }
  return r;
}

std::vector<float> rms_rstd_reference(const std::vector<float>& x, int64_t rows, int64_t d,
                                      float eps) {
  MT_CHECK(rows >= 0 && d > 0 && int64_t(x.size()) == rows * d, "rms_rstd_reference: x has ",
           x.size(), " elements, not rows·d = ", rows, "·", d);
  std::vector<float> rstd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double sum_sq = 0;
    for (int64_t j = 0; j < d; ++j) sum_sq += double(x[r * d + j]) * x[r * d + j];
    rstd[r] = float(1 / std::sqrt(sum_sq / double(d) + eps));
  }
  return rstd;
}

RmsGrads rms_backward_reference(const std::vector<float>& x, const std::vector<float>& weight,
                                const std::vector<float>& rstd, const std::vector<float>& dy,
                                int64_t rows, int64_t d) {
  MT_CHECK(rows >= 0 && d > 0 && int64_t(x.size()) == rows * d && dy.size() == x.size() &&
               int64_t(weight.size()) == d && int64_t(rstd.size()) == rows,
           "rms_backward_reference: sizes x ", x.size(), ", dy ", dy.size(), ", weight ",
           weight.size(), ", rstd ", rstd.size(), " do not fit rows = ", rows, ", d = ", d);
  RmsGrads r;
  r.dx.resize(x.size());
  r.dx_scale.resize(x.size());
  r.dweight.assign(size_t(d), 0.0);
  r.dweight_scale.assign(size_t(d), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const double rs = rstd[i];
    double dot = 0, dot_abs = 0;  // Σ_j g·x̂ and Σ_j |g·x̂|
    for (int64_t j = 0; j < d; ++j) {
      const double xhat = x[i * d + j] * rs, g = double(dy[i * d + j]) * weight[j];
      dot += g * xhat;
      dot_abs += std::abs(g * xhat);
      r.dweight[j] += dy[i * d + j] * xhat;
      r.dweight_scale[j] += std::abs(dy[i * d + j] * xhat);
    }
    for (int64_t j = 0; j < d; ++j) {
      const double xhat = x[i * d + j] * rs, g = double(dy[i * d + j]) * weight[j];
      r.dx[i * d + j] = rs * (g - xhat * dot / double(d));
      r.dx_scale[i * d + j] = rs * (std::abs(g) + std::abs(xhat) * dot_abs / double(d));
    }
  }
  return r;
}

std::string GemmShape::str() const {
  std::ostringstream os;
  os << "M=" << M << " N=" << N << " K=" << K << " (" << (a_t ? "Aᵀ" : "A") << ", "
     << (b_t ? "Bᵀ" : "B") << ")";
  return os.str();
}

GemmShape linear_gemm(GemmKind kind, int64_t rows, int64_t in, int64_t out) {
  switch (kind) {
    case GemmKind::Forward: return {rows, out, in, false, true};  // y[rows,out] = x·Wᵀ
    case GemmKind::DX: return {rows, in, out, false, false};      // dX[rows,in] = dY·W
    case GemmKind::DW: return {out, in, rows, true, false};       // dW[out,in] += dYᵀ·X
  }
  MT_THROW("linear_gemm: unknown kind");
}

const char* gemm_kind_name(GemmKind kind) {
  switch (kind) {
    case GemmKind::Forward: return "forward y = x·Wᵀ";
    case GemmKind::DX: return "dX = dY·W";
    case GemmKind::DW: return "dW += dYᵀ·X";
  }
  return "?";
}

GemmResult gemm_reference(const GemmShape& g, const std::vector<float>& a,
                          const std::vector<float>& b, const std::vector<float>& c0, float beta) {
  const int64_t M = g.M, N = g.N, K = g.K;
  MT_CHECK(M > 0 && N > 0 && K > 0 && int64_t(a.size()) == M * K && int64_t(b.size()) == K * N &&
               (beta == 0 || int64_t(c0.size()) == M * N),
           "gemm_reference: ", g.str(), " with A of ", a.size(), ", B of ", b.size(), ", C of ",
           c0.size(), " elements");
  GemmResult r;
  r.c.assign(size_t(M * N), 0.0);
  r.scale.assign(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double sum = beta == 0 ? 0.0 : double(beta) * c0[m * N + n], abs_sum = std::abs(sum);
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(g.a_t ? a[k * M + m] : a[m * K + k]) *
                         double(g.b_t ? b[n * K + k] : b[k * N + n]);
        sum += p;
        abs_sum += std::abs(p);
      }
      r.c[m * N + n] = sum;
      r.scale[m * N + n] = abs_sum;
    }
  return r;
}

Check compare(const std::vector<float>& got, const std::vector<double>& want,
              const std::vector<double>& scale, Tolerance tol, const std::string& what) {
  Check c;
  std::ostringstream os;
  if (got.size() != want.size() || (!scale.empty() && scale.size() != want.size())) {
    c.ok = false;
    c.bad = int64_t(std::max(got.size(), want.size()));
    os << what << ": got " << got.size() << " elements, want " << want.size();
    if (!scale.empty()) os << " (scale " << scale.size() << ")";
    c.message = os.str();
    return c;
  }
  double worst_bound = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double s = scale.empty() ? std::max(1.0, std::abs(want[i])) : scale[i];
    const double bound = tol.rel * std::abs(want[i]) + tol.acc * s;
    const double err = std::abs(double(got[i]) - want[i]);
    // NaN and inf fail whatever the bound; a zero bound (all terms zero) demands exactness.
    const double ratio = !std::isfinite(got[i]) ? INFINITY
                         : bound > 0            ? err / bound
                         : err > 0              ? INFINITY
                                                : 0.0;
    if (ratio > 1) ++c.bad;
    if (c.worst < 0 || ratio > c.worst_ratio) {
      c.worst = int64_t(i);
      c.worst_ratio = ratio;
      worst_bound = bound;
    }
  }
  c.ok = c.bad == 0;
  os << what << ": ";
  if (c.ok)
    os << "all " << got.size() << " elements within bounds";
  else
    os << c.bad << " of " << got.size() << " elements off";
  if (c.worst >= 0)
    os << "; worst [" << c.worst << "] got " << got[c.worst] << " want " << want[c.worst]
       << " (bound " << worst_bound << ")";
  c.message = os.str();
  return c;
}

std::vector<float> random_bf16_values(int64_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> v(size_t(std::max<int64_t>(n, 0)));
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& f : v) {
    z += 0x9e3779b97f4a7c15ull;  // splitmix64
    uint64_t t = z;
    t = (t ^ (t >> 30)) * 0xbf58476d1ce4e5b9ull;
    t = (t ^ (t >> 27)) * 0x94d049bb133111ebull;
    t ^= t >> 31;
    const float u = float(t >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    f = bf16_to_float(float_to_bf16(lo + (hi - lo) * u));
  }
  return v;
}

}  // namespace mt::lab
