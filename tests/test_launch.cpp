// Starting a job: the launchers' environment (parallel/launch.h), the TCP rendezvous
// (parallel/store.h), the chunked collectives of the thread group, and the Gloo communicator
// (parallel/gloo.h) with its ranks as threads of this process over loopback.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/rng.h"
#include "core/sha256.h"
#include "parallel/communicator.h"
#include "parallel/job_check.h"
#include "parallel/launch.h"
#include "parallel/store.h"
#include "tests/expect_error.h"
#include "tests/ranks.h"
#ifdef MT_WITH_GLOO
#include "parallel/gloo.h"
#endif

using namespace mt;
using mt::test::connect_to;
using mt::test::free_port;
using mt::test::on_threads;
using mt::test::expect_error;
using Env = std::map<std::string, std::string>;

namespace {

const std::string kSecret = "the tests' secret 0123456789";

parallel::World world_of(const Env& env) {
  return parallel::world_from_env([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

// ---- the launchers' variables -------------------------------------------------------------

TEST(WorldFromEnv, AloneWithoutALauncher) {
  const parallel::World w = world_of({{"MASTER_ADDR", "n1"}});
  EXPECT_EQ(w.size, 1);
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.launcher, "");
}

TEST(WorldFromEnv, Torchrun) {
  const parallel::World w = world_of({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                      {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node7"},
                                      {"MASTER_PORT", "29400"}, {"MT_DIST_TIMEOUT", "9"},
                                      {"MT_DIST_SECRET", kSecret}});
  EXPECT_EQ(w.launcher, "torchrun");
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_size, 4);
  EXPECT_EQ(w.master_addr, "node7");
  EXPECT_EQ(w.store_port, 29401);  // beside torchrun's own store on MASTER_PORT
  EXPECT_EQ(w.id_file, "");
  EXPECT_EQ(w.timeout, std::chrono::seconds(9));
  EXPECT_EQ(w.secret, kSecret);
  EXPECT_EQ(w.bind_host, "");
}

TEST(WorldFromEnv, OpenMpiAndSlurm) {
  const parallel::World mpi = world_of({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "a"},
                                        {"MT_DIST_SECRET", kSecret}});
  EXPECT_EQ(mpi.launcher, "Open MPI");
  EXPECT_EQ(mpi.rank, 3);
  EXPECT_EQ(mpi.size, 4);
  EXPECT_EQ(mpi.local_rank, 1);
  EXPECT_EQ(mpi.local_size, 2);
  EXPECT_EQ(mpi.store_port, 29501);  // MASTER_PORT defaults to 29500
  const parallel::World slurm = world_of({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "7"},
                                          {"SLURM_LOCALID", "2"}, {"MASTER_ADDR", "a"},
                                          {"MT_DIST_PORT", "4000"}, {"MT_DIST_SECRET", kSecret}});
  EXPECT_EQ(slurm.launcher, "Slurm");
  EXPECT_EQ(slurm.rank, 6);
  EXPECT_EQ(slurm.size, 7);
  EXPECT_EQ(slurm.local_rank, 2);
  EXPECT_EQ(slurm.store_port, 4000);  // MT_DIST_PORT overrides MASTER_PORT + 1
}

TEST(WorldFromEnv, TheInnermostLauncherWins) {
  Env env = {{"RANK", "1"},         {"WORLD_SIZE", "2"},          {"OMPI_COMM_WORLD_RANK", "2"},
             {"OMPI_COMM_WORLD_SIZE", "3"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"},
             {"MT_DIST_FILE", "/shared/id"}, {"MASTER_ADDR", "ignored"}};
  parallel::World w = world_of(env);
  EXPECT_EQ(w.launcher, "torchrun");
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.local_rank, 1);  // LOCAL_RANK defaults to the rank
  EXPECT_EQ(w.id_file, "/shared/id");  // the file before TCP
  EXPECT_EQ(w.master_addr, "");
  env.erase("RANK");
  env.erase("WORLD_SIZE");
  w = world_of(env);
  EXPECT_EQ(w.launcher, "Open MPI");
  EXPECT_EQ(w.size, 3);
  env.erase("OMPI_COMM_WORLD_RANK");
  w = world_of(env);
  EXPECT_EQ(w.launcher, "Slurm");
  EXPECT_EQ(w.size, 5);
}

TEST(WorldFromEnv, BadValuesAreClearErrors) {
  expect_error([] { world_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}); }, {"RANK='x1'", "not an integer"});
  expect_error([] { world_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}); },
               {"RANK=2", "WORLD_SIZE=2", "0 <= rank < world size"});
  expect_error([] { world_of({{"OMPI_COMM_WORLD_RANK", "0"}}); },
               {"OMPI_COMM_WORLD_RANK is set", "OMPI_COMM_WORLD_SIZE is not"});
  expect_error([] {
    world_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"},
              {"MASTER_ADDR", "a"}});
  }, {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"});
  expect_error([] { world_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}); },
               {"SLURM_NTASKS=2", "neither MASTER_ADDR nor MT_DIST_FILE"});
  expect_error([] { world_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"},
                              {"MASTER_PORT", "65535"}}); },
               {"port 65536", "MASTER_PORT + 1", "1..65535"});
  expect_error([] { world_of({{"MT_DIST_TIMEOUT", "0"}}); }, {"MT_DIST_TIMEOUT=0"});
  // One rank needs no rendezvous.
  EXPECT_EQ(world_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).size, 1);
}

