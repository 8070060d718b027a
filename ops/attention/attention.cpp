// attention: the Function (the graph node's contract) and the CPU reference kernels.
// The math and the saved-vs-recomputed choice are in attention.h.
#include "ops/attention/attention.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "core/cpu_kernels.h"
#include "core/registry.h"
#include "ops/dropout/dropout.h"
#include "ops/dropout/philox.h"

namespace mt {
namespace {

// Contiguous, and 16-byte aligned: the CUDA kernels move 16 bytes at a time, and a copy makes an
// input that sits one element off alignment take the same path (and give the same bits) as any.
Tensor prepared(const Tensor& t) {
  Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

struct AttentionFn : Function<AttentionFn> {
  static constexpr const char* name = "attention";

  static Tensor forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const AttentionDropout& dropout) {
    MT_CHECK(q.dim() == 4 && is_floating(q.dtype()), "attention: q must be a floating-point "
             "[B, H, T, d] tensor, got shape ", shape_str(q.shape()), " ", dtype_name(q.dtype()));
    MT_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), "attention: q, k and v must have "
             "one shape, got q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ",
             shape_str(v.shape()));
    MT_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), "attention: q, k and v must have "
             "one dtype, got q ", dtype_name(q.dtype()), ", k ", dtype_name(k.dtype()), ", v ",
             dtype_name(v.dtype()));
    MT_CHECK(k.device() == q.device() && v.device() == q.device(), "attention: q, k and v must "
             "be on one device, got q on ", q.device().str(), ", k on ", k.device().str(),
             ", v on ", v.device().str());
    MT_CHECK(q.size(3) >= 1, "attention: the head dimension d must be at least 1, got shape ",
             shape_str(q.shape()));
    MT_CHECK(q.device().is_cpu() || q.size(3) <= kAttentionMaxD, "attention: CUDA heads are at "
             "most d = ", kAttentionMaxD, " wide, got d = ", q.size(3));
    Tensor qc = prepared(q), kc = prepared(k), vc = prepared(v);
    Tensor o = empty(q.shape(), q.dtype(), q.device());
    Tensor lse = empty({q.size(0), q.size(1), q.size(2)}, grad_dtype_for(q.dtype()), q.device());
    kernel<AttentionForwardFn>(name, Phase::Forward, q.device())(qc, kc, vc, o, lse, dropout);
    ctx.save_for_backward({qc, kc, vc, o, lse});
    ctx.set("dropout", dropout);  // the key (and the base word itself): the mask is regenerated
    return o;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    auto saved = ctx.saved_tensors();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &lse = saved[4];
    Tensor dout = prepared(dys[0]);  // upstream gradients may be strided views
    // One pass yields all three (they share S, P and dS): computed together, returned as wanted.
    Tensor dq = empty(q.shape(), q.dtype(), q.device());
    Tensor dk = empty(q.shape(), q.dtype(), q.device());
    Tensor dv = empty(q.shape(), q.dtype(), q.device());
    kernel<AttentionBackwardFn>(name, Phase::Backward, q.device())(
        q, k, v, o, lse, dout, dq, dk, dv, ctx.get<AttentionDropout>("dropout"));
    return {ctx.needs_input_grad(0) ? dq : Tensor(), ctx.needs_input_grad(1) ? dk : Tensor(),
            ctx.needs_input_grad(2) ? dv : Tensor(), Tensor()};  // q, k, v; the dropout: none
  }
};

// ---- CPU reference kernels ----------------------------------------------------------------
// Every sum in double, S and P materialized per head (T×T): the oracle the GPU is checked
// against. lse is acc_t<scalar_t> (f64 for f64, else f32), as the Function allocates it.

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// S[i, j] = scale · q_i · k_j for j ≤ i, −∞ above the diagonal; one head, row-major T×T.
std::vector<double> scores(const double* q, const double* k, int64_t T, int64_t d, double scale) {
  std::vector<double> S(size_t(T * T), kNegInf);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
      S[size_t(i * T + j)] = scale * dot;
    }
  return S;
}

