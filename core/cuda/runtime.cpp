// The CUDA device runtime: the framework stream, the stream-ordered pool and the cuBLAS handles
// of each device, each made once, on first use, and kept for the life of the process.
#include "core/cuda/runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/arena.h"
#include "core/cuda/check.h"

namespace mt::cuda {
namespace {

// cuBLAS's recommendation for Hopper; the same buffer serves cuBLAS and cuBLASLt (see below).
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

// What the runtime keeps per device. Each part is made under its own once_flag, so threads that
// ask at the same time get the same stream and handles; if making one throws, the flag stays
// unset and the next call tries again.
struct DeviceState {
  std::once_flag pool_once;
  cudaMemPool_t pool = nullptr;

  std::once_flag stream_once;
  cudaStream_t stream = nullptr;

  std::once_flag blas_once;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  void* workspace = nullptr;

  std::once_flag side_once;  // SideBranch: a second stream, its workspace, two events
  std::atomic<cudaStream_t> side_stream{nullptr};  // also read outside the flag
  void* side_workspace = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;

  std::once_flag sm_once;
  int sm_count = 0;
  std::once_flag l2_once;
  int l2_bytes = 0;
  std::once_flag cc_once;
  int compute_capability = 0;
};

// Streams, handles and the workspace are deliberately never destroyed: static destructors run in
// no useful order at exit (the CUDA runtime may already be gone), and the driver reclaims all of
// it when the process ends.
DeviceState& state(int device) {
  static const int n = device_count();
  static const std::unique_ptr<DeviceState[]> states = std::make_unique<DeviceState[]>(n);
  MT_CHECK(device >= 0 && device < n, "cuda: device ", device, " does not exist (", n,
           " visible)");
  return states[device];
}

// Makes `device` current for one scope: streams and handles are created on the current device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    MT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) MT_CUDA_CHECK(cudaSetDevice(device));
  }
  // A destructor must not throw; restoring a device that was current a moment ago cannot fail
  // unless the context is already broken, and the next checked call will report that.
  ~DeviceGuard() { (void)cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// The device's default pool, configured once: by default the pool hands freed memory back to
// the driver at every synchronization, and the next training step pays to map it again. A
// release threshold of UINT64_MAX keeps it.
cudaMemPool_t pool(int device) {
  DeviceState& st = state(device);
  std::call_once(st.pool_once, [&] {
    MT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&st.pool, device));
    uint64_t keep_everything = UINT64_MAX;
    MT_CUDA_CHECK(
        cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  });
  return st.pool;
}

void init_blas(int device, DeviceState& st) {
  DeviceGuard guard(device);
  MT_CUBLAS_CHECK(cublasCreate(&st.cublas));
  // cublasSetStream resets the workspace to cuBLAS's own, so the stream comes first.
  MT_CUBLAS_CHECK(cublasSetStream(st.cublas, stream(device)));
  // A plain cudaMalloc, not the pool: it lives for the whole process and should not show up in
  // pool_used_bytes, which tests read to find leaks.
  MT_CUDA_CHECK(cudaMalloc(&st.workspace, kCublasWorkspaceBytes));
  MT_CUBLAS_CHECK(cublasSetWorkspace(st.cublas, st.workspace, kCublasWorkspaceBytes));
  // cuBLASLt takes its stream and workspace per call. The cuBLAS handle runs on the framework
  // stream, and so do the framework's cuBLASLt calls, whose kernels therefore never overlap its
  // kernels: one workspace serves both. A GEMM on the side stream (SideBranch) has its own.
  MT_CUBLAS_CHECK(cublasLtCreate(&st.cublaslt));
}

DeviceState& blas_state(int device) {
  DeviceState& st = state(device);
  std::call_once(st.blas_once, [&] { init_blas(device, st); });
  return st;
}

// Filled at static initialization, read-only afterwards.
std::vector<void (*)(int)>& device_error_checks() {
  static std::vector<void (*)(int)> checks;
  return checks;
}

void run_device_error_checks(int device) {
  for (auto check : device_error_checks()) check(device);
}

}  // namespace

void add_device_error_check(void (*check)(int device)) { device_error_checks().push_back(check); }

int device_count() {
  // Read once: the set of visible devices cannot change during a process.
  static const int n = [] {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      // No driver or no device is an answer here, not an error: CUDA tests skip on it. Clear
      // the error so that the next checked call does not report it.
      (void)cudaGetLastError();
      return 0;
    }
    return count;
  }();
  return n;
}

