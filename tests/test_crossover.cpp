// The save-vs-recompute arithmetic of bench/crossover.h, checked against figures worked by hand.
#include <gtest/gtest.h>

#include "bench/crossover.h"

using namespace mt::crossover;

TEST(Crossover, H200BalancePointsAndFourByteRoundTrip) {
  const Gpu h200{4270, 67, 790};
  // 67e12 flops/s over 4270e9 bytes/s; 790e12 over the same.
  EXPECT_NEAR(balance_flops_per_byte(h200.fp32_tflops, h200.bandwidth_gbs), 15.6909, 1e-4);
  EXPECT_NEAR(balance_flops_per_byte(h200.bf16_tflops, h200.bandwidth_gbs), 185.0117, 1e-4);
  // A bf16 value: written (2 bytes) and read back (2 more) is the lesson's 4-byte round trip.
  EXPECT_EQ(round_trip_bytes(2), 4);
  EXPECT_NEAR(crossover_flops_per_element(h200.fp32_tflops, h200.bandwidth_gbs, 2), 62.7635, 1e-4);
  EXPECT_NEAR(crossover_flops_per_element(h200.bf16_tflops, h200.bandwidth_gbs, 2), 740.0468, 1e-4);
}

TEST(Crossover, SaveAndRecomputeTakeTheSameTimeAtTheCrossover) {
  const Gpu g{3350, 67, 989};
  for (double bytes : {2.0, 4.0}) {
    const double f = crossover_flops_per_element(g.bf16_tflops, g.bandwidth_gbs, bytes);
    const double n = 65536.0 * 4096;
    EXPECT_NEAR(recompute_seconds(n, f, g.bf16_tflops) / save_seconds(n, bytes, g.bandwidth_gbs),
                1.0, 1e-12);
  }
  // 2^28 bf16 values saved and reloaded: 2^30 bytes at 4270 GB/s.
  EXPECT_NEAR(save_seconds(double(1 << 28), 2, 4270), double(1 << 30) / 4270e9, 1e-18);
}

TEST(Crossover, CheaperSideFlipsAtTheCrossover) {
  EXPECT_EQ(cheaper(20, 62.8), Choice::recompute);   // a sigmoid against the fp32 rate
  EXPECT_EQ(cheaper(100, 62.8), Choice::save);
  EXPECT_EQ(cheaper(62.8, 62.8), Choice::either);
  EXPECT_STREQ(choice_name(Choice::save), "save");
}
