#pragma once
// Runs the `train` program this build made, as a user would from a shell.
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace mt::test {

// Runs `train ARGS` and returns its exit code (-1 when it did not exit normally). Its stdout goes
// to `out` when given, with stderr too unless `with_stderr` is false (then stderr is dropped).
inline int run_train(const std::string& args, std::string* out = nullptr, bool with_stderr = true) {
  const std::string cmd = std::string(MT_BINARY_DIR) + "/train " + args +
                          (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  std::string text;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) text.append(buf, n);
  const int status = ::pclose(p);
  if (out) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace mt::test
