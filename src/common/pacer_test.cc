// Pacer: booked bytes space their senders by the rate; idle time gives no
// credit; 0 is no limit.
#include "common/pacer.h"

#include <gtest/gtest.h>

namespace cistern {
namespace {

using namespace std::chrono_literals;

TEST(Pacer, BookedBytesAreSpacedByTheRate) {
  Pacer p(1'000'000);  // 1 MB/s
  const auto t0 = std::chrono::steady_clock::time_point{} + 100s;
  EXPECT_EQ(p.reserve(500'000, t0), t0) << "room now";
  EXPECT_EQ(p.reserve(500'000, t0), t0 + 500ms) << "after the first half second";
  EXPECT_EQ(p.reserve(1, t0 + 200ms), t0 + 1s) << "another thread, later, still waits its turn";
  // Idle for a while: no burst saved up beyond now.
  const auto later = t0 + 10s;
  EXPECT_EQ(p.reserve(2'000'000, later), later);
  EXPECT_EQ(p.reserve(0, later), later + 2s);
}

TEST(Pacer, ZeroIsNoLimit) {
  Pacer p(0);
  const auto t0 = std::chrono::steady_clock::time_point{} + 5s;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p.reserve(1ull << 40, t0), t0);
}

}  // namespace
}  // namespace cistern
