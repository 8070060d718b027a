#pragma once
// The op check from GoogleTest: one expectation per op, failing with the whole report (every
// check's line) so the broken property is named in the test's output.
//
//   TEST(SwiGLU, PassesTheOpCheck) { MT_EXPECT_OP_CHECK(swiglu_spec()); }
//
// Link GoogleTest yourself; minitrain::check does not depend on it.
#include <gtest/gtest.h>

#include "check/op_check.h"

#define MT_EXPECT_OP_CHECK(...)                                        \
  do {                                                                 \
    const ::mt::check::Report mt_report_ = ::mt::check::op_check(__VA_ARGS__); \
    EXPECT_TRUE(mt_report_.ok()) << mt_report_.str();                  \
    if (mt_report_.ok()) std::printf("%s", mt_report_.str().c_str());  \
  } while (0)
