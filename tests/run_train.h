#pragma once
// Runs the `train` program this build made, as a user would from a shell.
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace mt::test {

// Runs a shell command line and returns its exit code (-1 when it did not exit normally), its
// stdout in `out` when given.
inline int run_shell(const std::string& cmd, std::string* out) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  std::string text;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) text.append(buf, n);
  const int status = ::pclose(p);
  if (out) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs `train ARGS` and returns its exit code (-1 when it did not exit normally). Its stdout goes
// to `out` when given, with stderr too unless `with_stderr` is false (then stderr is dropped).
inline int run_train(const std::string& args, std::string* out = nullptr, bool with_stderr = true) {
  return run_shell(std::string(MT_BINARY_DIR) + "/train " + args +
                   (with_stderr ? " 2>&1" : " 2>/dev/null"), out);
}

// The same with a per-call limit (coreutils' timeout), for a call that must end at once: exit
// code 124 when `train` was stopped after `limit_s` seconds. The limit is one no machine comes
// near however busy (such a call takes well under a second), so only a call that hangs reaches it.
inline int run_train_within(int limit_s, const std::string& args, std::string* out = nullptr) {
  return run_shell("timeout -k 5 " + std::to_string(limit_s) + " " + std::string(MT_BINARY_DIR) +
                   "/train " + args + " 2>&1", out);
}

// Runs `train ARGS` on a pseudo-terminal, stdout and stderr both, as from an interactive shell
// (the live line is drawn there), and returns what it wrote: newlines arrive as "\r\n". A per-call
// limit (coreutils' timeout, far beyond the seconds it takes) bounds a hang.
inline std::string run_on_terminal(const std::string& args) {
  int terminal = -1;
  const pid_t pid = ::forkpty(&terminal, nullptr, nullptr, nullptr);
  if (pid == 0) {
    const std::string cmd =
        "exec timeout -k 5 120 " + std::string(MT_BINARY_DIR) + "/train " + args;
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string out;
  if (pid < 0) return out;
  char buf[4096];
  // Read until EIO: the program has ended and closed the terminal.
  for (ssize_t n; (n = ::read(terminal, buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  ::close(terminal);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

}  // namespace mt::test
