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

TEST(ShmSlotsTest, WindowBuffersBorrowWindowsAndFallBackToTheHeap) {
  auto shm = ShmSlots::create(1 << 20, 1, 1 << 20);
  ASSERT_NE(shm, nullptr);
  ShmWindow a, b;
  a.ensure(shm.get(), 1 << 20);
  b.ensure(shm.get(), 1 << 20);  // none left: the heap
  EXPECT_TRUE(shm->windowOffset(a.data(), 1 << 20).has_value());
  EXPECT_FALSE(shm->windowOffset(b.data(), 1 << 20).has_value());
  ShmWindow only;
  EXPECT_FALSE(only.borrow(shm.get(), 4096));  // none free: no heap either
  EXPECT_FALSE(only.borrow(nullptr, 4096));
  ShmWindow big;
  big.ensure(shm.get(), (1 << 20) + 1);  // larger than a window: the heap
  EXPECT_FALSE(shm->windowOffset(big.data(), 1).has_value());
  big.ensure(nullptr, 4096);
  // Moving hands the window over; destroying gives it back.
  ShmWindow c = std::move(a);
  EXPECT_TRUE(shm->windowOffset(c.data(), 4096).has_value());
  EXPECT_TRUE(c.intact());
  { ShmWindow gone = std::move(c); }
  EXPECT_TRUE(only.borrow(shm.get(), 4096));
  EXPECT_TRUE(shm->windowOffset(only.data(), 4096).has_value());
  EXPECT_FALSE(only.borrow(shm.get(), (1 << 20) + 1));  // gives the window back first
  EXPECT_EQ(shm->lendWindow(), 0);
  shm->returnWindow(0);
  // A poisoned window is given up: the buffer moves to the heap and the
  // window is never lent again.
  ShmWindow d;
  d.ensure(shm.get(), 4096);
  ASSERT_TRUE(shm->windowOffset(d.data(), 4096).has_value());
  shm->poisonWindow(d.data());
  EXPECT_FALSE(d.intact());
  EXPECT_FALSE(shm->windowOffset(d.data(), 4096).has_value());
  d.data()[4095] = 1;  // heap memory of the window's size
  d.data()[(1 << 20) - 1] = 1;
  EXPECT_TRUE(d.intact());
  EXPECT_EQ(shm->lendWindow(), -1);
}

}  // namespace
}  // namespace cistern::client