// Z[i, j] of one head (attention.h), the mask materialized: 1 / (1 − p) where kept, 0 where
// dropped, every entry 1 without dropout. Row i's words are e = (head·T + i)·T + j, one Philox
// call per group of 4 consecutive e.
class DropoutFactors {
 public:
  explicit DropoutFactors(const AttentionDropout& d)
      : on_(d.p > 0), threshold_(on_ ? dropout_threshold(d.p) : 0), scale_(1.0 / (1.0 - d.p)),
        seed_(d.seed),
        offset_(d.offset + (d.base.defined() ? uint64_t(d.base.data<int64_t>()[0]) : 0)) {}

  // Z[i, j] for j ≤ i (the causal part; the rest is never read), row-major T×T.
  std::vector<double> head(int64_t h, int64_t T) const {
    std::vector<double> Z(size_t(T * T), 1.0);
    if (!on_) return Z;
    for (int64_t i = 0; i < T; ++i) {
      const uint64_t e0 = (uint64_t(h) * uint64_t(T) + uint64_t(i)) * uint64_t(T);
      philox::U32x4 r{};
      for (int64_t j = 0; j <= i; ++j) {
        const uint64_t e = e0 + uint64_t(j);
        if (j == 0 || e % 8 == 0) r = philox::draw(seed_, offset_, e / 8);
        Z[size_t(i * T + j)] = philox::half16(r, int(e % 8)) >= threshold_ ? scale_ : 0.0;
      }
    }
    return Z;
  }

 private:
  bool on_;
  uint32_t threshold_;
  double scale_;
  uint64_t seed_, offset_;
};

// One head of t (rows [T, d] starting at `head`) widened to double.
template <class scalar_t>
std::vector<double> widen(const Tensor& t, int64_t head, int64_t n) {
  const scalar_t* p = t.data<scalar_t>() + head * n;
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(cpu::to_acc(p[i]));
  return out;
}

void forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                 const Tensor& lse, const AttentionDropout& dropout) {
  const DropoutFactors factors(dropout);
  MT_DISPATCH_FLOATING(q.dtype(), "attention", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t heads = q.size(0) * q.size(1), T = q.size(2), d = q.size(3);
    const double scale = 1.0 / std::sqrt(double(d));
    for (int64_t h = 0; h < heads; ++h) {
      const auto qh = widen<scalar_t>(q, h, T * d), kh = widen<scalar_t>(k, h, T * d),
                 vh = widen<scalar_t>(v, h, T * d);
      std::vector<double> P = scores(qh.data(), kh.data(), T, d, scale);
      const std::vector<double> Z = factors.head(h, T);
      for (int64_t i = 0; i < T; ++i) {
        double* row = P.data() + i * T;
        double m = kNegInf, l = 0;
        for (int64_t j = 0; j <= i; ++j) m = std::max(m, row[j]);
        for (int64_t j = 0; j <= i; ++j) l += std::exp(row[j] - m);
        const double L = m + std::log(l);
        lse.data<acc>()[h * T + i] = acc(L);
        for (int64_t j = 0; j < T; ++j) row[j] = j <= i ? std::exp(row[j] - L) : 0.0;  // P
        std::vector<double> oi(size_t(d), 0.0);  // Σ_j P[i, j]·Z[i, j]·v_j (Z = 1: exactly P)
        for (int64_t j = 0; j <= i; ++j) {
          const double pz = row[j] * Z[size_t(i * T + j)];
          for (int64_t c = 0; c < d; ++c) oi[size_t(c)] += pz * vh[size_t(j * d + c)];
        }
        for (int64_t c = 0; c < d; ++c)
          o.data<scalar_t>()[(h * T + i) * d + c] = cpu::from_acc<scalar_t>(acc(oi[size_t(c)]));
      }
    }
  });
}

