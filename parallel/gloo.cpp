#include "parallel/gloo.h"

#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "parallel/store.h"

namespace mt::parallel {
namespace {

// Gloo's store interface over the TCP rendezvous.
class TcpStoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit TcpStoreAdapter(TcpStore& s) : s_(s) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_.set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = s_.get(key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const std::string& k : keys) s_.get(k);  // returns once each is there
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    wait(keys);  // the TcpStore's own timeout bounds each
  }

 private:
  TcpStore& s_;
};

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.starts_with("127.") || host == "::1";
}

gloo::transport::tcp::attr device_attr(const World& w) {
  gloo::transport::tcp::attr attr;
  if (const char* iface = std::getenv("MT_GLOO_IFACE")) {
    attr.iface = iface;
  } else if (const char* host = std::getenv("MT_GLOO_HOSTNAME")) {
    attr.hostname = host;
  } else if (w.local_size == w.size || is_loopback(w.master_addr)) {
    attr.hostname = "127.0.0.1";
  } else {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    attr.hostname = name;
  }
  return attr;
}

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const World& w) : world_(w) {
    // A write to a dead peer's socket must fail the collective (EPIPE, a DistError below), not
    // kill this process with SIGPIPE before it can say why.
    std::signal(SIGPIPE, SIG_IGN);
    auto device = gloo::transport::tcp::CreateDevice(device_attr(w));
    auto ctx = std::make_shared<gloo::rendezvous::Context>(w.rank, w.size);
    ctx->setTimeout(w.timeout);
    try {
      if (w.size == 1) {
        gloo::rendezvous::HashStore store;  // nobody to meet
        ctx->connectFullMesh(store, device);
      } else if (!w.id_file.empty()) {
        const std::string dir = w.id_file + ".gloo";
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        gloo::rendezvous::FileStore store(dir);
        ctx->connectFullMesh(store, device);
      } else {
        TcpStore tcp(w.master_addr, w.store_port, w.rank, w.size, w.timeout, w.secret, w.bind_host);
        TcpStoreAdapter store(tcp);
        ctx->connectFullMesh(store, device);
      }
    } catch (const DistError&) {
      throw;
    } catch (const std::exception& e) {
      throw DistError(detail::concat("rank ", w.rank, " of ", w.size, ": Gloo could not connect "
                                     "the ranks within ", w.timeout.count(), " ms: ", e.what()));
    }
    ctx_ = std::move(ctx);
  }
  int rank() const override { return world_.rank; }
  int size() const override { return world_.size; }

 protected:
  void do_all_reduce_sum(const Tensor& t) override {
    run("all_reduce_sum", [&] {
      gloo::AllreduceOptions opts(ctx_);
      if (t.dtype() == DType::f64) {
        opts.setOutput(t.data<double>(), size_t(t.numel()));
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<double>));
      } else {
        opts.setOutput(t.data<float>(), size_t(t.numel()));
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
      }
      gloo::allreduce(opts);
    });
    t.bump_version();
  }
  void do_reduce_scatter_sum(const Tensor& t) override { do_all_reduce_sum(t); }
  void do_all_gather(const Tensor& t) override {
    const int64_t chunk = t.numel() / world_.size;
    const size_t bytes = size_t(chunk) * dtype_size(t.dtype());
    // Gloo's all-gather reads its input apart from its output.
    std::vector<char> mine(bytes);
    std::memcpy(mine.data(), static_cast<char*>(t.data_ptr()) + size_t(world_.rank) * bytes, bytes);
    run("all_gather", [&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(mine.data(), bytes);
      opts.setOutput(static_cast<char*>(t.data_ptr()), bytes * size_t(world_.size));
      gloo::allgather(opts);
    });
    t.bump_version();
  }
  void do_broadcast(const Tensor& t, int root) override {
    run("broadcast", [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(static_cast<char*>(t.data_ptr()), t.nbytes());
      opts.setRoot(root);
      gloo::broadcast(opts);
    });
    t.bump_version();
  }
  void do_barrier() override {
    run("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      gloo::barrier(opts);
    });
  }
  void do_wait() override {}  // every collective has finished when it returns
  void do_synchronize() override {}
  void do_abort(const std::string& why) override {
    if (broken_.empty()) broken_ = detail::concat("aborted: ", why);
  }

 private:
  template <class F>
  void run(const char* what, F&& f) {
    ++calls_;
    if (!broken_.empty())
      throw DistError(detail::concat("rank ", world_.rank, " of ", world_.size, ": ", what,
                                     " (collective #", calls_, ") on a broken communicator: ", broken_));
    try {
      f();
    } catch (const std::exception& e) {
      broken_ = e.what();
      throw DistError(detail::concat("rank ", world_.rank, " of ", world_.size, ": Gloo ", what,
                                     " (collective #", calls_, ") failed: ", e.what(),
                                     ": a peer rank has probably died or stopped (waits are bounded "
                                     "by MT_DIST_TIMEOUT, ", world_.timeout.count() / 1000, " s)"));
    }
  }

  World world_;
  std::shared_ptr<gloo::Context> ctx_;
  int64_t calls_ = 0;
  std::string broken_;
};

}  // namespace

std::shared_ptr<Communicator> make_gloo_communicator(const World& world) {
  return std::make_shared<GlooCommunicator>(world);
}

}  // namespace mt::parallel
