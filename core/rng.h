#pragma once
// The random number generator behind rand/randn and data shuffling: xoshiro256** seeded through
// splitmix64, the generator recommended by its authors for this use. Its state is four 64-bit
// words. No checkpoint saves it: what a resumed run draws (shuffles, token windows) comes from a
// generator seeded afresh from the run's seed and the epoch or step.
//
// Uniform doubles take the top 53 bits; normals use Box-Muller on two uniforms. The sequence is
// part of the project's contract: tests and seeds depend on it.
#include <array>
#include <cstdint>

namespace mt {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) { manual_seed(seed); }
  void manual_seed(uint64_t seed);

  uint64_t next_u64();
  double uniform();                          // [0, 1), 53 random bits
  double normal();                           // N(0, 1)
  uint64_t below(uint64_t n);                // uniform integer in [0, n), unbiased

 private:
  std::array<uint64_t, 4> s_{};
};

// The generator the factories use when none is given.
Generator& default_generator();
inline void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace mt