// P = exp(S − L) from the saved L (not from a fresh softmax: the contract the CUDA kernels
// follow, so a wrong L shows on both devices), D = rowsum(dO ∘ O), dP = Z ∘ (dO vᵀ),
// dS = P ∘ (dP − D); the mask Z drawn again from the forward's key.
void backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                  const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                  const Tensor& dv, const AttentionDropout& dropout) {
  const DropoutFactors factors(dropout);
  MT_DISPATCH_FLOATING(q.dtype(), "attention", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t heads = q.size(0) * q.size(1), T = q.size(2), d = q.size(3);
    const double scale = 1.0 / std::sqrt(double(d));
    for (int64_t h = 0; h < heads; ++h) {
      const auto qh = widen<scalar_t>(q, h, T * d), kh = widen<scalar_t>(k, h, T * d),
                 vh = widen<scalar_t>(v, h, T * d), oh = widen<scalar_t>(o, h, T * d),
                 gh = widen<scalar_t>(dout, h, T * d);
      std::vector<double> P = scores(qh.data(), kh.data(), T, d, scale);
      const std::vector<double> Z = factors.head(h, T);
      std::vector<double> dS(size_t(T * T), 0.0);
      for (int64_t i = 0; i < T; ++i) {
        const double L = double(lse.data<acc>()[h * T + i]);
        double D = 0;  // rowsum(dO ∘ O)
        for (int64_t c = 0; c < d; ++c) D += gh[size_t(i * d + c)] * oh[size_t(i * d + c)];
        for (int64_t j = 0; j < T; ++j) {
          double& p = P[size_t(i * T + j)];
          if (j > i) {
            p = 0;
            continue;
          }
          p = std::exp(p - L);
          double dp = 0;  // dP[i, j] = Z[i, j] · (dO_i · v_j)
          for (int64_t c = 0; c < d; ++c) dp += gh[size_t(i * d + c)] * vh[size_t(j * d + c)];
          dS[size_t(i * T + j)] = p * (Z[size_t(i * T + j)] * dp - D);
        }
      }
      // dQ_i = s · Σ_j dS[i, j] k_j,  dK_j = s · Σ_i dS[i, j] q_i,  dV_j = Σ_i P[i, j] Z[i, j] dO_i
      std::vector<double> dQ(size_t(T * d), 0.0), dK(dQ), dV(dQ);
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          const double p = P[size_t(i * T + j)] * Z[size_t(i * T + j)], ds = dS[size_t(i * T + j)];
          for (int64_t c = 0; c < d; ++c) {
            dQ[size_t(i * d + c)] += ds * kh[size_t(j * d + c)];
            dK[size_t(j * d + c)] += ds * qh[size_t(i * d + c)];
            dV[size_t(j * d + c)] += p * gh[size_t(i * d + c)];
          }
        }
      for (int64_t e = 0; e < T * d; ++e) {
        dq.data<scalar_t>()[h * T * d + e] = cpu::from_acc<scalar_t>(acc(scale * dQ[size_t(e)]));
        dk.data<scalar_t>()[h * T * d + e] = cpu::from_acc<scalar_t>(acc(scale * dK[size_t(e)]));
        dv.data<scalar_t>()[h * T * d + e] = cpu::from_acc<scalar_t>(acc(dV[size_t(e)]));
      }
    }
  });
}

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  return AttentionFn::apply(q, k, v, AttentionDropout{});
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionDropout& dropout) {
  MT_CHECK(dropout.p >= 0 && dropout.p < 1, "attention: dropout p must be in [0, 1), got ",
           dropout.p);
  if (!dropout.training || dropout.p == 0) return attention(q, k, v);
  const Tensor& base = dropout.base;
  if (base.defined()) {
    MT_CHECK(base.dtype() == DType::i64 && base.numel() == 1 && base.is_contiguous(),
             "attention: the dropout offset base must be one i64 element, got shape ",
             shape_str(base.shape()), " ", dtype_name(base.dtype()));
    MT_CHECK(q.defined() && base.device() == q.device(), "attention: the dropout offset base is on ",
             base.device().str(), " but q is on ", q.defined() ? q.device().str() : "nothing");
  }
  return AttentionFn::apply(q, k, v, dropout);
}

MT_DEFINE_OP(attention, "O = (softmax_causal(q k^T/sqrt(d)) * Z) v, L = logsumexp, "
             "Z = dropout mask/(1-p) (1 without dropout); dP = Z*(dO v^T), "
             "dS = P*(dP - rowsum(dO*O)), dq = dS k/sqrt(d), dk = dS^T q/sqrt(d), dv = (P*Z)^T dO",
             AttentionForwardFn, AttentionBackwardFn);
MT_REGISTER_KERNEL(attention, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL(attention, Backward, CPU, backward_cpu);

}  // namespace mt
