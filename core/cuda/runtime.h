#pragma once
// The CUDA side of the device runtime: one stream per device that all framework work is ordered
// on, memory from the stream-ordered pool (cudaMallocAsync), and the cuBLAS / cuBLASLt handles,
// created once per device and reused (a training step never creates a handle or a plan).
//
// Built only with CUDA (MT_WITH_CUDA). Nothing here synchronizes the host unless its name says so.
#include <cstddef>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace mt::cuda {

// Number of visible GPUs; 0 (never an exception) when there is no driver or no device.
int device_count();
inline bool available() { return device_count() > 0; }

// The framework's stream on `device` (created on first use, non-blocking).
cudaStream_t stream(int device);

// Stream-ordered allocation on the framework's stream. Out of memory is an mt::Error that names
// the bytes asked for and the pool's current usage.
void* alloc(size_t nbytes, int device);
void free(void* ptr, int device);
// Bytes the pool currently holds for live allocations (cudaMemPoolAttrUsedMemCurrent).
size_t pool_used_bytes(int device);
// The most bytes it has held for live allocations since reset_pool_peak() (or since the last
// capture's graph_memory_hint(), which resets it too): torch.cuda.max_memory_allocated's
// counterpart. A graph's carved block is one allocation of the pool, so it counts in full.
size_t pool_peak_bytes(int device);
void reset_pool_peak(int device);
// The same pool, ordered on a caller's stream `s` of `device`: a kernel launcher's scratch buffer
// lives on the stream its kernels run on, which need not be the framework's.
void* alloc_on(cudaStream_t s, size_t nbytes, int device);
void free_on(cudaStream_t s, void* ptr);

// The memory of a CUDA graph. cudaMallocAsync inside a capture records an allocation node and
// its cudaFreeAsync a free node, both replayed every time: a small training step had more of them
// (238) than kernels (149). So while this thread captures (core/cuda/graph.cpp), every allocation
// on the captured stream is carved out of one block reserved just before the capture (best fit,
// freed bytes reused: core/arena.h), and the graph holds only the work. An allocation that does
// not fit falls back to cudaMallocAsync, a node again. The block lives until the graph is
// destroyed and the last tensor carved from it is freed.
struct GraphMemory;
// Reserves `bytes` on `device`'s framework stream and carves this thread's allocations there
// until end_graph_memory(). Returns the block's handle for release_graph_memory().
GraphMemory* begin_graph_memory(int device, size_t bytes);
void end_graph_memory();
void release_graph_memory(GraphMemory* m);
// What a capture on `device` reserves: the largest transient the pool has held beyond its live
// bytes since the previous capture (an eager step before the capture sets it), at least 16 MiB,
// at most half the free device memory. Resets the pool's high-water mark.
size_t graph_memory_hint(int device);

// Page-locked host memory for fast, asynchronous host->device copies (the data loader).
void* alloc_pinned(size_t nbytes);
void free_pinned(void* ptr);

// Copies ordered on the framework's stream of `device`. The *_sync variants wait for the copy.
void copy_h2d(void* dst, const void* src, size_t nbytes, int device);
void copy_d2h_sync(void* dst, const void* src, size_t nbytes, int device);
void synchronize(int device);

// Device-side error reports. A kernel cannot throw: one that finds bad input (cross_entropy's
// out-of-range targets) records it in memory the host can read and carries on. Its op registers
// a check, at static initialization, that turns its record into an mt::Error and clears it.
// synchronize() and copy_d2h_sync() run the checks of their device after waiting, so the error
// surfaces at the first host synchronization after the kernel ran; nothing is checked, and
// nothing waits, anywhere else.
void add_device_error_check(void (*check)(int device));

// The cuBLAS handle, bound to the framework stream, and the cuBLASLt handle, whose calls name
// their stream; made once per device.
cublasHandle_t cublas(int device);
cublasLtHandle_t cublaslt(int device);
// The cuBLASLt workspace for a GEMM on stream `s`: the side stream's own (below), else the
// framework stream's, allocated once. Two GEMMs in flight at once must not share one, so a GEMM
// a caller runs on a stream of its own must not overlap the framework stream's work.
void* cublaslt_workspace(int device, cudaStream_t s, size_t* nbytes);

// A branch beside the framework stream. Inside a graph capture the order of launches on one
// stream becomes a chain of graph nodes, and a replay runs the chain one node after another even
// where a node does not need its predecessor's result; eager, one stream runs its kernels one
// after another too. An op with launches that are independent of each other (a Linear's dW and
// db do not need its dx) puts some of them on branch.stream(): the constructor makes a side
// stream wait for what `main` has enqueued so far, join() makes `main` wait for the side stream,
// and both branches run side by side. When `wanted` is false it does nothing and stream() is
// `main`. Work on the side stream must not allocate from the pool (its scratch would be ordered
// on the wrong stream); the destructor joins if join() was not reached. `main` belongs to the
// current device, as for every launch of the op.
//
// Inside a capture a branch forks only inside this thread's Graph::capture, and only from the
// framework stream it records (one side stream per device serves one capture at a time).
// side_stream() makes the side stream, its cuBLASLt workspace and its events on first use, and
// Graph::capture calls it before it begins, since a capture refuses cudaMalloc. It returns
// nullptr when they could not be made (out of memory): branches then keep their work on `main`.
//
// Outside a capture a branch forks only with `eager`: the host issues eager launches one at a
// time, so for short kernels a second stream adds host calls and no overlap, but two kernels of
// a few hundred microseconds each (the attention backward's passes) do overlap, the second one's
// blocks filling the first one's last wave. The eager side stream is this thread's own (CUDA's
// per-thread stream, with two events of this thread's, made on first use), so threads never
// share one; it has no cuBLASLt workspace of its own, so no GEMM may run on it. A `main` that is
// a default stream (legacy or per-thread), or that something else is capturing, does not fork.
cudaStream_t side_stream(int device);

class SideBranch {
 public:
  SideBranch(cudaStream_t main, bool wanted, bool eager = false);
  ~SideBranch();
  SideBranch(const SideBranch&) = delete;
  SideBranch& operator=(const SideBranch&) = delete;
  cudaStream_t stream() const { return side_; }
  void join();

 private:
  cudaStream_t main_, side_;
  cudaEvent_t join_ = nullptr;
};

// Makes `device` current for the calling thread (cudaSetDevice, checked).
void set_device(int device);
// The calling thread's current device (cudaGetDevice, checked).
int current_device();
// Number of streaming multiprocessors of `device`, read once: kernels size their grids from it.
int sm_count(int device);
// The L2 cache of `device` in bytes, read once: a kernel that walks its data in sections sizes
// them to stay in it.
int l2_bytes(int device);
// The compute capability of `device` as major·10 + minor (an H100 or H200: 90), read once:
// launchers that hold architecture-specific kernels pick them by it.
int compute_capability(int device);

}  // namespace mt::cuda
