#pragma once
// expect_error: the misuse tests' one assertion. The message must name what the user has to fix
// (the op, the argument, the shapes), so the test checks the words, not only the exception type.
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace mt::test {

// Expects `f` to throw mt::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected mt::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
  }
}

}  // namespace mt::test