cudaStream_t stream(int device) {
  DeviceState& st = state(device);
  std::call_once(st.stream_once, [&] {
    DeviceGuard guard(device);
    // Non-blocking: no implicit synchronization with the legacy default stream, which a library
    // the user links might use.
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking));
  });
  return st.stream;
}

struct GraphMemory {
  int device;
  cudaStream_t stream;
  char* base;
  Arena arena;
  bool released = false;  // the graph is gone; the block goes when its last tensor does
};

namespace {
// Never destroyed (like the streams above): a CUDA tensor freed during static destruction still
// finds them.
std::mutex& graph_memory_mutex = *new std::mutex;
std::vector<std::unique_ptr<GraphMemory>>& graph_blocks =  // every block still allocated
    *new std::vector<std::unique_ptr<GraphMemory>>;
thread_local GraphMemory* carving = nullptr;  // this thread's capture, if any

// With graph_memory_mutex held: frees the blocks of released graphs that nothing uses any more.
// Not while their stream is being captured: a free there would become part of that capture
// (and fail it, since the block was allocated outside); the next free after it tries again.
void drop_unused() {
  for (size_t i = 0; i < graph_blocks.size();) {
    GraphMemory& m = *graph_blocks[i];
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (m.released && m.arena.live() == 0 &&
        cudaStreamIsCapturing(m.stream, &status) == cudaSuccess &&
        status == cudaStreamCaptureStatusNone) {
      MT_CUDA_CHECK(cudaFreeAsync(m.base, m.stream));
      graph_blocks.erase(graph_blocks.begin() + std::ptrdiff_t(i));
    } else {
      ++i;
    }
  }
}
}  // namespace

GraphMemory* begin_graph_memory(int device, size_t bytes) {
  MT_CHECK(carving == nullptr, "begin_graph_memory: this thread is already capturing");
  auto m = std::make_unique<GraphMemory>(
      GraphMemory{device, stream(device), nullptr, Arena(bytes), false});
  m->base = static_cast<char*>(alloc_on(m->stream, m->arena.capacity(), device));
  std::lock_guard<std::mutex> lock(graph_memory_mutex);
  graph_blocks.push_back(std::move(m));
  carving = graph_blocks.back().get();
  return carving;
}

void end_graph_memory() { carving = nullptr; }

void release_graph_memory(GraphMemory* m) {
  if (m == nullptr) return;
  std::lock_guard<std::mutex> lock(graph_memory_mutex);
  for (const auto& block : graph_blocks)
    if (block.get() == m) m->released = true;
  drop_unused();
}

size_t graph_memory_hint(int device) {
  uint64_t used = 0, high = 0;
  MT_CUDA_CHECK(cudaMemPoolGetAttribute(pool(device), cudaMemPoolAttrUsedMemCurrent, &used));
  MT_CUDA_CHECK(cudaMemPoolGetAttribute(pool(device), cudaMemPoolAttrUsedMemHigh, &high));
  uint64_t reset = 0;
  MT_CUDA_CHECK(cudaMemPoolSetAttribute(pool(device), cudaMemPoolAttrUsedMemHigh, &reset));
  size_t free_bytes = 0, total = 0;
  {
    DeviceGuard guard(device);
    MT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  }
  const size_t want = std::max<size_t>(size_t(high - std::min(high, used)), size_t(16) << 20);
  return std::min(want, free_bytes / 2);
}

void* alloc_on(cudaStream_t s, size_t nbytes, int device) {
  if (nbytes == 0) return nullptr;
  if (GraphMemory* m = carving; m != nullptr && m->device == device && m->stream == s) {
    std::lock_guard<std::mutex> lock(graph_memory_mutex);
    if (std::optional<size_t> off = m->arena.allocate(nbytes)) return m->base + *off;
  }
  pool(device);  // configure the pool before its first allocation
  void* ptr = nullptr;
  cudaError_t err = cudaMallocAsync(&ptr, nbytes, s);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // allocation errors are not sticky: clear it and report it here
    if (err == cudaErrorMemoryAllocation)
      MT_THROW("cuda:", device, " out of memory: asked for ", nbytes, " bytes (",
               nbytes >> 20, " MiB) while the pool holds ", pool_used_bytes(device),
               " bytes in live allocations");
    MT_THROW("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
             ") in cudaMallocAsync of ", nbytes, " bytes on cuda:", device);
  }
  return ptr;
}

