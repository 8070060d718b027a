#include "parallel/nccl.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <cuda_runtime.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "parallel/store.h"

namespace mt::parallel {
namespace {

using Clock = std::chrono::steady_clock;

std::string seconds(std::chrono::milliseconds t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", double(t.count()) / 1000);
  return buf;
}

// Rank 0: the id, to `path` through a temporary name and a rename.
void write_id(const ncclUniqueId& id, const std::string& path) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  MT_CHECK(fd >= 0, "NCCL rendezvous: cannot create '", tmp, "': ", std::strerror(errno));
  const bool ok = ::write(fd, &id, sizeof id) == ssize_t(sizeof id) && ::fsync(fd) == 0;
  ::close(fd);
  MT_CHECK(ok && std::rename(tmp.c_str(), path.c_str()) == 0, "NCCL rendezvous: cannot write '",
           path, "': ", std::strerror(errno));
}

// The other ranks: poll for the file until it holds a whole id.
ncclUniqueId read_id(const std::string& path, int rank, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    ncclUniqueId id;
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
      const size_t n = std::fread(&id, 1, sizeof id, f);
      std::fclose(f);
      if (n == sizeof id) return id;
    }
    if (Clock::now() > deadline)
      throw DistError(detail::concat("rank ", rank, ": no NCCL id appeared in '", path, "' within ",
                                     seconds(timeout), " (did rank 0 start, with the same MT_DIST_FILE?)"));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const World& world, int device)
      : rank_(world.rank), size_(world.size), device_(device), timeout_(world.timeout) {
    const int rank = world.rank, size = world.size;
    const std::string& id_file = world.id_file;
    ::setenv("NCCL_NVLS_ENABLE", "0", 1);
    cuda::set_device(device);
    ncclUniqueId id;
    if (size == 1) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");  // nobody to tell
    } else if (!id_file.empty()) {
      if (rank == 0) {
        check(ncclGetUniqueId(&id), "ncclGetUniqueId");
        write_id(id, id_file);
      } else {
        id = read_id(id_file, rank, timeout_);
      }
    } else {
      // Through rank 0's TCP store; it stays up until every rank has read the id.
      TcpStore store(world.master_addr, world.store_port, rank, size, timeout_, world.secret,
                     world.bind_host);
      if (rank == 0) {
        check(ncclGetUniqueId(&id), "ncclGetUniqueId");
        store.set("nccl-id", std::string(reinterpret_cast<const char*>(&id), sizeof id));
      }
      const std::string got = store.get("nccl-id");
      MT_CHECK(got.size() == sizeof id, "rank ", rank, ": the TCP rendezvous gave an NCCL id of ",
               got.size(), " bytes, not ", sizeof id);
      std::memcpy(&id, got.data(), sizeof id);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "ncclCommInitRankConfig");
    settle("joining the other ranks (ncclCommInitRankConfig)");
    try {
      std::error_code ec;
      if (rank == 0 && !id_file.empty()) std::filesystem::remove(id_file, ec);  // a leftover file is harmless
      // The highest priority: a bucket's all-reduce gets SMs as soon as the backward's kernels
      // free any, rather than after them, so it is done by the time the backward is.
      int least = 0, greatest = 0;
      MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      MT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&previous_, cudaEventDisableTiming));
    } catch (...) {
      release(/*abort=*/true);
      throw;
    }
  }

  ~NcclCommunicator() override { release(/*abort=*/false); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

 protected:
  void do_all_reduce_sum(const Tensor& t) override {
    enter("all_reduce_sum", t);
    check(ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t), ncclSum, comm_,
                        stream_),
          "ncclAllReduce");
    leave("all_reduce_sum");
  }

  // In place: NCCL's chunk r of the buffer is rank r's (recvbuff = sendbuff + r · chunk).
  void do_reduce_scatter_sum(const Tensor& t) override {
    enter("reduce_scatter_sum", t);
    const size_t chunk = size_t(t.numel() / size_);
    char* base = static_cast<char*>(t.data_ptr());
    check(ncclReduceScatter(base, base + size_t(rank_) * chunk * dtype_size(t.dtype()), chunk,
                            nccl_type(t), ncclSum, comm_, stream_),
          "ncclReduceScatter");
    leave("reduce_scatter_sum");
  }
  void do_all_gather(const Tensor& t) override {
    enter("all_gather", t);
    const size_t chunk = size_t(t.numel() / size_);
    char* base = static_cast<char*>(t.data_ptr());
    check(ncclAllGather(base + size_t(rank_) * chunk * dtype_size(t.dtype()), base, chunk,
                        nccl_type(t), comm_, stream_),
          "ncclAllGather");
    leave("all_gather");
  }
  void do_broadcast(const Tensor& t, int root) override {
    enter("broadcast", t);
    check(ncclBroadcast(t.data_ptr(), t.data_ptr(), size_t(t.numel()), nccl_type(t), root, comm_,
                        stream_),
          "ncclBroadcast");
    leave("broadcast");
  }

  void do_barrier() override {
    const Tensor one = ones({1}, DType::f32, cuda_device(device_));
    do_all_reduce_sum(one);
    do_synchronize();
  }

  // The framework stream waits for the last collective; the host, for the one before this call.
  void do_wait() override {
    alive("wait");
    MT_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(device_), done_, 0));
    poll(previous_, "the previous step's collectives");
    MT_CUDA_CHECK(cudaEventRecord(previous_, stream_));
  }

  void do_synchronize() override {
    alive("synchronize");
    do_wait();
    cudaEvent_t all;
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&all, cudaEventDisableTiming));
    MT_CUDA_CHECK(cudaEventRecord(all, cuda::stream(device_)));
    try {
      poll(all, "the device's work and collectives");
    } catch (...) {
      (void)cudaEventDestroy(all);
      throw;
    }
    MT_CUDA_CHECK(cudaEventDestroy(all));
  }

  void do_abort(const std::string& why) override {
    spdlog::error("rank {}: aborting the NCCL communicator: {}", rank_, why);
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  static ncclDataType_t nccl_type(const Tensor& t) {
    return t.dtype() == DType::f64 ? ncclFloat64 : ncclFloat32;
  }

  void alive(const char* what) const {
    if (comm_ == nullptr)
      throw DistError(detail::concat("rank ", rank_, ": ", what, " on an aborted NCCL communicator"));
  }

  // Ends the communicator, then its stream and events (finalize may still flush work queued on
  // the stream). Never throws: a finalize that does not settle in time becomes an abort.
  void release(bool abort) noexcept {
    if (comm_ != nullptr) {
      bool clean = !abort && (ncclCommFinalize(comm_) == ncclSuccess || last_state() == ncclInProgress);
      const auto deadline = Clock::now() + timeout_;
      while (clean && last_state() == ncclInProgress && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      clean = clean && last_state() == ncclSuccess;
      if (clean) (void)ncclCommDestroy(comm_);
      else (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    for (cudaEvent_t e : {ready_, done_, previous_})
      if (e != nullptr) (void)cudaEventDestroy(e);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  void enter(const char* what, const Tensor& t) {
    alive(what);
    MT_CHECK(t.device() == cuda_device(device_), "rank ", rank_, ": ", what, " of a tensor on ",
             t.device().str(), "; this rank's NCCL communicator is on cuda:", device_);
    // The collective starts after the work already queued on the framework stream.
    MT_CUDA_CHECK(cudaEventRecord(ready_, cuda::stream(device_)));
    MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  }

  void leave(const char* what) {
    settle(what);
    MT_CUDA_CHECK(cudaEventRecord(done_, stream_));
  }

  ncclResult_t last_state() const {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return ncclInternalError;
    return state;
  }

  void check(ncclResult_t r, const char* call) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    fail(detail::concat(call, ": ", ncclGetErrorString(r), " (", ncclGetLastError(comm_), ")"));
  }

  // A non-blocking call may still be in progress when it returns: wait for it, up to the timeout.
  void settle(const std::string& what) {
    const auto deadline = Clock::now() + timeout_;
    for (ncclResult_t s = last_state(); s != ncclSuccess; s = last_state()) {
      if (s != ncclInProgress) fail(detail::concat(what, ": ", ncclGetErrorString(s)));
      if (Clock::now() > deadline) fail(detail::concat(what, ": not done after ", seconds(timeout_)));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // The host waits for `event`, watching NCCL for errors; past the timeout a peer is presumed dead.
  void poll(cudaEvent_t event, const std::string& what) {
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      const cudaError_t e = cudaEventQuery(event);
      if (e == cudaSuccess) return;
      MT_CHECK(e == cudaErrorNotReady, "rank ", rank_, ": waiting for ", what, ": ",
               cudaGetErrorString(e));
      if (const ncclResult_t s = last_state(); s != ncclSuccess && s != ncclInProgress)
        fail(detail::concat("waiting for ", what, ": ", ncclGetErrorString(s)));
      if (Clock::now() > deadline)
        fail(detail::concat("waited ", seconds(timeout_), " for ", what,
                            ": a peer rank has probably died or stopped"));
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  [[noreturn]] void fail(const std::string& message) {
    const std::string full = detail::concat("rank ", rank_, " of ", size_, ": NCCL: ", message);
    do_abort(message);
    throw DistError(full);
  }

  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr, previous_ = nullptr;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const World& world, int device) {
  return std::make_shared<NcclCommunicator>(world, device);
}

}  // namespace mt::parallel
