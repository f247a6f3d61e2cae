// The chunk engine test fixture: a target in a temporary directory on each
// I/O engine, memory of each kind to read into, and helpers that write,
// read back and move chunks. TEST_P(ChunkEngineTest, ...) in any of the
// chunk engine's test files; chunk_engine_test.cc instantiates it.
#pragma once

#include "storage/chunk_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <set>
#include <thread>

#include "common/crc32c.h"
#include "common/fault.h"
#include "common/io_memory.h"
#include "common/metrics.h"
#include "common/random.h"
#include "storage/scrub_worker.h"

namespace cistern::storage::test_util {

// Memory a test reads into or writes from, page-aligned: plain 4 KiB pages
// (large I/O then goes through the engine's own 2 MiB-page buffers and a
// copy), a region in 2 MiB pages (io_memory: no copy), or plain pages with
// huge_page_io off (no copy either).
enum class Mem { kPlain, kHuge, kPlainNoBounce };
inline const char* memName(Mem m) {
  return m == Mem::kPlain ? "plain" : m == Mem::kHuge ? "huge" : "plain, huge_page_io off";
}
struct TestMemory {
  TestMemory(Mem m, size_t n) {
    if (m == Mem::kHuge) {
      region = io_memory::Region(n);
      data = region.data();
    } else {
      plain.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)));
      data = plain.get();
    }
  }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> plain;
  io_memory::Region region;
  uint8_t* data = nullptr;
};

inline std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
  Xoshiro256 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng.next());
  return v;
}

// Every test runs with each I/O engine.
class ChunkEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cistern-chunk-XXXXXX";
    dir_ = mkdtemp(tmpl);
    reopen();
  }
  void TearDown() override {
    engine_.reset();
    fault::disableAll();
    std::filesystem::remove_all(dir_);
  }
  ChunkEngineOptions options() const {
    ChunkEngineOptions o;
    o.path = dir_;
    o.group_bytes = 1 << 20;  // small groups so tests cross group boundaries
    o.reserved_bytes = 0;
    // "psync_wal": metadata in RocksDB's synced WAL instead of the commit log.
    o.io_engine = GetParam() == "psync_wal" ? "psync" : GetParam();
    o.meta_commit_log = GetParam() != "psync_wal";
    return o;
  }
  void reopen() { reopen(options()); }
  // An empty target, opened for memory `m`.
  void freshTarget(Mem m) {
    engine_.reset();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ChunkEngineOptions o = options();
    o.huge_page_io = m != Mem::kPlainNoBounce;
    reopen(o);
  }
  void reopen(const ChunkEngineOptions& o) {
    engine_.reset();
    auto e = ChunkEngine::open(o);
    ASSERT_TRUE(e.ok()) << e.status().toString();
    engine_ = std::move(e).value();
  }
  // The group file that holds a chunk of record `m` (docs/chunk_format.md, "Files").
  std::string groupFileOf(const ChunkMeta& m) const {
    return dir_ + "/data/c" + std::to_string(m.size_class) + "/g" + std::to_string(m.addr.group) +
           ".dat";
  }
  std::vector<uint8_t> readAll(ChunkId id, size_t n) {
    std::vector<uint8_t> out(n + 10, 0xEE);
    auto r = engine_->read(id, 0, out);
    EXPECT_TRUE(r.ok()) << r.status().toString();
    out.resize(r.ok() ? *r : 0);
    return out;
  }

  // Chunk a, written with `old_a`, moves when rewritten with `new_a`, and
  // b takes the slot it left with bytes that verify against their own CRCs
  // (whole blocks: no tail CRC in the record that could give the swap away).
  struct SlotSwap {
    static constexpr size_t kLen = 25 * 4096;
    ChunkId a, b;
    std::vector<uint8_t> old_a = pattern(kLen, 3 * a.inode), new_a = pattern(kLen, 3 * a.inode + 1),
                         bytes_b = pattern(kLen, 3 * a.inode + 2);
    SlotAddr slot;  // a's before the swap
  };
  void writeFirst(SlotSwap& s) {
    ASSERT_TRUE(engine_->write(s.a, 0, s.old_a, 1).ok());
    auto before = engine_->query(s.a);
    ASSERT_TRUE(before.ok() && before->has_value());
    s.slot = (*before)->addr;
  }
  void swap(const SlotSwap& s) {
    ASSERT_TRUE(engine_->write(s.a, 0, s.new_a, 1).ok());  // a moves to another slot
    ASSERT_TRUE(engine_->write(s.b, 0, s.bytes_b, 1).ok());
    auto slot_b = engine_->query(s.b);
    ASSERT_TRUE(slot_b.ok() && slot_b->has_value());
    ASSERT_EQ((*slot_b)->addr, s.slot);  // b took the slot a left
  }

  std::string dir_;
  std::unique_ptr<ChunkEngine> engine_;
};

}  // namespace cistern::storage::test_util
