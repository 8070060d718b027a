// CPU data parallelism across processes: `train` itself, started N times, joined by Gloo over
// loopback. (a) `train --nproc N`, (b) N processes started by hand with torchrun's variables and
// the TCP rendezvous: after 20 AdamW steps in f64 the weights equal one rank's with the same
// global batch within 1e-10. A killed rank ends the job with a message within 10 s.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"
#include "app/memory.h"
#include "train/checkpoint.h"
#include "tests/ranks.h"

extern char** environ;

using namespace mt;
using mt::test::connect_to;
using mt::test::free_port;
using mt::test::TempDir;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// The small run every test trains: f64, a global batch of 24 in 20 steps.
std::vector<std::string> run_args(const std::string& ckpt, int microbatches, int steps = 20) {
  std::vector<std::string> a = {"--config", std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml", "--device", "cpu"};
  for (const std::string& s : std::vector<std::string>{"optim.steps=" + std::to_string(steps), "optim.warmup_steps=3",
                        "optim.batch_size=24", "optim.microbatches=" + std::to_string(microbatches),
                        std::string("data.samples=400"), std::string("precision.compute_dtype=f64"),
                        std::string("logging.every=1"), "eval.every=" + std::to_string(steps),
                        "checkpoint.every=" + std::to_string(steps), "checkpoint.dir=" + ckpt}) {
    a.push_back("--set");
    a.push_back(s);
  }
  return a;
}

// Starts `train args` with `env` added to (and overriding) this process's environment, output
// to `log`.
pid_t spawn_train(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                  const std::string& log) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (!env.contains(kv.substr(0, kv.find('=')))) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  const std::string program = std::string(MT_BINARY_DIR) + "/train";
  std::vector<char*> argv{const_cast<char*>(program.c_str())}, envp;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (std::string& kv : env_strings) envp.push_back(kv.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t io;
  posix_spawn_file_actions_init(&io);
  posix_spawn_file_actions_addopen(&io, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&io, 1, 2);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, program.c_str(), &io, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&io);
  return pid;
}

// The exit code of `pid` (128 + the signal if one killed it), or -1 if it is still running
// after `limit` seconds (it is then killed).
int wait_for(pid_t pid, double limit = 120) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(limit);
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The largest |a - b| over the weights of the newest checkpoints in two folders.
double max_weight_diff(const std::string& a, const std::string& b) {
  const train::Checkpoint ca = train::load_checkpoint(a), cb = train::load_checkpoint(b);
  EXPECT_EQ(ca.step, cb.step);
  EXPECT_EQ(ca.model.size(), cb.model.size());
  double worst = 0;
  for (size_t i = 0; i < ca.model.size() && i < cb.model.size(); ++i) {
    const std::vector<double> x = ca.model[i].second.to_vector(), y = cb.model[i].second.to_vector();
    EXPECT_EQ(x.size(), y.size());
    for (size_t j = 0; j < x.size() && j < y.size(); ++j) worst = std::max(worst, std::abs(x[j] - y[j]));
  }
  return worst;
}

// Starts `n` ranks by hand, as torchrun would, with the TCP rendezvous on 127.0.0.1.
std::vector<pid_t> start_ranks(int n, const std::vector<std::string>& args, const TempDir& dir,
                               std::map<std::string, std::string> extra = {}) {
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::map<std::string, std::string> env = extra;
    env["RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = std::to_string(n);
    env["LOCAL_RANK"] = std::to_string(r);
    env["LOCAL_WORLD_SIZE"] = std::to_string(n);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(port - 1);  // the store listens on MASTER_PORT + 1
    env.try_emplace("MT_DIST_TIMEOUT", "30");
    env.try_emplace("MT_DIST_SECRET", "the tests' secret 0123456789");
    pids.push_back(spawn_train(args, env, dir / ("rank" + std::to_string(r) + ".log")));
  }
  return pids;
}

}  // namespace

#ifdef MT_WITH_GLOO
#define MT_NEEDS_GLOO()
#else
#define MT_NEEDS_GLOO() GTEST_SKIP() << "built without Gloo: CPU ranks run as threads only"
#endif

