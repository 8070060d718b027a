#include "parallel/launch.h"

#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace mt::parallel {
namespace {

// The signal the launcher received while waiting for its workers (0: none).
volatile std::sig_atomic_t g_signal = 0;

// The integer in variable `name`, or `fallback` when it is unset.
int env_int(const EnvLookup& env, const char* name, int fallback) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  int out = 0;
  const char* end = v + std::strlen(v);
  auto [p, ec] = std::from_chars(v, end, out);
  MT_CHECK(ec == std::errc() && p == end && p != v, "environment: ", name, "='", v,
           "' is not an integer");
  return out;
}

// One launcher's names for rank, world size, local rank and local world size.
struct LauncherVars {
  const char* launcher;
  const char *rank, *size, *local_rank, *local_size;
};
constexpr LauncherVars kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

// The soft limit of `resource`, or -1 when there is none.
int64_t soft_limit(int resource) {
  rlimit r{};
  if (::getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return -1;
  return int64_t(r.rlim_cur);
}

// `ranks` ranks each holding a socket per peer fit under the open-file limit; `what` names them.
void check_open_files(int64_t ranks, const std::string& what) {
  const int64_t files = soft_limit(RLIMIT_NOFILE);
  MT_CHECK(files < 0 || ranks + kReservedFiles <= files, what, ": a rank may hold a socket to "
           "every other rank (the rendezvous, Gloo's full mesh), but the open-file limit is ",
           files, " (ulimit -n), too few for ", ranks, " ranks and ", kReservedFiles, " other files");
}

World parse_world(const EnvLookup& env) {
  World w;
  const int timeout_s = env_int(env, "MT_DIST_TIMEOUT", 120);
  MT_CHECK(timeout_s > 0, "environment: MT_DIST_TIMEOUT=", timeout_s,
           ": need a positive number of seconds");
  w.timeout = std::chrono::seconds(timeout_s);
  const LauncherVars* vars = nullptr;
  for (const LauncherVars& l : kLaunchers)
    if (env(l.rank) != nullptr) {
      vars = &l;
      break;
    }
  if (vars == nullptr) return w;
  w.launcher = vars->launcher;
  MT_CHECK(env(vars->size) != nullptr, "environment: ", vars->rank, " is set (", w.launcher,
           ") but ", vars->size, " is not");
  w.rank = env_int(env, vars->rank, 0);
  w.size = env_int(env, vars->size, 1);
  w.local_rank = env_int(env, vars->local_rank, w.rank);
  w.local_size = vars->local_size ? env_int(env, vars->local_size, 0) : 0;
  MT_CHECK(w.size >= 1 && w.rank >= 0 && w.rank < w.size && w.local_rank >= 0 &&
               (w.local_size == 0 || w.local_rank < w.local_size),
           "environment (", w.launcher, "): ", vars->rank, "=", w.rank, ", ", vars->size, "=",
           w.size, ", ", vars->local_rank, "=", w.local_rank,
           w.local_size ? detail::concat(", ", vars->local_size, "=", w.local_size) : "",
           ": need 0 <= rank < world size and 0 <= local rank < local world size");
  if (w.size == 1) return w;
  check_open_files(w.size, detail::concat("environment (", w.launcher, "): ", vars->size, "=", w.size));
  if (const char* f = env("MT_DIST_FILE")) {
    w.id_file = f;
    return w;
  }
  const char* addr = env("MASTER_ADDR");
  MT_CHECK(addr != nullptr && *addr != '\0', "environment: ", vars->size, "=", w.size, " (",
           w.launcher, ") but neither MASTER_ADDR nor MT_DIST_FILE is set: set MASTER_ADDR (and "
           "MASTER_PORT) to rank 0's host for the TCP rendezvous, or MT_DIST_FILE to a fresh path "
           "every rank can read");
  w.master_addr = addr;
  const int master_port = env_int(env, "MASTER_PORT", 29500);
  // torchrun's agent store listens on MASTER_PORT itself: ours takes the next port.
  w.store_port = env_int(env, "MT_DIST_PORT", master_port + 1);
  MT_CHECK(w.store_port >= 1 && w.store_port <= 65535, "environment: the rendezvous port ",
           w.store_port, env("MT_DIST_PORT") ? " (MT_DIST_PORT)" : " (MASTER_PORT + 1)",
           " is not in 1..65535");
  const char* secret = env("MT_DIST_SECRET");
  MT_CHECK(secret != nullptr && std::strlen(secret) >= 16, "environment: the TCP rendezvous at ",
           w.master_addr, " admits only ranks that know the job's secret: set MT_DIST_SECRET to the "
           "same random string of at least 16 characters on every rank (",
           secret ? detail::concat("it has ", std::strlen(secret)) : std::string("it is unset"),
           "), e.g. export MT_DIST_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n') before "
           "starting the launcher");
  w.secret = secret;
  if (const char* bind = env("MT_DIST_BIND")) w.bind_host = bind;
  return w;
}

}  // namespace

