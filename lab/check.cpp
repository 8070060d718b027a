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

namespace {

void check_attention_sizes(const char* what, size_t q, size_t k, size_t v, int64_t heads, int64_t T,
                           int64_t d) {
  const int64_t n = heads * T * d;
  MT_CHECK(heads > 0 && T > 0 && d > 0 && int64_t(q) == n && int64_t(k) == n && int64_t(v) == n,
           what, ": q, k, v have ", q, ", ", k, ", ", v, " elements, not heads·T·d = ", heads, "·",
           T, "·", d);
}

// Row i of one head's probabilities: P_ij = exp(S_ij − L_i) for j <= i.
void probabilities_row(const float* q, const float* k, int64_t T, int64_t d, int64_t i, double L,
                       std::vector<double>& p) {
  const double scale = 1 / std::sqrt(double(d));
  for (int64_t j = 0; j < T; ++j) {
    if (j > i) {
      p[j] = 0;
      continue;
    }
    double s = 0;
    for (int64_t c = 0; c < d; ++c) s += double(q[i * d + c]) * k[j * d + c];
    p[j] = std::exp(s * scale - L);
  }
}

}  // namespace

AttnForward attention_forward_reference(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int64_t heads, int64_t T,
                                        int64_t d) {
  check_attention_sizes("attention_forward_reference", q.size(), k.size(), v.size(), heads, T, d);
  const double scale = 1 / std::sqrt(double(d));
  AttnForward r;
  r.o.assign(q.size(), 0.0);
  r.o_scale.assign(q.size(), 0.0);
  r.L.assign(size_t(heads * T), 0.0);
  std::vector<double> s(static_cast<size_t>(T));
  for (int64_t h = 0; h < heads; ++h) {
    const float *qh = q.data() + h * T * d, *kh = k.data() + h * T * d, *vh = v.data() + h * T * d;
    for (int64_t i = 0; i < T; ++i) {
      double m = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += double(qh[i * d + c]) * kh[j * d + c];
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      double l = 0;
      for (int64_t j = 0; j <= i; ++j) l += std::exp(s[j] - m);
      const double L = m + std::log(l);
      r.L[h * T + i] = L;
      for (int64_t j = 0; j <= i; ++j) {
        const double p = std::exp(s[j] - L);
        for (int64_t c = 0; c < d; ++c) {
          r.o[(h * T + i) * d + c] += p * vh[j * d + c];
          r.o_scale[(h * T + i) * d + c] += p * std::abs(vh[j * d + c]);
        }
      }
    }
  }
  return r;
}

AttnGrads attention_backward_reference(const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v, const std::vector<float>& o,
                                       const std::vector<double>& L, const std::vector<float>& dO,
                                       int64_t heads, int64_t T, int64_t d) {
  check_attention_sizes("attention_backward_reference", q.size(), k.size(), v.size(), heads, T, d);
  MT_CHECK(o.size() == q.size() && dO.size() == q.size() && int64_t(L.size()) == heads * T,
           "attention_backward_reference: o, dO, L have ", o.size(), ", ", dO.size(), ", ",
           L.size(), " elements for heads·T·d = ", q.size());
  const double scale = 1 / std::sqrt(double(d));
  AttnGrads r;
  for (auto* g : {&r.dq, &r.dk, &r.dv, &r.dq_scale, &r.dk_scale, &r.dv_scale})
    g->assign(q.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(T));
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t base = h * T * d;
    const float *qh = q.data() + base, *kh = k.data() + base, *vh = v.data() + base;
    for (int64_t i = 0; i < T; ++i) {
      probabilities_row(qh, kh, T, d, i, L[h * T + i], p);
      double D = 0, D_abs = 0;
      for (int64_t c = 0; c < d; ++c) {
        D += double(dO[base + i * d + c]) * o[base + i * d + c];
        D_abs += std::abs(double(dO[base + i * d + c]) * o[base + i * d + c]);
      }
      for (int64_t j = 0; j <= i; ++j) {
        double dP = 0, dP_abs = 0;
        for (int64_t c = 0; c < d; ++c) {
          dP += double(dO[base + i * d + c]) * vh[j * d + c];
          dP_abs += std::abs(double(dO[base + i * d + c]) * vh[j * d + c]);
        }
        const double dS = p[j] * (dP - D), dS_abs = p[j] * (dP_abs + D_abs);
        for (int64_t c = 0; c < d; ++c) {
          r.dq[base + i * d + c] += dS * kh[j * d + c] * scale;
          r.dq_scale[base + i * d + c] += dS_abs * std::abs(kh[j * d + c]) * scale;
          r.dk[base + j * d + c] += dS * qh[i * d + c] * scale;
          r.dk_scale[base + j * d + c] += dS_abs * std::abs(qh[i * d + c]) * scale;
          r.dv[base + j * d + c] += p[j] * dO[base + i * d + c];
          r.dv_scale[base + j * d + c] += p[j] * std::abs(dO[base + i * d + c]);
        }
      }
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
