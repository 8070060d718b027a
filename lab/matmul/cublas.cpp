// The production GEMMs, reached through ops/linear's launchers (cuBLASLt), for the lab's checks
// and its fraction-of-cuBLAS table.
#include "core/error.h"
#include "lab/matmul/gemm.h"
#include "ops/linear/linear_cuda.h"

namespace mt::lab {

void check_gemm_args(const GemmArgs& g, const char* who) {
  const GemmShape& sh = g.shape;
  MT_CHECK(sh.M > 0 && sh.N > 0 && sh.K > 0, who, ": bad shape ", sh.str());
  MT_CHECK(g.a != nullptr && g.b != nullptr && g.c != nullptr, who, ": null buffer");
  MT_CHECK(g.c_fp32 || g.beta == 0, who, ": beta = ", g.beta, " needs an fp32 C (a bf16 C is '=')");
}

void gemm_cublas(const GemmArgs& g, cudaStream_t s) {
  check_gemm_args(g, "gemm_cublas");
  const GemmShape& sh = g.shape;
  if (!sh.a_t && sh.b_t && !g.c_fp32)  // y[M,N] = x[M,K]·W[N,K]ᵀ
    return cuda::linear_forward(g.a, g.b, nullptr, g.c, sh.M, sh.N, sh.K, DType::bf16, s);
  if (!sh.a_t && !sh.b_t && !g.c_fp32)  // dX[M,N] = dY[M,K]·W[K,N]: the layer's M, out = K, in = N
    return cuda::linear_backward(nullptr, g.b, g.a, g.c, nullptr, 0, nullptr, sh.M, sh.K, sh.N,
                                 DType::bf16, s);
  if (sh.a_t && !sh.b_t && g.c_fp32)  // dW[M,N] += dY[K,M]ᵀ·X[K,N]: rows = K, out = M, in = N
    return cuda::linear_backward(g.b, nullptr, g.a, nullptr, static_cast<float*>(g.c), g.beta,
                                 nullptr, sh.K, sh.M, sh.N, DType::bf16, s);
  MT_THROW("gemm_cublas: ", sh.str(), g.c_fp32 ? " into fp32" : " into bf16",
           " is not one of the linear layer's GEMMs");
}

}  // namespace mt::lab