TEST(MultiProcess, NprocAndTorchrunStyleRanksTrainLikeOneRank) {
  MT_NEEDS_GLOO();
  TempDir dir;
  const std::string one = dir / "one";
  ASSERT_EQ(wait_for(spawn_train(run_args(one, 1), {}, dir / "one.log")), 0) << read_file(dir / "one.log");
  for (int n : {1, 2, 3}) {
    const std::string nproc = dir / ("nproc" + std::to_string(n));
    EXPECT_EQ(wait_for(spawn_train([&] {
                auto a = run_args(nproc, 1);
                a.insert(a.end(), {"--nproc", std::to_string(n)});
                return a;
              }(), {}, nproc + ".log")), 0) << read_file(nproc + ".log");
    EXPECT_LE(max_weight_diff(nproc, one), 1e-10) << "--nproc " << n;

    const std::string by_hand = dir / ("hand" + std::to_string(n));
    for (pid_t pid : start_ranks(n, run_args(by_hand, 1), dir))
      EXPECT_EQ(wait_for(pid), 0) << read_file(dir / "rank0.log") << read_file(dir / "rank1.log");
    EXPECT_LE(max_weight_diff(by_hand, one), 1e-10) << n << " ranks by hand";
    // ZeRO-1 over Gloo: reduce-scatter (an all-reduce in Gloo), the sharded update, all-gather.
    const std::string zero = dir / ("zero" + std::to_string(n));
    auto zero_args = run_args(zero, 1);
    zero_args.insert(zero_args.end(), {"--set", "optim.shard_state=true"});
    if (n == 1) {  // one rank of a launcher's job: the sharded path over a communicator of one
      for (pid_t pid : start_ranks(1, zero_args, dir)) EXPECT_EQ(wait_for(pid), 0) << read_file(dir / "rank0.log");
      EXPECT_NE(read_file(dir / "rank0.log").find("ZeRO-1"), std::string::npos) << read_file(dir / "rank0.log");
    } else {
      zero_args.insert(zero_args.end(), {"--nproc", std::to_string(n)});
      EXPECT_EQ(wait_for(spawn_train(zero_args, {}, zero + ".log")), 0) << read_file(zero + ".log");
    }
    EXPECT_LE(max_weight_diff(zero, one), 1e-10) << "ZeRO-1, " << n << " ranks";
    if (n > 1) {  // the log says how the ranks met, and counts its one bucket in the singular
      const std::string log = read_file(dir / "rank0.log");
      EXPECT_NE(log.find("data parallel: " + std::to_string(n) + " ranks"), std::string::npos) << log;
      EXPECT_NE(log.find("gradients in 1 bucket:"), std::string::npos) << log;
    }
  }
}

