#pragma once
// The process-wide switches that choose between kernels computing the same thing: whether batch
// reductions take a fixed order, and how CUDA GEMM algorithms are picked. The kernels read them
// as they launch; the trainer sets them from train::Options' precision section.
namespace mt {

// Reductions over the batch (dW of RMSNorm, dw of scaled-SiLU, db) use fixed-order two-pass
// partials by default: the same bits on every run. false allows the atomic variants.
bool deterministic();
void set_deterministic(bool on);

// How a CUDA GEMM's algorithm is chosen, once per shape when its plan is built. false (the
// default): cuBLASLt's first heuristic candidate, the same algorithm, hence the same bits, in
// every run. true: the heuristic's top candidates are each timed on the first call's operands and
// the fastest is kept. Like PyTorch's cudnn.benchmark it is opt-in: timing noise can pick another
// algorithm in another process, and two algorithms may round differently. No effect on the CPU.
bool gemm_autotune();
void set_gemm_autotune(bool on);

}  // namespace mt
