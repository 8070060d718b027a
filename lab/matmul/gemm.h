#pragma once
// The linear layer's three GEMMs written by hand (docs/lab.md, "The matmul backward by hand").
//
//   C[M,N] = Σ_k A(m,k)·B(k,n)  (+ beta·C),  every buffer row-major, the layouts in GemmShape
//   (lab/check.h): a_t means A is stored as a [K, M] buffer, b_t that B is stored as [N, K].
//   For the layer y = x·Wᵀ, x [rows, in], W [out, in] (ops/linear/linear.h):
//     forward  y  = x·Wᵀ     A = x,   B = Wᵀ   (b_t: W's rows are B's columns)
//     dX       dX = dY·W     A = dY,  B = W    (no transposes)
//     dW       dW += dYᵀ·X   A = dYᵀ, B = X    (a_t: dY's rows are A's columns)
//   No transpose is ever materialized: the kernels read each operand in its own layout.
//
// A and B are bf16; the sums are fp32. C is either bf16 ('=', beta must be 0: y and dX) or fp32
// with beta: beta = 1 adds into an existing fp32 .grad, which is how dW accumulates over
// microbatches without a second buffer, beta = 0 stores.
#include <cuda_runtime.h>

#include "lab/check.h"

namespace mt::lab {

struct GemmArgs {
  GemmShape shape;
  const void* a;  // bf16
  const void* b;  // bf16
  void* c;        // bf16 when !c_fp32, else fp32
  bool c_fp32 = false;
  float beta = 0;
};

// (a) Shared-memory tiles on the fp32 units: 64 x 64 tiles of C, 4 x 4 outputs a thread.
void gemm_tiled(const GemmArgs& g, cudaStream_t s);
// (b) Tensor cores (wmma, bf16 x bf16 -> fp32): 128 x 128 tiles, cp.async multi-buffering.
// Built for the linear layer's three layouts only (a_t and b_t both set is an mt::Error).
void gemm_tensor_core(const GemmArgs& g, cudaStream_t s);
// The production path: ops/linear's cuBLASLt calls. Only the linear layer's three layouts.
void gemm_cublas(const GemmArgs& g, cudaStream_t s);

// What every launcher checks: positive sizes, beta only with fp32 C, non-null buffers.
void check_gemm_args(const GemmArgs& g, const char* who);

}  // namespace mt::lab
