#pragma once
// Every CUDA runtime and cuBLAS call goes through one of these checks, and every kernel launch is
// followed by MT_CUDA_CHECK_LAUNCH(): an error becomes an mt::Error naming the call, the file and
// the line, instead of a silent wrong answer several kernels later.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define MT_CUDA_CHECK(call)                                                              \
  do {                                                                                   \
    cudaError_t mt_err_ = (call);                                                        \
    if (mt_err_ != cudaSuccess)                                                          \
      MT_THROW("CUDA error ", cudaGetErrorName(mt_err_), " (", cudaGetErrorString(mt_err_), \
               ") in ", #call, " at ", __FILE__, ":", __LINE__);                          \
  } while (0)

#define MT_CUBLAS_CHECK(call)                                                       \
  do {                                                                              \
    cublasStatus_t mt_st_ = (call);                                                 \
    if (mt_st_ != CUBLAS_STATUS_SUCCESS)                                            \
      MT_THROW("cuBLAS error ", cublasGetStatusName(mt_st_), " (",                  \
               cublasGetStatusString(mt_st_), ") in ", #call, " at ", __FILE__, ":", \
               __LINE__);                                                           \
  } while (0)

// After a <<<...>>> launch: catches bad launch configurations immediately.
#define MT_CUDA_CHECK_LAUNCH() MT_CUDA_CHECK(cudaGetLastError())
