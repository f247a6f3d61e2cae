#include "net/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

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

}  // namespace
}  // namespace cistern::net
