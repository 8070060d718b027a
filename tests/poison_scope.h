#pragma once
// PoisonScope: every new allocation is filled with 0xFF bytes (NaN in every floating dtype) for
// one scope, so an element a kernel never wrote shows as NaN (core/storage.h). The switch is
// restored when the scope ends, an ASSERT's early return or an exception included, so a failing
// test cannot leave it on for the tests after it.
#include "core/storage.h"

namespace mt::test {

struct PoisonScope {
  bool saved = poison_allocations();
  PoisonScope() { set_poison_allocations(true); }
  ~PoisonScope() { set_poison_allocations(saved); }
  PoisonScope(const PoisonScope&) = delete;
  PoisonScope& operator=(const PoisonScope&) = delete;
};

}  // namespace mt::test