void free_on(cudaStream_t s, void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(graph_memory_mutex);
    const char* p = static_cast<const char*>(ptr);
    for (size_t i = 0; i < graph_blocks.size(); ++i) {
      GraphMemory& m = *graph_blocks[i];
      if (p >= m.base && p < m.base + m.arena.capacity()) {  // carved: back to its graph's block
        m.arena.free(size_t(p - m.base));
        drop_unused();
        return;
      }
    }
  }
  MT_CUDA_CHECK(cudaFreeAsync(ptr, s));
}

void* alloc(size_t nbytes, int device) { return alloc_on(stream(device), nbytes, device); }

void free(void* ptr, int device) {
  if (ptr == nullptr) return;
  free_on(stream(device), ptr);
}

size_t pool_used_bytes(int device) {
  uint64_t used = 0;
  MT_CUDA_CHECK(cudaMemPoolGetAttribute(pool(device), cudaMemPoolAttrUsedMemCurrent, &used));
  return size_t(used);
}

size_t pool_peak_bytes(int device) {
  uint64_t high = 0;
  MT_CUDA_CHECK(cudaMemPoolGetAttribute(pool(device), cudaMemPoolAttrUsedMemHigh, &high));
  return size_t(high);
}

void reset_pool_peak(int device) {
  uint64_t reset = 0;
  MT_CUDA_CHECK(cudaMemPoolSetAttribute(pool(device), cudaMemPoolAttrUsedMemHigh, &reset));
}

void* alloc_pinned(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  void* ptr = nullptr;
  cudaError_t err = cudaMallocHost(&ptr, nbytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    MT_THROW("cudaMallocHost: could not pin ", nbytes, " bytes (", nbytes >> 20, " MiB): ",
             cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  }
  return ptr;
}

void free_pinned(void* ptr) {
  if (ptr == nullptr) return;
  MT_CUDA_CHECK(cudaFreeHost(ptr));
}

void copy_h2d(void* dst, const void* src, size_t nbytes, int device) {
  if (nbytes == 0) return;
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream(device)));
}

void copy_d2h_sync(void* dst, const void* src, size_t nbytes, int device) {
  if (nbytes == 0) return;
  cudaStream_t s = stream(device);
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  run_device_error_checks(device);
}

void synchronize(int device) {
  MT_CUDA_CHECK(cudaStreamSynchronize(stream(device)));
  run_device_error_checks(device);
}

cublasHandle_t cublas(int device) { return blas_state(device).cublas; }

cublasLtHandle_t cublaslt(int device) { return blas_state(device).cublaslt; }

namespace {

// Makes the side stream, its workspace and its two events once. If any of them cannot be made
// (out of memory), none is kept and side_stream stays null: branches then keep their work on
// the framework stream, which is slower but the same arithmetic, rather than failing a capture.
DeviceState& side_state(int device) {
  DeviceState& st = state(device);
  std::call_once(st.side_once, [&] {
    DeviceGuard guard(device);
    cudaStream_t side = nullptr;
    void* workspace = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
    const bool made = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess &&
                      cudaMalloc(&workspace, kCublasWorkspaceBytes) == cudaSuccess &&
                      cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess &&
                      cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess;
    if (!made) {
      (void)cudaGetLastError();  // not a sticky error: the next checked call must not see it
      if (join != nullptr) (void)cudaEventDestroy(join);
      if (fork != nullptr) (void)cudaEventDestroy(fork);
      if (workspace != nullptr) (void)cudaFree(workspace);
      if (side != nullptr) (void)cudaStreamDestroy(side);
      return;
    }
    st.side_workspace = workspace;
    st.fork = fork;
    st.join = join;
    st.side_stream = side;  // last: whoever sees the stream finds the rest ready
  });
  return st;
}

// Makes `main` wait for everything enqueued on `side` so far.
cudaError_t enqueue_join(cudaEvent_t join, cudaStream_t side, cudaStream_t main) {
  const cudaError_t err = cudaEventRecord(join, side);
  return err != cudaSuccess ? err : cudaStreamWaitEvent(main, join, 0);
}

}  // namespace

cudaStream_t side_stream(int device) { return side_state(device).side_stream; }

