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

// The dropout key goes with the saved tensors, its base word among them (last): the backward
// regenerates the mask from the word, so a word moved since the forward must be the "modified in
// place" error, not another mask.
void save_with_key(Context& ctx, std::vector<Tensor> saved, AttentionDropout dropout) {
  saved.push_back(dropout.base);
  dropout.base = Tensor();
  ctx.save_for_backward(std::move(saved));
  ctx.set("dropout", dropout);
}

AttentionDropout key_of(const Context& ctx, const std::vector<Tensor>& saved) {
  AttentionDropout dropout = ctx.get<AttentionDropout>("dropout");
  dropout.base = saved.back();
  return dropout;
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
    save_with_key(ctx, {qc, kc, vc, o, lse}, dropout);
    return o;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    auto saved = ctx.saved_tensors();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &lse = saved[4];
    const AttentionDropout dropout = key_of(ctx, saved);
    Tensor dout = prepared(dys[0]);  // upstream gradients may be strided views
    // One pass yields all three (they share S, P and dS): computed together, returned as wanted.
    Tensor dq = empty(q.shape(), q.dtype(), q.device());
    Tensor dk = empty(q.shape(), q.dtype(), q.device());
    Tensor dv = empty(q.shape(), q.dtype(), q.device());
    kernel<AttentionBackwardFn>(name, Phase::Backward, q.device())(
        q, k, v, o, lse, dout, dq, dk, dv, dropout);
    return {ctx.needs_input_grad(0) ? dq : Tensor(), ctx.needs_input_grad(1) ? dk : Tensor(),
            ctx.needs_input_grad(2) ? dv : Tensor(), Tensor()};  // q, k, v; the dropout: none
  }
};

// The P parts of a contiguous [B, T, P·H·d] buffer as [B, H, T, d] views, without a copy: part p's
// head h at row t is packed[b, t, (p·H + h)·d ...], so each view has strides (T·P·H·d, d, P·H·d, 1)
// and starts p·H·d elements in.
std::vector<Tensor> heads_views(const Tensor& packed, int64_t P, int64_t H) {
  const int64_t B = packed.size(0), T = packed.size(1), d = packed.size(2) / (P * H);
  const Tensor all = packed.view({B, T, P * H, d}).permute({0, 2, 1, 3});  // [B, P·H, T, d]
  std::vector<Tensor> parts;
  for (int64_t p = 0; p < P; ++p) parts.push_back(all.narrow(1, p * H, H));
  return parts;
}

struct AttentionPackedFn : Function<AttentionPackedFn> {
  static constexpr const char* name = "attention_packed";

  static Tensor forward(Context& ctx, const Tensor& qkv, int64_t n_head,
                        const AttentionDropout& dropout) {
    MT_CHECK(qkv.dim() == 3 && is_floating(qkv.dtype()), "attention_packed: qkv must be a "
             "floating-point [B, T, 3*C] tensor, got shape ", shape_str(qkv.shape()), " ",
             dtype_name(qkv.dtype()));
    MT_CHECK(n_head >= 1 && qkv.size(2) >= 3 * n_head && qkv.size(2) % (3 * n_head) == 0,
             "attention_packed: the last dimension ", qkv.size(2), " is not 3 * n_head * d with "
             "d >= 1 for n_head = ", n_head);
    const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
    MT_CHECK(qkv.device().is_cpu() || C / n_head <= kAttentionMaxD, "attention_packed: CUDA "
             "heads are at most d = ", kAttentionMaxD, " wide, got d = ", C / n_head);
    Tensor packed = prepared(qkv);
    Tensor y = empty({B, T, C}, qkv.dtype(), qkv.device());
    Tensor lse = empty({B, n_head, T}, grad_dtype_for(qkv.dtype()), qkv.device());
    const std::vector<Tensor> in = heads_views(packed, 3, n_head);
    kernel<AttentionForwardFn>("attention", Phase::Forward, qkv.device())(
        in[0], in[1], in[2], heads_views(y, 1, n_head)[0], lse, dropout);
    save_with_key(ctx, {packed, y, lse}, dropout);
    ctx.set("n_head", n_head);
    return y;
  }