// The TCP rendezvous admits only the job's ranks: without a secret there is nothing to check.
TEST(WorldFromEnv, TheTcpRendezvousNeedsTheJobsSecret) {
  Env env = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}};
  expect_error([&] { world_of(env); }, {"MT_DIST_SECRET", "it is unset", "at least 16 characters"});
  env["MT_DIST_SECRET"] = "short";
  expect_error([&] { world_of(env); }, {"MT_DIST_SECRET", "it has 5"});
  env["MT_DIST_SECRET"] = kSecret;
  env["MT_DIST_BIND"] = "*";
  const parallel::World w = world_of(env);
  EXPECT_EQ(w.secret, kSecret);
  EXPECT_EQ(w.bind_host, "*");
  // The file rendezvous needs none: the file's folder is the job's.
  EXPECT_EQ(world_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MT_DIST_FILE", "/tmp/x"}}).secret, "");
}

// A world larger than the open-file limit cannot connect (every rank may hold a socket per peer):
// an error at once, before any allocation sized by it.
TEST(WorldFromEnv, AWorldOverTheOpenFileLimitIsRefusedAtOnce) {
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  const std::string over = files.rlim_cur == RLIM_INFINITY ? "2000000000" : std::to_string(files.rlim_cur);
  if (files.rlim_cur == RLIM_INFINITY) GTEST_SKIP() << "no open-file limit here";
  expect_error([&] {
    world_of({{"RANK", "0"}, {"WORLD_SIZE", over}, {"MASTER_ADDR", "127.0.0.1"}, {"MT_DIST_SECRET", kSecret}});
  }, {"WORLD_SIZE=" + over, "open-file limit is " + std::to_string(files.rlim_cur), "ulimit -n"});
  expect_error([] { world_of({{"RANK", "0"}, {"WORLD_SIZE", "2000000000"}, {"MT_DIST_FILE", "/tmp/x"}}); },
               {"WORLD_SIZE=2000000000", "open-file limit"});
  const int fits = int(files.rlim_cur) - parallel::kReservedFiles;
  EXPECT_EQ(world_of({{"RANK", "0"}, {"WORLD_SIZE", std::to_string(fits)}, {"MT_DIST_FILE", "/tmp/x"}}).size, fits);
}

// ---- the TCP rendezvous -------------------------------------------------------------------

TEST(TcpStore, EveryRankGetsEveryRanksValue) {
  const int port = free_port();
  constexpr int n = 3;
  std::vector<std::vector<std::string>> got(static_cast<size_t>(n));
  on_threads(n, [&](int r) {
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 starts last
    parallel::TcpStore store("127.0.0.1", port, r, n, std::chrono::seconds(10), kSecret);
    store.set("addr/" + std::to_string(r), std::string(size_t(100 + r), char('a' + r)));
    for (int k = 0; k < n; ++k) got[size_t(r)].push_back(store.get("addr/" + std::to_string(k)));
  });
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < n; ++k) EXPECT_EQ(got[size_t(r)][size_t(k)], std::string(size_t(100 + k), char('a' + k)));
}

