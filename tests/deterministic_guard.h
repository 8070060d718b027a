#pragma once
// DeterministicGuard: sets the deterministic switch (core/switches.h) for one scope and restores
// what it was when the scope ends, so a test that asks for the atomic kernels leaves none behind.
#include "core/switches.h"

namespace mt::test {

struct DeterministicGuard {
  bool saved = deterministic();
  explicit DeterministicGuard(bool on) { set_deterministic(on); }
  ~DeterministicGuard() { set_deterministic(saved); }
  DeterministicGuard(const DeterministicGuard&) = delete;
  DeterministicGuard& operator=(const DeterministicGuard&) = delete;
};

}  // namespace mt::test