World world_from_env(const EnvLookup& env) {
  // The environment is the job's configuration: a bad value is a ConfigError (exit code 2).
  try {
    return parse_world(env);
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
}

World world_from_env() {
  return world_from_env([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

int run_workers(int nproc, const std::string& program, const std::vector<std::string>& args) {
  MT_CHECK(nproc >= 1, "--nproc must be at least 1, got ", nproc);
  check_open_files(nproc, detail::concat("--nproc ", nproc));
  const int64_t processes = soft_limit(RLIMIT_NPROC);
  MT_CHECK(processes < 0 || nproc < processes, "--nproc ", nproc, ": the process limit is ",
           processes, " (ulimit -u)");
  char dir_template[] = "/tmp/minitrain-job-XXXXXX";
  MT_CHECK(::mkdtemp(dir_template) != nullptr, "cannot create a job directory: ", std::strerror(errno));
  const std::string id_file = std::string(dir_template) + "/nccl-id";

  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      bool ours = false;  // set below, for this worker
      for (const char* name : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                               "MT_DIST_FILE=", "NCCL_NVLS_ENABLE="})
        ours = ours || kv.starts_with(name);
      if (!ours) env_strings.push_back(kv);
    }
    for (const std::string& kv :
         {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(nproc),
          "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(nproc),
          "MT_DIST_FILE=" + id_file, std::string("NCCL_NVLS_ENABLE=0")})
      env_strings.push_back(kv);
    std::vector<char*> envp, argv{const_cast<char*>(program.c_str())};
    for (std::string& kv : env_strings) envp.push_back(kv.data());
    envp.push_back(nullptr);
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int err = ::posix_spawn(&pid, program.c_str(), nullptr, nullptr, argv.data(), envp.data());
    if (err != 0) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      std::error_code ec;
      std::filesystem::remove_all(dir_template, ec);
      MT_THROW("cannot start worker ", r, " (", program, "): ", std::strerror(err));
    }
    pids.push_back(pid);
  }

  // Wait for all; the first failure stops the rest.
  int result = 0, failed_rank = -1;  // -1: none yet; -2: the launcher was signalled
  std::string failure;
  std::vector<bool> running(size_t(nproc), true);
  int left = nproc;
  auto stop_rest = [&] {
    for (int r = 0; r < nproc; ++r)
      if (running[size_t(r)]) ::kill(pids[size_t(r)], SIGTERM);
  };
  // A SIGINT, SIGTERM or SIGHUP to the launcher (Ctrl-C, a scheduler) is passed on to the workers
  // instead of leaving them running; the job then ends as after a failure.
  g_signal = 0;
  struct sigaction forward {}, old_int {}, old_term {}, old_hup {};
  forward.sa_handler = [](int sig) { g_signal = sig; };
  sigemptyset(&forward.sa_mask);
  ::sigaction(SIGINT, &forward, &old_int);
  ::sigaction(SIGTERM, &forward, &old_term);
  ::sigaction(SIGHUP, &forward, &old_hup);
  bool stopping = false;
  std::chrono::steady_clock::time_point kill_at{};
  while (left > 0) {
    if (g_signal != 0 && !stopping) {
      failed_rank = failed_rank < 0 ? -2 : failed_rank;
      if (failed_rank == -2) {
        result = 128 + g_signal;
        failure = detail::concat("the launcher received signal ", int(g_signal), " (",
                                 strsignal(g_signal), ")");
        std::fprintf(stderr, "train: %s; stopping the %d workers\n", failure.c_str(), left);
      }
      stop_rest();
      stopping = true;
      kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid == 0) {  // none exited: once stopping, escalate after the grace period
      if (stopping && std::chrono::steady_clock::now() > kill_at)
        for (int r = 0; r < nproc; ++r)
          if (running[size_t(r)]) ::kill(pids[size_t(r)], SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;  // ECHILD: nothing left to wait for
    }
    int r = 0;
    while (r < nproc && pids[size_t(r)] != pid) ++r;
    if (r == nproc) continue;
    running[size_t(r)] = false;
    --left;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    // A worker killed by a signal we did not send is the likelier cause than one that exited with
    // an error a moment earlier (its peer's death is an error in every other worker): it becomes
    // the job's reported failure, even if it is reaped second.
    const bool killed = WIFSIGNALED(status) && WTERMSIG(status) != SIGTERM &&
                        (!stopping || std::chrono::steady_clock::now() < kill_at);
    if (!ok && failed_rank >= 0 && killed && failure.starts_with("exited")) {
      failed_rank = r;
      result = 1;
      failure = detail::concat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
    }
    if (!ok && failed_rank == -1) {
      failed_rank = r;
      result = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      failure = WIFEXITED(status) ? detail::concat("exited with code ", WEXITSTATUS(status))
                                  : detail::concat("was killed by signal ", WTERMSIG(status), " (",
                                                   strsignal(WTERMSIG(status)), ")");
      if (left > 0 && !stopping) {
        std::fprintf(stderr, "train: worker %d (pid %d) %s; stopping the other %d\n", r, int(pid),
                     failure.c_str(), left);
        stop_rest();
        stopping = true;
        kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      }
    }
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGHUP, &old_hup, nullptr);
  std::error_code ec;
  std::filesystem::remove_all(dir_template, ec);
  if (failed_rank >= 0)
    std::fprintf(stderr, "train: the job failed: worker %d %s\n", failed_rank, failure.c_str());
  else if (failed_rank == -2)
    std::fprintf(stderr, "train: the job was stopped: %s\n", failure.c_str());
  return result;
}

}  // namespace mt::parallel
