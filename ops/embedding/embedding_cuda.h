#pragma once
// CUDA launchers of the embedding op on raw, contiguous device buffers (the math, the order of
// the scatter-add and the grids: embedding.h). Nothing here waits for the device.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace mt::cuda {

// The first bad id of a forward: what the device records for the host to raise.
struct BadIdRecord {
  int64_t position = -1;  // -1: nothing waiting
  int64_t id = 0, rows = 0;
};

// y[p, :] = W[ids[p], :] ('=', dt) for n positions of C columns, W [V, C]. An id outside [0, V)
// gives a NaN row, and the lowest such position goes to *bad (device-accessible, nullable)
// unless one is already waiting there.
void embedding_forward(const int64_t* ids, const void* W, void* y, BadIdRecord* bad, int64_t n,
                       int64_t V, int64_t C, DType dt, cudaStream_t s);

// dW[v, :] += Σ_{p: ids[p] = v} dy[p, :] in increasing p, fp32; dy [n, C] in dt. Ids outside
// [0, V) are skipped (the forward reported them).
void embedding_backward(const int64_t* ids, const void* dy, float* dW, int64_t n, int64_t V,
                        int64_t C, DType dt, cudaStream_t s);

}  // namespace mt::cuda