  static GradList backward(Context& ctx, const GradList& dys) {
    auto saved = ctx.saved_tensors();
    const Tensor &packed = saved[0], &y = saved[1], &lse = saved[2];
    const AttentionDropout dropout = key_of(ctx, saved);
    const int64_t n_head = ctx.get<int64_t>("n_head");
    Tensor dout = prepared(dys[0]);
    Tensor dqkv = empty(packed.shape(), packed.dtype(), packed.device());
    const std::vector<Tensor> in = heads_views(packed, 3, n_head), d = heads_views(dqkv, 3, n_head);
    kernel<AttentionBackwardFn>("attention", Phase::Backward, packed.device())(
        in[0], in[1], in[2], heads_views(y, 1, n_head)[0], lse, heads_views(dout, 1, n_head)[0],
        d[0], d[1], d[2], dropout);
    return {dqkv, Tensor(), Tensor()};  // qkv; n_head and the dropout: none
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

// Element (i, c) of head bh = b·H + h of a [B, H, T, d] view (any strides: the kernels' contract
// in attention.h), as an offset from its first element.
int64_t at(const Tensor& t, int64_t bh, int64_t i, int64_t c) {
  const Shape& st = t.strides();
  return (bh / t.size(1)) * st[0] + (bh % t.size(1)) * st[1] + i * st[2] + c * st[3];
}

// Head bh of t as contiguous [T, d] rows, widened to double.
template <class scalar_t>
std::vector<double> widen(const Tensor& t, int64_t bh) {
  const int64_t T = t.size(2), d = t.size(3);
  const scalar_t* p = t.data<scalar_t>();
  std::vector<double> out(size_t(T * d));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t c = 0; c < d; ++c)
      out[size_t(i * d + c)] = double(cpu::to_acc(p[at(t, bh, i, c)]));
  return out;
}

// Head bh of t = rows [T, d] of doubles (times `mul`), rounded to t's dtype.
template <class scalar_t>
void round_into(const Tensor& t, int64_t bh, const std::vector<double>& rows, double mul) {
  using acc = cpu::acc_t<scalar_t>;
  const int64_t T = t.size(2), d = t.size(3);
  scalar_t* p = t.data<scalar_t>();
  for (int64_t i = 0; i < T; ++i)
    for (int64_t c = 0; c < d; ++c)
      p[at(t, bh, i, c)] = cpu::from_acc<scalar_t>(acc(mul * rows[size_t(i * d + c)]));
}

void forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                 const Tensor& lse, const AttentionDropout& dropout) {
  const DropoutFactors factors(dropout);
  MT_DISPATCH_FLOATING(q.dtype(), "attention", [&] {
    using acc = cpu::acc_t<scalar_t>;
    const int64_t heads = q.size(0) * q.size(1), T = q.size(2), d = q.size(3);
    const double scale = 1.0 / std::sqrt(double(d));
    for (int64_t h = 0; h < heads; ++h) {
      const auto qh = widen<scalar_t>(q, h), kh = widen<scalar_t>(k, h), vh = widen<scalar_t>(v, h);
      std::vector<double> P = scores(qh.data(), kh.data(), T, d, scale);
      const std::vector<double> Z = factors.head(h, T);
      std::vector<double> oh(size_t(T * d), 0.0);  // O_i = Σ_j P[i, j]·Z[i, j]·v_j (Z = 1: P)
      for (int64_t i = 0; i < T; ++i) {
        double* row = P.data() + i * T;
        double m = kNegInf, l = 0;
        for (int64_t j = 0; j <= i; ++j) m = std::max(m, row[j]);
        for (int64_t j = 0; j <= i; ++j) l += std::exp(row[j] - m);
        const double L = m + std::log(l);
        lse.data<acc>()[h * T + i] = acc(L);
        for (int64_t j = 0; j < T; ++j) row[j] = j <= i ? std::exp(row[j] - L) : 0.0;  // P
        for (int64_t j = 0; j <= i; ++j) {
          const double pz = row[j] * Z[size_t(i * T + j)];
          for (int64_t c = 0; c < d; ++c) oh[size_t(i * d + c)] += pz * vh[size_t(j * d + c)];
        }
      }
      round_into<scalar_t>(o, h, oh, 1.0);
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
      const auto qh = widen<scalar_t>(q, h), kh = widen<scalar_t>(k, h), vh = widen<scalar_t>(v, h),
                 oh = widen<scalar_t>(o, h), gh = widen<scalar_t>(dout, h);
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
      round_into<scalar_t>(dq, h, dQ, scale);
      round_into<scalar_t>(dk, h, dK, scale);
      round_into<scalar_t>(dv, h, dV, 1.0);
    }
  });
}

}  // namespace

namespace {

// The dropout the kernels run: none at p = 0 or out of training; else checked, its base on the
// input's device.
AttentionDropout checked_dropout(const char* op, const AttentionDropout& dropout,
                                 const Tensor& input) {
  MT_CHECK(dropout.p >= 0 && dropout.p < 1, op, ": dropout p must be in [0, 1), got ", dropout.p);
  if (!dropout.training || dropout.p == 0) return AttentionDropout{};
  const Tensor& base = dropout.base;
  if (base.defined()) {
    MT_CHECK(base.dtype() == DType::i64 && base.numel() == 1 && base.is_contiguous(), op,
             ": the dropout offset base must be one i64 element, got shape ",
             shape_str(base.shape()), " ", dtype_name(base.dtype()));
    MT_CHECK(input.defined() && base.device() == input.device(), op,
             ": the dropout offset base is on ", base.device().str(), " but the input is on ",
             input.defined() ? input.device().str() : "nothing");
  }
  return dropout;
}

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  return AttentionFn::apply(q, k, v, AttentionDropout{});
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionDropout& dropout) {
  return AttentionFn::apply(q, k, v, checked_dropout("attention", dropout, q));
}

Tensor attention_packed(const Tensor& qkv, int64_t n_head, const AttentionDropout& dropout) {
  return AttentionPackedFn::apply(qkv, n_head, checked_dropout("attention_packed", dropout, qkv));
}

MT_DEFINE_OP(attention, "O = (softmax_causal(q k^T/sqrt(d)) * Z) v, L = logsumexp, "
             "Z = dropout mask/(1-p) (1 without dropout); dP = Z*(dO v^T), "
             "dS = P*(dP - rowsum(dO*O)), dq = dS k/sqrt(d), dk = dS^T q/sqrt(d), dv = (P*Z)^T dO",
             AttentionForwardFn, AttentionBackwardFn);
MT_REGISTER_KERNEL(attention, Forward, CPU, forward_cpu);
MT_REGISTER_KERNEL(attention, Backward, CPU, backward_cpu);

}  // namespace mt
