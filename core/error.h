#pragma once
// mt::Error: every misuse of the library ends here, with a message that names the call and the
// offending shapes / dtypes / devices, so the user learns what to fix without a debugger.
#include <sstream>
#include <stdexcept>
#include <string>

namespace mt {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A setting that cannot be used: the message names the key ("optim.lr: must be > 0, got -1") and,
// for a config file, where the value came from. `train` exits with code 2.
struct ConfigError : Error {
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// Throws mt::Error with the streamed arguments as its message: MT_THROW("matmul: ", a, " vs ", b).
#define MT_THROW(...) throw ::mt::Error(::mt::detail::concat(__VA_ARGS__))

// Checks a precondition; the message is only built when the check fails.
#define MT_CHECK(cond, ...)          \
  do {                               \
    if (!(cond)) MT_THROW(__VA_ARGS__); \
  } while (0)

}  // namespace mt