TEST(TcpStore, AKeyNobodySetsTimesOutNamingIt) {
  const int port = free_port();
  parallel::TcpStore store("127.0.0.1", port, 0, 1, std::chrono::milliseconds(300), kSecret);
  expect_error([&] { store.get("nccl-id"); }, {"rank 0", "waited 0.3 s", "'nccl-id'", "MT_DIST_TIMEOUT"});
}

TEST(TcpStore, NoRankZeroIsAClearErrorAfterTheTimeout) {
  const int port = free_port();
  expect_error([&] { parallel::TcpStore("127.0.0.1", port, 1, 2, std::chrono::milliseconds(300), kSecret); },
               {"rank 1", "cannot reach the TCP rendezvous (rank 0) at 127.0.0.1:" + std::to_string(port)});
}

TEST(TcpStore, ADeadRankZeroEndsTheWaitAtOnce) {
  const int port = free_port();
  std::string error;
  on_threads(2, [&](int r) {
    if (r == 0) {
      try {
        parallel::TcpStore store("127.0.0.1", port, 0, 2, std::chrono::seconds(30), kSecret);
        store.set("ready", "1");
        store.get("ack");  // rank 1 is connected and waiting
        throw std::runtime_error("rank 0 fails");  // the store goes down with it
      } catch (const std::runtime_error&) {
      }
      return;
    }
    parallel::TcpStore store("127.0.0.1", port, 1, 2, std::chrono::seconds(30), kSecret);
    EXPECT_EQ(store.get("ready"), "1");
    store.set("ack", "1");
    try {
      store.get("never");
    } catch (const parallel::DistError& e) {
      error = e.what();
    }
  });
  // The closed connection ended the wait, not the 30 s timeout ("waited 30 s for 'never'").
  EXPECT_NE(error.find("closed the connection while waiting for 'never'"), std::string::npos) << error;
}

TEST(TcpStore, ThePortMustBeFree) {
  const int port = free_port();
  parallel::TcpStore first("127.0.0.1", port, 0, 1, std::chrono::seconds(5), kSecret);
  expect_error([&] { parallel::TcpStore("127.0.0.1", port, 0, 1, std::chrono::seconds(5), kSecret); },
               {"cannot listen on port " + std::to_string(port), "MT_DIST_PORT"});
}

// The hash behind the store's hello: FIPS 180-4's and RFC 4231's test vectors.
TEST(Sha256, KnownVectors) {
  EXPECT_EQ(to_hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(to_hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(to_hex(sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(to_hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

// ---- strangers at the rendezvous ------------------------------------------------------------

namespace {

// Up to n bytes, whatever arrives within `ms` (less if the peer closes).
std::string read_for(int fd, size_t n, int ms) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) != 1) continue;
    char buf[256];
    const ssize_t k = ::recv(fd, buf, std::min(sizeof buf, n - out.size()), 0);
    if (k <= 0) break;
    out.append(buf, size_t(k));
  }
  return out;
}

// The peer closed the connection within `ms` (EOF), not merely stayed silent.
bool closed_within(int fd, int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) != 1) continue;
    char buf[256];
    const ssize_t k = ::recv(fd, buf, sizeof buf, 0);  // what it sent before closing is skipped
    if (k == 0) return true;
    if (k < 0) return errno == ECONNRESET;
  }
  return false;
}

void send_bytes(int fd, const std::string& s) { ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), ssize_t(s.size())); }

// The resident memory of this process, in bytes.
double rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  double pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * double(::sysconf(_SC_PAGESIZE));
}

}  // namespace