void* cublaslt_workspace(int device, cudaStream_t s, size_t* nbytes) {
  if (nbytes != nullptr) *nbytes = kCublasWorkspaceBytes;
  DeviceState& st = state(device);
  if (s != nullptr && s == st.side_stream.load()) return st.side_workspace;
  return blas_state(device).workspace;
}

namespace {

// This thread's fork and join events for eager branches on each device, made together on first
// use (neither kept if one cannot be made: branches then stay on `main`, as in a capture) and
// destroyed with the thread (errors ignored: at exit the runtime may already be gone).
struct EagerEvents {
  struct Pair {
    cudaEvent_t fork = nullptr, join = nullptr;
  };
  std::vector<Pair> by_device;
  static void destroy(const Pair& p) {
    if (p.join != nullptr) (void)cudaEventDestroy(p.join);
    if (p.fork != nullptr) (void)cudaEventDestroy(p.fork);
  }
  ~EagerEvents() {
    for (const Pair& p : by_device) destroy(p);
  }
  const Pair& of(int device) {
    if (by_device.size() <= size_t(device)) by_device.resize(size_t(device) + 1);
    Pair& pair = by_device[size_t(device)];
    if (pair.fork == nullptr) {
      Pair made;
      if (cudaEventCreateWithFlags(&made.fork, cudaEventDisableTiming) == cudaSuccess &&
          cudaEventCreateWithFlags(&made.join, cudaEventDisableTiming) == cudaSuccess) {
        pair = made;
      } else {
        (void)cudaGetLastError();  // not a sticky error: the next checked call must not see it
        destroy(made);
      }
    }
    return pair;
  }
};

}  // namespace

SideBranch::SideBranch(cudaStream_t main, bool wanted, bool eager) : main_(main), side_(main) {
  if (!wanted) return;
  if (carving == nullptr) {  // eager: this thread's per-thread stream, if main is not captured
    if (!eager || main == nullptr || main == cudaStreamLegacy || main == cudaStreamPerThread)
      return;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    MT_CUDA_CHECK(cudaStreamIsCapturing(main, &status));
    if (status != cudaStreamCaptureStatusNone) return;
    thread_local EagerEvents events;
    const EagerEvents::Pair& pair = events.of(current_device());
    if (pair.fork == nullptr) return;
    MT_CUDA_CHECK(cudaEventRecord(pair.fork, main));
    MT_CUDA_CHECK(cudaStreamWaitEvent(cudaStreamPerThread, pair.fork, 0));
    side_ = cudaStreamPerThread;
    join_ = pair.join;
    return;
  }
  // Only inside this thread's Graph::capture, from the framework stream it records: there is one
  // side stream per device, and one capture of that framework stream at a time. (Graph::capture
  // made the side stream before it began: a capture refuses the cudaMalloc of its workspace.)
  if (carving->stream != main) return;
  DeviceState& st = state(carving->device);
  if (st.side_stream.load() == nullptr) return;
  // Recording an event and waiting on it inside a capture adds no node: it is an edge from
  // main's last node to the side stream's next one.
  MT_CUDA_CHECK(cudaEventRecord(st.fork, main));
  MT_CUDA_CHECK(cudaStreamWaitEvent(st.side_stream, st.fork, 0));
  side_ = st.side_stream;
  join_ = st.join;
}

void SideBranch::join() {
  if (side_ == main_) return;
  MT_CUDA_CHECK(enqueue_join(join_, side_, main_));
  side_ = main_;
}

SideBranch::~SideBranch() {
  // An exception left the branch open: join it so that the capture can end (which then reports
  // the failure); a destructor must not throw.
  if (side_ != main_) (void)enqueue_join(join_, side_, main_);
}

void set_device(int device) { MT_CUDA_CHECK(cudaSetDevice(device)); }

int current_device() {
  int device = 0;
  MT_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

int sm_count(int device) {
  DeviceState& st = state(device);
  std::call_once(st.sm_once, [&] {
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&st.sm_count, cudaDevAttrMultiProcessorCount, device));
  });
  return st.sm_count;
}

int l2_bytes(int device) {
  DeviceState& st = state(device);
  std::call_once(st.l2_once, [&] {
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&st.l2_bytes, cudaDevAttrL2CacheSize, device));
  });
  return st.l2_bytes;
}

int compute_capability(int device) {
  DeviceState& st = state(device);
  std::call_once(st.cc_once, [&] {
    int major = 0, minor = 0;
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    st.compute_capability = major * 10 + minor;
  });
  return st.compute_capability;
}

}  // namespace mt::cuda
