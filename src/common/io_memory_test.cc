#include "common/io_memory.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace cistern::io_memory {
namespace {

TEST(IoMemory, RegionsAreWholeAlignedPagesThatHoldTheirBytes) {
  for (size_t bytes :
       {size_t{1}, size_t{4096}, kPageBytes - 1, kPageBytes, kPageBytes + 1, size_t{5} << 20}) {
    Region r(bytes);
    ASSERT_TRUE(r) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r.data()) % kPageBytes, 0u) << bytes;
    // Rounded up to whole pages: every byte of them is usable.
    const size_t whole = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
    std::memset(r.data(), 0xa5, whole);
    EXPECT_EQ(r.data()[whole - 1], 0xa5);
    EXPECT_TRUE(contains(r.data(), whole));
    EXPECT_TRUE(contains(r.data() + whole - 1, 1));
    EXPECT_TRUE(contains(r.data() + 4096, whole - 4096));
    EXPECT_FALSE(contains(r.data() + 4096, whole)) << "runs past the end";
    EXPECT_FALSE(contains(r.data() + whole, 1));
    EXPECT_FALSE(contains(r.data() - 1, 2));
  }
}

TEST(IoMemory, OtherMemoryAndFreedRegionsAreNotContained) {
  std::vector<uint8_t> heap(1 << 20);
  EXPECT_FALSE(contains(heap.data(), heap.size()));
  int on_stack = 0;
  EXPECT_FALSE(contains(&on_stack, sizeof on_stack));
  uint8_t* p = allocate(kPageBytes);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(contains(p, kPageBytes));
  free(p, kPageBytes);
  EXPECT_FALSE(contains(p, 1));
}

TEST(IoMemory, RegionsNextToEachOtherStaySeparate) {
  // Two regions may be mapped back to back; a range across both is in
  // neither.
  std::vector<Region> rs;
  for (int i = 0; i < 8; ++i) rs.emplace_back(kPageBytes);
  for (auto& a : rs) {
    for (auto& b : rs) {
      if (b.data() == a.data() + kPageBytes) {
        EXPECT_FALSE(contains(a.data() + kPageBytes - 4096, 8192));
        EXPECT_TRUE(contains(b.data(), 4096));
      }
    }
  }
}

TEST(IoMemory, BadSizesFailWithAnErrno) {
  errno = 0;
  EXPECT_EQ(allocate(0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(allocate(size_t{1} << 62), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  Region none(0);
  EXPECT_FALSE(none);
  EXPECT_EQ(none.size(), 0u);
  free(nullptr, 0);  // nothing to do
}

TEST(IoMemory, RegionsMoveAndFreeOnce) {
  Region a(kPageBytes);
  uint8_t* p = a.data();
  Region b(std::move(a));
  EXPECT_FALSE(a);
  EXPECT_EQ(b.data(), p);
  Region c(kPageBytes);
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_TRUE(contains(p, kPageBytes));
  c.reset();
  EXPECT_FALSE(contains(p, 1));
}

TEST(IoMemory, ConcurrentAllocationsAndLookups) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 200; ++i) {
        Region r(kPageBytes / 2);
        ASSERT_TRUE(r);
        r.data()[0] = 1;
        ASSERT_TRUE(contains(r.data(), r.size()));
      }
    });
  }
  for (auto& t : threads) t.join();
}

// The kB of `field` in /proc/self/smaps for the mapping that holds p.
long smapsField(const void* p, const std::string& field) {
  std::ifstream f("/proc/self/smaps");
  const auto at = reinterpret_cast<unsigned long>(p);
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      in = lo <= at && at < hi;  // a mapping's first line
      continue;
    }
    if (in && line.rfind(field + ":", 0) == 0) {
      std::istringstream in_line(line.substr(field.size() + 1));
      long kb = 0;
      in_line >> kb;
      return kb;
    }
  }
  return -1;
}

TEST(IoMemory, TouchedRegionsGetHugePagesWhereTheKernelHasThem) {
  if (!hugePagesEnabled()) GTEST_SKIP() << "transparent huge pages are off on this kernel";
  // Four pages: one may fall back to 4 KiB pages when memory is fragmented,
  // all of them should not.
  Region r(4 * kPageBytes);
  ASSERT_TRUE(r);
  std::memset(r.data(), 1, r.size());
  const long kb = smapsField(r.data(), "AnonHugePages");
  ASSERT_GE(kb, 0) << "no smaps entry for the region";
  EXPECT_GE(kb, 2048);
}

}  // namespace
}  // namespace cistern::io_memory