// Everything a stranger on the host can send before it knows the secret: a length prefix of
// 4 GiB, text, a connect-and-close, 200 idle connections, half a hello, a forged hello. None may
// grow the server, block it, or end the rendezvous early: the ranks meet as if nobody were there.
TEST(TcpStore, StrangersNeitherBlockNorGrowTheStore) {
  const int port = free_port();
  const double rss0 = rss_bytes();
  std::vector<int> strangers;
  std::string rank1_got;
  on_threads(2, [&](int r) {
    if (r == 1) {  // the strangers come first, while rank 0 waits for rank 1
      int fd = -1;
      while ((fd = connect_to(port)) < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      const std::string hello = read_for(fd, 20, 2000);
      EXPECT_EQ(hello.substr(0, 4), "MTS1") << "the server greets first, with its nonce";
      send_bytes(fd, std::string(4, '\xff') + "S" + std::string(31, 'x'));  // a 4 GiB "length"
      EXPECT_EQ(read_for(fd, 1, 2000), "R") << "a hello of rank 2^32 - 1 is turned away";
      ::close(fd);
      fd = connect_to(port);
      EXPECT_EQ(read_for(fd, 20, 2000).size(), 20u);
      send_bytes(fd, std::string("\1\0\0\0", 4) + std::string(32, 'm'));  // rank 1, a made-up MAC
      EXPECT_EQ(read_for(fd, 1, 2000), "R") << "a forged hello is turned away";
      ::close(fd);
      fd = connect_to(port);
      send_bytes(fd, std::string(132, 'a'));  // text
      strangers.push_back(fd);
      for (int i = 0; i < 5; ++i) ::close(connect_to(port));  // connect and close
      for (int i = 0; i < 200; ++i) strangers.push_back(connect_to(port));  // idle
      fd = connect_to(port);
      send_bytes(fd, std::string(10, '\0'));  // half a hello, then nothing
      strangers.push_back(fd);
    }
    parallel::TcpStore store("127.0.0.1", port, r, 2, std::chrono::seconds(20), kSecret);
    store.set("k" + std::to_string(r), std::string(1000, char('a' + r)));
    if (r == 1) rank1_got = store.get("k0");
    else EXPECT_EQ(store.get("k1"), std::string(1000, 'b'));
  });
  // A stranger that stalled the rendezvous would have run the ranks into the store's timeout
  // (20 s): an error, rethrown by on_threads. No clock is read here.
  EXPECT_EQ(rank1_got, std::string(1000, 'a'));
  EXPECT_LT(rss_bytes() - rss0, 64e6) << "the strangers grew the process";
  for (int fd : strangers)
    if (fd >= 0) ::close(fd);
}

// A stranger's connection holds a socket of rank 0 only for a while: at most kMaxPending wait
// for their hello (a new one pushes out the oldest), and each only until its deadline (here the
// 1 s timeout, under the usual 5 s), so a flood cannot exhaust rank 0's open files.
TEST(TcpStore, IdleStrangersArePushedOutAndTimedOut) {
  const int port = free_port();
  parallel::TcpStore rank0("127.0.0.1", port, 0, 2, std::chrono::seconds(1), kSecret);
  std::vector<int> idle;
  for (size_t i = 0; i < parallel::TcpStore::kMaxPending + 1; ++i) idle.push_back(connect_to(port));
  EXPECT_TRUE(closed_within(idle[0], 5000)) << "the oldest waiting connection stays";
  // Each closed by its 1 s deadline; the wait allows a loaded machine ten times that.
  for (size_t i = 1; i < idle.size(); ++i) EXPECT_TRUE(closed_within(idle[i], 10000)) << "connection " << i;
  for (int fd : idle) ::close(fd);
}

TEST(TcpStore, ARankWithAnotherSecretIsTurnedAway) {
  const int port = free_port();
  // (rank 0 waits out its timeout for a rank 1 that never joins, when it goes)
  parallel::TcpStore rank0("127.0.0.1", port, 0, 2, std::chrono::seconds(1), kSecret);
  // Rank 1's own timeout is 120 s, rank 0's 1 s: a hello that rank 0 does not answer is closed
  // after that second, and rank 1 would retry until its 120 s and end with "cannot reach", not
  // with this error.
  expect_error([&] { parallel::TcpStore("127.0.0.1", port, 1, 2, std::chrono::seconds(120), "another secret 0123456789"); },
               {"rank 1", "turned this rank away", "MT_DIST_SECRET"});
  expect_error([&] { parallel::TcpStore("127.0.0.1", port, 1, 2, std::chrono::seconds(1), "short"); },
               {"at least 16", "MT_DIST_SECRET"});
}

// An authenticated rank is bounded too: a key or value over the limit closes its connection, and
// the store serves the others.
TEST(TcpStore, OversizedMessagesCloseTheConnection) {
  const int port = free_port();
  parallel::TcpStore rank0("127.0.0.1", port, 0, 2, std::chrono::seconds(10), kSecret);
  const int fd = connect_to(port);
  const std::string greeting = read_for(fd, 20, 2000);
  ASSERT_EQ(greeting.size(), 20u);
  std::string msg = "minitrain store" + greeting.substr(4);
  const uint32_t rank = 1;
  msg.append(reinterpret_cast<const char*>(&rank), 4);
  const Sha256Digest mac = hmac_sha256(kSecret, msg);
  send_bytes(fd, std::string(reinterpret_cast<const char*>(&rank), 4) + std::string(mac.begin(), mac.end()));
  ASSERT_EQ(read_for(fd, 1, 2000), "A");
  const double rss0 = rss_bytes();
  send_bytes(fd, "S" + std::string(4, '\xff') + "key");  // a key of 4 GiB
  EXPECT_TRUE(closed_within(fd, 2000)) << "the connection stays open";
  EXPECT_LT(rss_bytes() - rss0, 64e6);
  ::close(fd);
  expect_error([&] { rank0.set("k", std::string(parallel::TcpStore::kMaxValueBytes + 1, 'x')); }, {"a value 1048576"});
  rank0.set("k", "v");
  EXPECT_EQ(rank0.get("k"), "v");
}

// The store listens where the job said (MASTER_ADDR), not on every interface of the machine.
TEST(TcpStore, ListensOnlyAtTheJobsAddress) {
  int port = free_port();
  {
    parallel::TcpStore store("127.0.0.1", port, 0, 1, std::chrono::seconds(5), kSecret);
    const int fd = connect_to(port, "127.0.0.2");  // another address of this machine
    EXPECT_LT(fd, 0) << "the store answers at 127.0.0.2 too";
    if (fd >= 0) ::close(fd);
  }
  port = free_port();
  parallel::TcpStore store("127.0.0.1", port, 0, 1, std::chrono::seconds(5), kSecret, "*");
  const int fd = connect_to(port, "127.0.0.2");
  EXPECT_GE(fd, 0) << "MT_DIST_BIND=* listens on every interface";
  if (fd >= 0) ::close(fd);
}

// ---- ranks that must agree ----------------------------------------------------------------

namespace {

// A backend whose collectives, like NCCL's on its own stream, are only enqueued: their results
// land in the tensors at wait(). A reader that skips wait() reads the values from before.
class DeferredResults : public parallel::Communicator {
 public:
  explicit DeferredResults(std::shared_ptr<parallel::Communicator> inner)
      : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

 protected:
  void do_all_reduce_sum(const Tensor& t) override {
    defer(t, [&](auto& c) { inner_->all_reduce_sum(c); });
  }
  void do_reduce_scatter_sum(const Tensor& t) override {
    defer(t, [&](auto& c) { inner_->reduce_scatter_sum(c); });
  }
  void do_all_gather(const Tensor& t) override {
    defer(t, [&](auto& c) { inner_->all_gather(c); });
  }
  void do_broadcast(const Tensor& t, int root) override {
    defer(t, [&](auto& c) { inner_->broadcast(c, root); });
  }
  void do_barrier() override { inner_->barrier(); }
  void do_wait() override {
    for (const auto& [t, result] : pending_) t.copy_(result);
    pending_.clear();
  }
  void do_synchronize() override { do_wait(); }
  void do_abort(const std::string& why) override { inner_->abort(why); }

 private:
  template <class F> void defer(const Tensor& t, F run) {
    const Tensor c = t.clone();
    run(c);
    pending_.emplace_back(t, c);
  }
  std::shared_ptr<parallel::Communicator> inner_;
  std::vector<std::pair<Tensor, Tensor>> pending_;
};

std::vector<std::shared_ptr<parallel::Communicator>> group_of(int n, bool deferred) {
  auto group = parallel::make_local_group(n);
  if (deferred)
    for (auto& c : group) c = std::make_shared<DeferredResults>(c);
  return group;
}

}  // namespace

// Every rank learns that the job is inconsistent and which key differs first; ranks that agree
// pay one all_gather. The same through a backend whose results land only at wait(), as NCCL's:
// the check used to read them before, and ranks that agreed were told they differed.
TEST(CheckSameJob, EveryRankNamesTheFirstDifferingKey) {
  for (bool deferred : {false, true}) {
    SCOPED_TRACE(deferred ? "results at wait()" : "synchronous");
    const parallel::JobEntries base = {{"optim.lr", "0.001"}, {"optim.batch_size", "64"}, {"param.w", "[4, 3] f32"}};
    auto comms = group_of(3, deferred);
    on_threads(3, [&](int r) { parallel::check_same_job(*comms[size_t(r)], base, kCPU); });
    for (const auto& c : comms) EXPECT_EQ(c->all_gather_calls(), 1);

    auto run = [&](const parallel::JobEntries& rank2) {
      auto group = group_of(3, deferred);
      std::vector<std::string> errors(3);
      on_threads(3, [&](int r) {
        try {
          parallel::check_same_job(*group[size_t(r)], r == 2 ? rank2 : base, kCPU);
        } catch (const parallel::DistError& e) {
          errors[size_t(r)] = e.what();
        }
      });
      return errors;
    };
    parallel::JobEntries other = base;
    other[1].second = "32";
    std::vector<std::string> e = run(other);
    for (int r : {0, 1}) {
      EXPECT_NE(e[size_t(r)].find("rank " + std::to_string(r) + ": the ranks of this job differ"), std::string::npos) << e[size_t(r)];
      EXPECT_NE(e[size_t(r)].find("rank 2 differs from rank 0 first at 'optim.batch_size' (64 on rank 0)"), std::string::npos) << e[size_t(r)];
    }
    EXPECT_NE(e[2].find("rank 2: the ranks of this job differ: 'optim.batch_size' is 32 here but 64 on rank 0"),
              std::string::npos) << e[2];
    other = base;
    other.pop_back();
    e = run(other);
    EXPECT_NE(e[2].find("'param.w' is on rank 0 but not here"), std::string::npos) << e[2];
    EXPECT_NE(e[0].find("first at 'param.w'"), std::string::npos) << e[0];
    other = base;
    other.emplace_back("param.b", "[3] f32");
    e = run(other);
    EXPECT_NE(e[2].find("'param.b' is here but not on rank 0"), std::string::npos) << e[2];
    EXPECT_NE(e[1].find("an entry rank 0 does not have, after its last, 'param.w'"), std::string::npos) << e[1];
  }
}

// ---- the chunked collectives --------------------------------------------------------------

// reduce_scatter_sum leaves rank r's chunk r the sum; all_gather copies chunk r from rank r.
void expect_chunked_collectives(const std::vector<std::shared_ptr<parallel::Communicator>>& comms,
                                bool other_chunks_untouched) {
  const int n = int(comms.size());
  const int64_t chunk = 5;
  std::vector<Tensor> ts;
  for (int r = 0; r < n; ++r) ts.push_back(randn({chunk * n}, DType::f64));
  std::vector<std::vector<double>> before;
  for (auto& t : ts) before.push_back(t.to_vector());
  on_threads(n, [&](int r) { comms[size_t(r)]->reduce_scatter_sum(ts[size_t(r)]); });
  for (int r = 0; r < n; ++r) {
    const std::vector<double> after = ts[size_t(r)].to_vector();
    for (int64_t i = 0; i < chunk * n; ++i) {
      double sum = 0;
      for (int k = 0; k < n; ++k) sum += before[size_t(k)][size_t(i)];
      if (i / chunk == r) EXPECT_NEAR(after[size_t(i)], sum, 1e-12) << "rank " << r << " element " << i;
      else if (other_chunks_untouched) EXPECT_EQ(after[size_t(i)], before[size_t(r)][size_t(i)]);
    }
    EXPECT_EQ(comms[size_t(r)]->reduce_scatter_calls(), 1);
  }
  for (auto& t : ts) t.copy_(randn({chunk * n}, DType::f64));
  before.clear();
  for (auto& t : ts) before.push_back(t.to_vector());
  on_threads(n, [&](int r) { comms[size_t(r)]->all_gather(ts[size_t(r)]); });
  for (int r = 0; r < n; ++r) {
    const std::vector<double> after = ts[size_t(r)].to_vector();
    for (int64_t i = 0; i < chunk * n; ++i)
      EXPECT_EQ(after[size_t(i)], before[size_t(i / chunk)][size_t(i)]) << "rank " << r << " element " << i;
    EXPECT_EQ(comms[size_t(r)]->all_gather_calls(), 1);
  }
  if (n > 1)
    expect_error([&] { comms[0]->all_gather(zeros({chunk * n + 1}, DType::f32)); },
                 {"all_gather", "do not split into " + std::to_string(n) + " equal chunks"});
}

TEST(DistLocalGroup, ReduceScatterAndAllGather) {
  manual_seed(11);
  for (int n : {1, 2, 3}) expect_chunked_collectives(parallel::make_local_group(n), true);
}

// ---- Gloo, its ranks as threads over loopback ---------------------------------------------

#ifdef MT_WITH_GLOO
std::vector<std::shared_ptr<parallel::Communicator>> gloo_group(int n, std::chrono::milliseconds timeout) {
  const int port = free_port();
  std::vector<std::shared_ptr<parallel::Communicator>> comms(static_cast<size_t>(n));
  on_threads(n, [&](int r) {
    parallel::World w;
    w.rank = r, w.size = n, w.local_rank = r, w.local_size = n;
    w.master_addr = "127.0.0.1", w.store_port = port, w.timeout = timeout, w.secret = kSecret;
    comms[size_t(r)] = parallel::make_gloo_communicator(w);
  });
  return comms;
}
#endif

TEST(DistGloo, CollectivesOverTcp) {
#ifndef MT_WITH_GLOO
  GTEST_SKIP() << "built without Gloo";
#else
  manual_seed(12);
  for (int n : {1, 2, 3}) {
    auto comms = gloo_group(n, std::chrono::seconds(20));
    std::vector<Tensor> ts;
    for (int r = 0; r < n; ++r) ts.push_back(randn({37}, r % 2 ? DType::f32 : DType::f64).to(DType::f64));
    std::vector<std::vector<double>> before;
    for (auto& t : ts) before.push_back(t.to_vector());
    on_threads(n, [&](int r) { comms[size_t(r)]->all_reduce_sum(ts[size_t(r)]); });
    const std::vector<double> first = ts[0].to_vector();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ts[size_t(r)].to_vector(), first) << "rank " << r << ": every rank gets the same bits";
      for (size_t i = 0; i < first.size(); ++i) {
        double sum = 0;
        for (int k = 0; k < n; ++k) sum += before[size_t(k)][i];
        EXPECT_NEAR(first[i], sum, 1e-12);
      }
    }
    std::vector<Tensor> fs;
    for (int r = 0; r < n; ++r) fs.push_back(randn({9}, DType::f32));
    const std::vector<double> root = fs[size_t(n - 1)].to_vector();
    on_threads(n, [&](int r) {
      comms[size_t(r)]->broadcast(fs[size_t(r)], n - 1);
      comms[size_t(r)]->barrier();
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(fs[size_t(r)].to_vector(), root);
    expect_chunked_collectives(comms, false);
  }
#endif
}

TEST(DistGloo, ADeadPeerFailsTheOthersPromptly) {
#ifndef MT_WITH_GLOO
  GTEST_SKIP() << "built without Gloo";
#else
  auto comms = gloo_group(3, std::chrono::seconds(30));
  comms[2].reset();  // rank 2 goes away: its sockets close
  std::vector<std::string> errors(2);
  on_threads(2, [&](int r) {
    try {
      comms[size_t(r)]->all_reduce_sum(ones({1000}, DType::f32));
    } catch (const parallel::DistError& e) {
      errors[size_t(r)] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[size_t(r)].find("rank " + std::to_string(r) + " of 3: Gloo all_reduce_sum"),
              std::string::npos) << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("a peer rank has probably died"), std::string::npos);
    // The closed sockets ended the wait, not the 30 s timeout (Gloo's "Read timeout", say).
    EXPECT_EQ(errors[size_t(r)].find("timeout"), std::string::npos) << errors[size_t(r)];
  }
  // Broken from then on.
  expect_error([&] { comms[0]->barrier(); }, {"rank 0 of 3", "barrier", "broken communicator"});
#endif
}
