// Links minitrain as a subproject and runs one op: the kernels are registered and callable.
#include <cstdio>

#include "minitrain.h"

int main() try {
  const mt::Tensor x = mt::randn({4, 3});
  const mt::Tensor y = mt::nn::Linear(3, 2)(x);
  std::printf("parent_app: %zu ops registered, y has %lld elements\n",
              mt::OpRegistry::instance().ops().size(), (long long)y.numel());
  return y.numel() == 8 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "parent_app: %s\n", e.what());
  return 1;
}
