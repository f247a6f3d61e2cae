// CrcCache on its own: versions, invalidation against late puts, the bound.
#include "storage/crc_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace cistern::storage {
namespace {

std::vector<uint8_t> page(uint32_t first_crc) {
  std::vector<uint8_t> p(CrcCache::kPageBytes);
  auto* crcs = reinterpret_cast<uint32_t*>(p.data());
  for (uint32_t i = 0; i < CrcCache::kEntriesPerPage; ++i) crcs[i] = first_crc + i;
  return p;
}

// The generation a reader that misses gets, to put a page with.
uint64_t generation(CrcCache& cache, const CrcCache::Key& k) {
  uint64_t g = 0;
  uint32_t entry;
  EXPECT_FALSE(cache.get(k, ~uint64_t{0}, 0, 1, &entry, &g));  // no page has that version
  return g;
}

TEST(CrcCacheTest, GivesPagesOnlyToReadersOfTheirVersion) {
  uint64_t g = 0;
  CrcCache cache(1 << 20);
  CrcCache::Key k{4, {2, 7}, 0};
  uint32_t out[3] = {};
  EXPECT_FALSE(cache.get(k, 1, 0, 3, out, &g));
  cache.put(k, 1, generation(cache, k), page(100).data());
  ASSERT_TRUE(cache.get(k, 1, 10, 3, out, &g));
  EXPECT_EQ(out[0], 110u);
  EXPECT_EQ(out[2], 112u);
  EXPECT_FALSE(cache.get(k, 2, 10, 3, out, &g));  // a reader of another version
  // Another version of the page replaces it.
  cache.put(k, 2, generation(cache, k), page(500).data());
  ASSERT_TRUE(cache.get(k, 2, 1023, 1, out, &g));
  EXPECT_EQ(out[0], 1523u);
  EXPECT_FALSE(cache.get(k, 1, 0, 1, out, &g));
  EXPECT_EQ(cache.pages(), 1u);
  // Other slots, classes and pages are other keys.
  EXPECT_FALSE(cache.get({4, {2, 8}, 0}, 2, 0, 1, out, &g));
  EXPECT_FALSE(cache.get({5, {2, 7}, 0}, 2, 0, 1, out, &g));
  EXPECT_FALSE(cache.get({4, {2, 7}, 1}, 2, 0, 1, out, &g));
}

TEST(CrcCacheTest, InvalidateDropsEveryPageOfTheSlotAndTurnsAwayLatePuts) {
  uint64_t g = 0;
  CrcCache cache(1 << 20);
  const uint32_t c = 10;  // 64 MiB slots: 16 pages of CRCs
  SlotAddr slot{0, 3}, other{0, 4};
  for (uint32_t p = 0; p < 16; ++p) {
    cache.put({c, slot, p}, 5, generation(cache, {c, slot, p}), page(p).data());
    cache.put({c, other, p}, 5, generation(cache, {c, other, p}), page(p).data());
  }
  EXPECT_EQ(cache.pages(), 32u);
  // A reader read page 0 from the disk before a writer changed the slot.
  uint64_t before = generation(cache, {c, slot, 0});
  cache.invalidate(c, slot);
  uint32_t out;
  for (uint32_t p = 0; p < 16; ++p) {
    EXPECT_FALSE(cache.get({c, slot, p}, 5, 0, 1, &out, &g)) << p;
    EXPECT_TRUE(cache.get({c, other, p}, 5, 0, 1, &out, &g)) << p;
  }
  cache.put({c, slot, 0}, 5, before, page(900).data());  // its late put is refused
  EXPECT_FALSE(cache.get({c, slot, 0}, 5, 0, 1, &out, &g));
  // Pages read after the invalidation are taken.
  cache.put({c, slot, 0}, 6, generation(cache, {c, slot, 0}), page(77).data());
  ASSERT_TRUE(cache.get({c, slot, 0}, 6, 0, 1, &out, &g));
  EXPECT_EQ(out, 77u);
}

TEST(CrcCacheTest, StaysWithinItsBudgetAndKeepsPagesInUse) {
  uint64_t g = 0;
  // 64 pages: 4 per shard.
  CrcCache cache(64 * CrcCache::kPageBytes);
  EXPECT_EQ(cache.capacityPages(), 64u);
  uint32_t out;
  CrcCache::Key hot{1, {0, 0}, 0};
  cache.put(hot, 1, generation(cache, hot), page(42).data());
  for (uint32_t s = 1; s < 5000; ++s) {
    CrcCache::Key k{1, {s / 100, s}, 0};
    cache.put(k, 1, generation(cache, k), page(s).data());
    ASSERT_TRUE(cache.get(hot, 1, 0, 1, &out, &g));  // referenced: CLOCK passes it over
    EXPECT_LE(cache.pages(), 64u);
  }
  EXPECT_EQ(out, 42u);
  EXPECT_GE(cache.pages(), 60u);
  // The newest page is there; most of the old ones are not.
  EXPECT_TRUE(cache.get({1, {49, 4999}, 0}, 1, 0, 1, &out, &g));
  int old = 0;
  for (uint32_t s = 1; s < 1000; ++s) old += cache.get({1, {s / 100, s}, 0}, 1, 0, 1, &out, &g);
  EXPECT_LT(old, 64);
}

}  // namespace
}  // namespace cistern::storage
