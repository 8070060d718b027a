#pragma once
// The lab's oracle, plain C++ (built with or without CUDA, and unit-tested on the CPU): a double
// precision reference for every kernel in lab/, and the comparison every version must pass.
//
// Inputs are the float values of the bf16 buffers the GPU reads (so the reference sees exactly
// what the kernel sees), outputs come back as floats. A result passes when every element is
// finite and |got - want| <= bound, where the bound has two parts:
//   rounding    rel · |want|       one rounding of the output (bf16: 2^-8, one ulp)
//   summation   acc · scale        fp32 sums in another order than the reference's: scale is the
//                                  sum of |terms| behind that element (its condition)
// A wrong kernel (a dropped term, a missing row, '=' instead of '+=') misses by far more.
#include <cstdint>
#include <string>
#include <vector>

namespace mt::lab {

// ---- scaled-SiLU backward:  dx = dy·w·(s + x·s·(1 − s)),  dw += Σ dy·x·s,  s = σ(x) ----------
struct SiluGrads {
  std::vector<double> dx;
  double dw = 0;        // Σ dy·x·s only: the caller adds what dw held before
  double dw_scale = 0;  // Σ |dy·x·s|
};
SiluGrads silu_backward_reference(const std::vector<float>& x, float w,
                                  const std::vector<float>& dy);

// ---- RMSNorm, x [rows, d] --------------------------------------------------------------------
// rstd[r] = 1 / sqrt(mean_j x[r,j]² + eps), rounded to fp32 as the forward saves it.
std::vector<float> rms_rstd_reference(const std::vector<float>& x, int64_t rows, int64_t d,
                                      float eps);
// dx = rstd·(g − x̂·mean_j(g·x̂)), g = dy·w, x̂ = x·rstd;  dweight += Σ_r dy·x̂.
struct RmsGrads {
  std::vector<double> dx, dx_scale;  // dx_scale[r,j] = rstd·(|g| + |x̂|·mean_j|g·x̂|)
  std::vector<double> dweight;       // Σ_r dy·x̂ only
  std::vector<double> dweight_scale; // Σ_r |dy·x̂|
};
RmsGrads rms_backward_reference(const std::vector<float>& x, const std::vector<float>& weight,
                                const std::vector<float>& rstd, const std::vector<float>& dy,
                                int64_t rows, int64_t d);

// ---- GEMM: C[M,N] = Σ_k A(m,k)·B(k,n), row-major buffers ---------------------------------------
// a_t: A is stored as its transpose, a [K, M] buffer; b_t: B is stored as a [N, K] buffer.
// The linear layer y = x·Wᵀ (x [M,K], W [N,K]) needs all three of its products:
//   forward  y  = x·Wᵀ    A = x  [M,K],          B = Wᵀ: W is [N,K]   -> a_t = 0, b_t = 1
//   dX       dX = dY·W    A = dY [M,N],          B = W  [N,K]         -> a_t = 0, b_t = 0
//   dW       dW += dYᵀ·X  A = dYᵀ: dY is [M,N],  B = X  [M,K]         -> a_t = 1, b_t = 0
struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
  bool a_t = false, b_t = false;
  std::string str() const;  // e.g. "M=128 N=64 K=32 (A, Bᵀ)"
};
enum class GemmKind { Forward, DX, DW };
// The GEMM behind one of the linear layer's products, for a layer with `rows` samples, `in`
// inputs and `out` outputs.
GemmShape linear_gemm(GemmKind kind, int64_t rows, int64_t in, int64_t out);
const char* gemm_kind_name(GemmKind kind);

struct GemmResult {
  std::vector<double> c;      // beta·c0 + A·B
  std::vector<double> scale;  // |beta·c0| + Σ_k |A(m,k)·B(k,n)|
};
// a holds M·K elements, b K·N, c0 M·N (or empty when beta is 0).
GemmResult gemm_reference(const GemmShape& g, const std::vector<float>& a,
                          const std::vector<float>& b, const std::vector<float>& c0, float beta);

// ---- causal self-attention, per head: q, k, v [T, d] ----------------------------------------------
// S = q·kᵀ/√d masked to j <= i, P = softmax_j(S), o = P·v, L_i = log Σ_j exp(S_ij) (= m + log ℓ).
// heads > 1: the buffers hold `heads` such [T, d] blocks one after another (L: heads blocks of T).
struct AttnForward {
  std::vector<double> o, o_scale;  // o_scale[i,c] = Σ_j P_ij·|v_jc|
  std::vector<double> L;           // one per row
};
AttnForward attention_forward_reference(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int64_t heads, int64_t T,
                                        int64_t d);
// The backward from the saved o (as the kernel saved it: rounded) and the exact L:
//   D_i = Σ_c dO_ic·o_ic,  dP_ij = dO_i·v_j,  dS_ij = P_ij·(dP_ij − D_i)
//   dq_i = Σ_j dS_ij·k_j/√d,  dk_j = Σ_i dS_ij·q_i/√d,  dv_j = Σ_i P_ij·dO_i
// Each scale sums |P|·(|dP| + Σ_c |dO_ic·o_ic|)·|k or q| (or P·|dO| for dv): the size of the terms.
struct AttnGrads {
  std::vector<double> dq, dk, dv, dq_scale, dk_scale, dv_scale;
};
AttnGrads attention_backward_reference(const std::vector<float>& q, const std::vector<float>& k,
                                       const std::vector<float>& v, const std::vector<float>& o,
                                       const std::vector<double>& L, const std::vector<float>& dO,
                                       int64_t heads, int64_t T, int64_t d);

// ---- the comparison ------------------------------------------------------------------------
struct Tolerance {
  double rel;  // per unit of |want|: the output's rounding
  double acc;  // per unit of scale: summation order
};
inline constexpr Tolerance kBf16Out{1.0 / 256, 1e-5};  // one bf16 ulp, plus fp32 sums
inline constexpr Tolerance kFp32Out{1e-6, 2e-5};       // fp32 out: summation order only
// Attention's outputs pass with one bf16 rounding of the output and of each term: tensor-core
// kernels round P (and dS) to bf16 before their second GEMM. A kernel that drops ℓ or L misses by
// whole factors, far outside this bound (LabCheck.AttentionCompareRejectsAForgottenLogSumExp).
inline constexpr Tolerance kAttnTol{1.0 / 256, 1.0 / 256};

struct Check {
  bool ok = true;
  int64_t bad = 0;          // elements out of bounds (non-finite included)
  int64_t worst = -1;       // the element furthest out of bounds (in units of its bound)
  double worst_ratio = 0;   // |got - want| / bound there (> 1: out of bounds)
  std::string message;      // "what: 3 of 1000 elements off; worst [17] got 1.5 want 2 (bound 0.01)"
};
// scale may be empty: then every element's summation term uses max(1, |want|).
Check compare(const std::vector<float>& got, const std::vector<double>& want,
              const std::vector<double>& scale, Tolerance tol, const std::string& what);

// Deterministic uniform values in [lo, hi), rounded to bf16 and back (the GPU's inputs).
std::vector<float> random_bf16_values(int64_t n, uint64_t seed, float lo, float hi);

}  // namespace mt::lab