// The survivors of a killed rank stop at once: the peer's sockets close, so Gloo fails (well under
// a second). MT_DIST_TIMEOUT is 10 minutes here, so a survivor that waited for a timeout instead
// would run past wait_for's 2-minute limit, a limit no machine comes near however busy.
TEST(MultiProcess, AKilledRankEndsTheJobWithAMessage) {
  MT_NEEDS_GLOO();
  TempDir dir;
  const std::vector<std::string> args = run_args(dir / "ckpt", 1, 1'000'000);
  const std::map<std::string, std::string> env = {{"MT_DIST_TIMEOUT", "600"}};
  auto running = [&](const std::string& log) {  // the first step was logged
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (read_file(log).find("step ") == std::string::npos && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };

  // By hand: rank 0 notices rank 1's death itself.
  std::vector<pid_t> pids = start_ranks(2, args, dir, env);
  running(dir / "rank0.log");
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  EXPECT_EQ(wait_for(pids[0]), 1) << "rank 0 should end with an error at once";
  EXPECT_EQ(wait_for(pids[1]), 128 + SIGKILL);
  const std::string log = read_file(dir / "rank0.log");
  EXPECT_NE(log.find("rank 0 of 2: Gloo"), std::string::npos) << log;
  EXPECT_NE(log.find("a peer rank has probably died"), std::string::npos) << log;

  // Under --nproc: the launcher stops the rest and names the worker.
  fs::remove_all(dir / "ckpt");
  std::vector<std::string> nproc_args = args;
  nproc_args.insert(nproc_args.end(), {"--nproc", "3"});
  const pid_t launcher = spawn_train(nproc_args, env, dir / "launcher.log");
  running(dir / "launcher.log");
  std::vector<pid_t> workers;
  {
    std::ifstream children("/proc/" + std::to_string(launcher) + "/task/" + std::to_string(launcher) + "/children");
    for (pid_t p; children >> p;) workers.push_back(p);
  }
  ASSERT_EQ(workers.size(), 3u);
  ASSERT_EQ(::kill(workers[2], SIGKILL), 0);
  EXPECT_EQ(wait_for(launcher), 1);
  const std::string llog = read_file(dir / "launcher.log");
  EXPECT_NE(llog.find("was killed by signal 9"), std::string::npos) << llog;
  EXPECT_NE(llog.find("the job failed"), std::string::npos) << llog;
  for (pid_t w : workers) EXPECT_NE(::kill(w, 0), 0) << "worker " << w << " is still running";
}

// Strangers at the TCP store while the ranks meet (docs/robustness.md, "The rendezvous"): a
// 4 GiB length prefix, text, connect-and-close, 200 idle connections, half a hello. Rank 0 runs
// under a 3 GiB address-space limit, so a store that believes a length fails instead of
// swapping; the job must train as if nobody were there, well within its 20 s timeout.
TEST(MultiProcess, StrangersAtTheStoreNeitherStallNorBloatTheJob) {
  // AddressSanitizer reserves terabytes of shadow memory: it cannot start under ulimit -v.
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "an address-space limit and AddressSanitizer do not mix";
#endif
  MT_NEEDS_GLOO();
  TempDir dir;
  const int port = free_port();
  auto start = [&](int r) {
    return spawn_train(run_args(dir / "ckpt", 1, 5), {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"},
                       {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                       {"MT_DIST_PORT", std::to_string(port)}, {"MT_DIST_TIMEOUT", "20"},
                       {"MT_DIST_SECRET", "the tests' secret 0123456789"}},
                       dir / ("rank" + std::to_string(r) + ".log"));
  };
  const auto t0 = Clock::now();
  const pid_t rank0 = start(0);
  const rlimit as{rlim_t(3) << 30, rlim_t(3) << 30};
  ASSERT_EQ(::prlimit(rank0, RLIMIT_AS, &as, nullptr), 0);
  int fd = -1;
  while ((fd = connect_to(port)) < 0 && Clock::now() - t0 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(fd, 0) << read_file(dir / "rank0.log");
  auto send = [](int s, const std::string& bytes) { return ::send(s, bytes.data(), bytes.size(), MSG_NOSIGNAL); };
  std::vector<int> strangers{fd};
  send(fd, "S" + std::string(4, '\xff') + std::string(200, 'x'));  // a 4 GiB length, then more
  strangers.push_back(connect_to(port));
  send(strangers.back(), std::string(132, 'a'));
  for (int i = 0; i < 5; ++i) ::close(connect_to(port));
  for (int i = 0; i < 200; ++i) {
    strangers.push_back(connect_to(port));
    if (strangers.back() < 0) {
      ADD_FAILURE() << "the store stopped accepting connections after " << i << " idle ones";
      break;
    }
  }
  strangers.push_back(connect_to(port));
  send(strangers.back(), std::string(10, '\0'));
  // A stalled rendezvous ends both ranks with an error after MT_DIST_TIMEOUT (20 s): exit 0 says
  // the strangers did not hold it up.
  const pid_t rank1 = start(1);
  EXPECT_EQ(wait_for(rank0), 0) << read_file(dir / "rank0.log");
  EXPECT_EQ(wait_for(rank1), 0) << read_file(dir / "rank1.log");
  for (int s : strangers)
    if (s >= 0) ::close(s);
}

// Ranks started with different configs (by hand, as a launcher would) stop before training, each
// naming the first key that differs: another learning rate used to train diverging replicas
// silently, another model to abort inside Gloo (exit 134).
TEST(MultiProcess, RanksWithDifferentConfigsNameTheFirstDifferingKey) {
  MT_NEEDS_GLOO();
  TempDir dir;
  for (const std::string& key : {"optim.lr", "model.hidden"}) {
    const int port = free_port();
    std::vector<pid_t> pids;
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = run_args(dir / "ckpt", 1, 5);
      if (r == 1) args.insert(args.end(), {"--set", key == "optim.lr" ? "optim.lr=0.01" : "model.hidden=[16]"});
      pids.push_back(spawn_train(args, {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                        {"MT_DIST_PORT", std::to_string(port)}, {"MT_DIST_TIMEOUT", "20"},
                                        {"MT_DIST_SECRET", "the tests' secret 0123456789"}},
                                 dir / ("rank" + std::to_string(r) + ".log")));
    }
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(wait_for(pids[size_t(r)], 30), 1);
      const std::string got = read_file(dir / ("rank" + std::to_string(r) + ".log"));
      EXPECT_NE(got.find("the ranks of this job differ"), std::string::npos) << got;
      EXPECT_NE(got.find("'" + key + "'"), std::string::npos) << got;
      EXPECT_EQ(got.find("step 1 "), std::string::npos) << "trained before the check: " << got;
    }
    fs::remove_all(dir / "ckpt");
  }
}

// `train --nproc N` checks N against what the job and the machine allow before it starts any
// worker: the global batch (every rank needs its microbatches), the memory of N ranks together,
// the open-file limit (a socket per peer). Each case runs under a 4 GiB address-space limit and
// must end at once, with nothing written and no worker's output: a launcher that spawned first
// started up to 100,000 processes. So must a worker told WORLD_SIZE=2000000000.
TEST(MultiProcess, NprocIsCheckedBeforeAnyWorkerStarts) {
  // AddressSanitizer reserves terabytes of shadow memory: it cannot start under ulimit -v.
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "an address-space limit and AddressSanitizer do not mix";
#endif
  TempDir dir;
  struct Case {
    std::string nproc, limits, set;
    int code;
    std::vector<std::string> says;
  };
  const std::string big = "model.hidden=[16384,16384]";  // about 4.3 GB a rank: 64 ranks cannot fit
  std::vector<Case> cases = {
      {"100000", "ulimit -n 1024;", "", 2, {"--nproc 100000: optim.batch_size"}},
#ifdef MT_WITH_GLOO  // the file limit is the Gloo workers' (a socket per peer); threads need none
      {"30", "ulimit -n 80;", "", 1, {"--nproc 30", "open-file limit is 80", "ulimit -n"}},
#endif
      // A launcher's world that cannot connect: refused before anything is sized by it.
      {"", "ulimit -n 1024; export RANK=0 WORLD_SIZE=2000000000 MASTER_ADDR=127.0.0.1;", "", 2,
       {"WORLD_SIZE=2000000000", "open-file limit is 1024"}},
      {"100", "ulimit -n 1024;", "", 2,
       {"--nproc 100: optim.batch_size 256 samples cannot give 100 ranks 4 microbatches each"}},
  };
  Config c;
  c.model.hidden = {16384, 16384};
  if (64 * app::estimate_memory(c).state > app::physical_memory_bytes())
    cases.push_back({"64", "ulimit -n 1024;", big, 2, {"for each of 64 ranks", "of address space (ulimit -v)"}});
  for (const Case& k : cases) {
    const std::string cmd = "ulimit -v 4194304; " + k.limits + " exec " + std::string(MT_BINARY_DIR) +
                            "/train --config " + std::string(MT_SOURCE_DIR) + "/configs/mlp.yaml --device cpu " +
                            "--set checkpoint.dir=" + std::string(dir / "ck") + (k.set.empty() ? "" : " --set " + k.set) +
                            (k.nproc.empty() ? "" : " --nproc " + k.nproc) + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int status = ::pclose(p);
    SCOPED_TRACE("--nproc " + k.nproc + ": " + out);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == k.code) << status;
    for (const std::string& s : k.says) EXPECT_NE(out.find(s), std::string::npos) << s;
    EXPECT_EQ(out.find("[rank"), std::string::npos) << "a worker started";
    EXPECT_FALSE(fs::exists(dir / "ck"));
  }
}
