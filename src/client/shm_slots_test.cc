// ShmSlots' read-ahead windows: lending, the offsets servers are given, and
// windows retired for good once a server may still write into them.
#include "client/shm_slots.h"

#include <gtest/gtest.h>

namespace cistern::client {
namespace {

TEST(ShmSlotsTest, WindowsAreLentOnceAndPoisonedOnesNeverAgain) {
  auto shm = ShmSlots::create(1 << 20, 2, (1 << 20) + 1);  // rounded up to 4 KiB
  ASSERT_NE(shm, nullptr);
  EXPECT_EQ(shm->windowBytes(), (1u << 20) + 4096);
  int a = shm->lendWindow(), b = shm->lendWindow();
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_NE(a, b);
  EXPECT_EQ(shm->lendWindow(), -1);
  // Offsets: inside one window only; slots are not windows.
  uint8_t* wa = shm->windowData(a);
  auto at = shm->windowOffset(wa + 8192, 4096);
  ASSERT_TRUE(at.has_value());
  EXPECT_EQ(shm->windowData(a) + 8192 - shm->data(0), static_cast<long>(*at - shm->offset(0)));
  EXPECT_TRUE(shm->windowOffset(wa, shm->windowBytes()).has_value());
  EXPECT_FALSE(shm->windowOffset(wa + 1, shm->windowBytes()).has_value());
  int slot = shm->take();
  ASSERT_GE(slot, 0);
  EXPECT_FALSE(shm->windowOffset(shm->data(slot), 4096).has_value());
  uint8_t heap[16];
  EXPECT_FALSE(shm->windowOffset(heap, sizeof heap).has_value());
  // A window a server may still write into is retired when given back.
  shm->poisonWindow(wa + 100);
  EXPECT_TRUE(shm->windowPoisoned(a));
  EXPECT_FALSE(shm->windowPoisoned(b));
  shm->returnWindow(a);
  shm->returnWindow(b);
  EXPECT_EQ(shm->lendWindow(), b);
  EXPECT_EQ(shm->lendWindow(), -1);
  shm->returnWindow(b);
  EXPECT_EQ(shm->lendWindow(), b);
}

TEST(ShmSlotsTest, NoWindowsWhenNoneAreAskedFor) {
  auto shm = ShmSlots::create(1 << 20);
  ASSERT_NE(shm, nullptr);
  EXPECT_EQ(shm->lendWindow(), -1);
  EXPECT_FALSE(shm->windowOffset(shm->data(0), 4096).has_value());
}

}  // namespace
}  // namespace cistern::client
