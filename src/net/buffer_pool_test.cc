#include "net/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "common/io_memory.h"

namespace cistern::net {
namespace {

TEST(BufferPool, BuffersAreBlockAlignedAndLargeEnough) {
  BufferPool pool;
  for (size_t n : {size_t{1}, size_t{4096}, size_t{4097}, size_t{1} << 20, (size_t{1} << 20) + 1}) {
    PooledBuffer b = pool.get(n);
    EXPECT_EQ(b.size(), n);
    EXPECT_GE(b.capacity(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u) << n;
    std::memset(b.data(), 0xab, b.capacity());  // the whole capacity is ours
  }
}

TEST(BufferPool, ReleasedBuffersAreReusedUpToTheCacheLimit) {
  BufferPool pool(2u << 20);
  uint8_t* first;
  {
    PooledBuffer b = pool.get(1 << 20);
    first = b.data();
  }
  PooledBuffer again = pool.get(1000 * 1000);  // the same 1 MiB class
  EXPECT_EQ(again.data(), first);
  // Beyond the cache limit, released buffers are freed instead.
  std::vector<PooledBuffer> many;
  for (int i = 0; i < 4; ++i) many.push_back(pool.get(1 << 20));
  many.clear();
  std::set<uint8_t*> seen;
  for (int i = 0; i < 4; ++i) many.push_back(pool.get(1 << 20));
  for (auto& b : many) seen.insert(b.data());
  EXPECT_EQ(seen.size(), 4u);
}

TEST(BufferPool, BuffersMayOutliveThePool) {
  PooledBuffer b;
  {
    BufferPool pool;
    b = pool.get(8192);
  }
  std::memset(b.data(), 1, b.size());
}

TEST(BufferPool, LargeBuffersLieInHugePageRegions) {
  if (!io_memory::hugePagesEnabled()) GTEST_SKIP() << "transparent huge pages are off";
  BufferPool pool;
  for (size_t n : {size_t{1} << 20, (size_t{1} << 20) - 4096, size_t{2} << 20, size_t{3} << 20}) {
    PooledBuffer b = pool.get(n);
    EXPECT_TRUE(io_memory::contains(b.data(), b.capacity())) << n;
    std::memset(b.data(), 0x5a, b.capacity());
  }
  PooledBuffer small = pool.get(512 << 10);
  EXPECT_FALSE(io_memory::contains(small.data(), small.size()));
  // The two halves of one region are two buffers.
  PooledBuffer a = pool.get(1 << 20), b = pool.get(1 << 20);
  EXPECT_NE(a.data(), b.data());
  std::memset(a.data(), 1, a.capacity());
  std::memset(b.data(), 2, b.capacity());
  EXPECT_EQ(a.data()[a.capacity() - 1], 1);
  EXPECT_EQ(b.data()[0], 2);
}

TEST(BufferPool, ARegionIsUnmappedOnceBothHalvesAreDropped) {
  if (!io_memory::hugePagesEnabled()) GTEST_SKIP() << "transparent huge pages are off";
  uint8_t* p;
  {
    BufferPool pool(0);  // caches nothing: the other half is dropped at once
    PooledBuffer b = pool.get(1 << 20);
    p = b.data();
    EXPECT_TRUE(io_memory::contains(p, 1 << 20));
  }
  EXPECT_FALSE(io_memory::contains(p, 1));
  PooledBuffer kept;
  {
    BufferPool pool;  // caches the other half
    PooledBuffer b = pool.get(1 << 20);
    p = b.data();
    kept = pool.get(1 << 20);  // the cached half
  }
  // The pool is gone; the region stays while a half is held.
  EXPECT_TRUE(io_memory::contains(kept.data(), 1 << 20));
  kept = PooledBuffer();
  EXPECT_FALSE(io_memory::contains(p, 1));
}

}  // namespace
}  // namespace cistern::net
