#include "common/random.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/clock.h"

namespace cistern {
namespace {

TEST(Random, SameSeedSameSequence) {
  Xoshiro256 a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    uint64_t x = a.next();
    EXPECT_EQ(x, b.next());
    differs |= x != c.next();
  }
  EXPECT_TRUE(differs);
}

TEST(Random, UniformStaysInRangeAndCoversIt) {
  Xoshiro256 r(7);
  int counts[10] = {};
  for (int i = 0; i < 100000; ++i) {
    uint64_t x = r.uniform(10);
    ASSERT_LT(x, 10u);
    counts[x]++;
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 600);
  for (int i = 0; i < 1000; ++i) {
    double u = r.unit();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(ManualClock, SleepWakesOnlyWhenAdvanced) {
  ManualClock clock;
  SteadyTime t0 = clock.now();
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.sleepFor(std::chrono::seconds(10));
    woke = true;
  });
  while (clock.sleepers() == 0) std::this_thread::yield();
  clock.advance(std::chrono::seconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(woke.load());
  clock.advance(std::chrono::seconds(5));
  sleeper.join();
  EXPECT_TRUE(woke.load());
  EXPECT_EQ(clock.now() - t0, std::chrono::seconds(10));
}

}  // namespace
}  // namespace cistern
