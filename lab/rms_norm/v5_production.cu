// RMSNorm backward, v5: the production kernel (ops/rms_norm/rms_norm_kernels.cuh), called as the
// framework calls it, in its deterministic mode. Whatever that kernel becomes, this row of the table follows.
//
// What it adds to v4 (at the time of writing): each thread keeps its share of the row in
// registers (16 elements a thread for long rows, 32 while a row fits a warp, two rows at once for
// short ones), so the row is read from memory once though it is used twice; rows of d <= 1024 go
// to a warp each (shuffle reductions, no barrier); the grid is one wave sized by the occupancy
// calculator; the dweight sums live in shared memory, laid out for 16-byte conflict-free
// accesses, which leaves the registers to the rows in flight; the column reduce sums 32 slices
// side by side; a V = 1 path runs any d up to 16384 and any alignment; f32 and f16 besides bf16.
#include "lab/lab.h"
#include "ops/rms_norm/rms_norm_cuda.h"

namespace mt::lab::rms_v5 {

void backward(const void* x, const float* weight, const float* rstd, const void* dy, void* dx,
              float* dweight, int64_t rows, int64_t d, cudaStream_t s) {
  cuda::rms_norm_backward(x, weight, rstd, dy, dx, dweight, rows, d, DType::bf16,
                          /*deterministic=*/true, s);
}

}  // namespace mt::lab::rms_v5
