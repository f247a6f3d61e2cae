// The chunk engine against a real directory: every alignment, copy-on-write
// slot reuse, persistence, detection of flipped bits, and crash points.
#include "storage/chunk_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "common/crc32c.h"
#include "common/fault.h"
#include "common/metrics.h"
#include "common/random.h"

namespace cistern::storage {
namespace {

std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
  Xoshiro256 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng.next());
  return v;
}

class ChunkEngineTest : public ::testing::Test {
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
  void reopen() {
    engine_.reset();
    ChunkEngineOptions o;
    o.path = dir_;
    o.group_bytes = 1 << 20;  // small groups so tests cross group boundaries
    o.reserved_bytes = 0;
    auto e = ChunkEngine::open(o);
    ASSERT_TRUE(e.ok()) << e.status().toString();
    engine_ = std::move(e).value();
  }
  std::vector<uint8_t> readAll(ChunkId id, size_t n) {
    std::vector<uint8_t> out(n + 10, 0xEE);
    auto r = engine_->read(id, 0, out);
    EXPECT_TRUE(r.ok()) << r.status().toString();
    out.resize(r.ok() ? *r : 0);
    return out;
  }

  std::string dir_;
  std::unique_ptr<ChunkEngine> engine_;
};

TEST_F(ChunkEngineTest, WritesAtEveryAlignmentReadBackExactly) {
  for (uint64_t offset : {0ull, 1ull, 4095ull, 4096ull, 65535ull, 65536ull, 65537ull, 1048575ull}) {
    for (size_t len : {size_t{1}, size_t{4095}, size_t{4096}, size_t{65536}, size_t{100000}}) {
      ChunkId id{offset + 1, static_cast<uint32_t>(len)};
      auto data = pattern(len, offset * 31 + len);
      auto m = engine_->write(id, offset, data, 1);
      ASSERT_TRUE(m.ok()) << m.status().toString();
      EXPECT_EQ(m->length, offset + len);
      EXPECT_EQ(m->size_class, *classFor(offset + len));
      std::vector<uint8_t> got(len);
      ASSERT_EQ(*engine_->read(id, offset, got), len);
      EXPECT_EQ(got, data) << offset << "+" << len;
      // The bytes before the write are zeros (a hole).
      if (offset > 0) {
        std::vector<uint8_t> head(std::min<uint64_t>(offset, 4096));
        ASSERT_EQ(*engine_->read(id, 0, head), head.size());
        EXPECT_EQ(head, std::vector<uint8_t>(head.size(), 0));
      }
    }
  }
}

TEST_F(ChunkEngineTest, OverwriteInTheMiddleAndGrowAcrossClasses) {
  ChunkId id{7, 0};
  auto base = pattern(60000, 1);
  ASSERT_TRUE(engine_->write(id, 0, base, 1).ok());
  auto mid = pattern(1000, 2);
  auto m = engine_->write(id, 30000, mid, 1);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->chunk_version, 2u);
  std::copy(mid.begin(), mid.end(), base.begin() + 30000);
  EXPECT_EQ(readAll(id, 60000), base);
  auto tail = pattern(10000, 3);
  m = engine_->write(id, 60000, tail, 2);  // grows into the 128 KiB class
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size_class, 1u);
  EXPECT_EQ(m->chain_version, 2u);
  base.insert(base.end(), tail.begin(), tail.end());
  EXPECT_EQ(readAll(id, 70000), base);
  EXPECT_EQ(engine_->usedSlots(0), 0u);  // the old slot was released
  EXPECT_EQ(engine_->usedSlots(1), 1u);
}

TEST_F(ChunkEngineTest, RepeatedOverwritesReuseSlotsInsteadOfGrowing) {
  ChunkId id{9, 0};
  for (int i = 0; i < 200; ++i)
    ASSERT_TRUE(engine_->write(id, 0, pattern(4096, static_cast<uint64_t>(i)), 1).ok());
  EXPECT_EQ(engine_->usedSlots(0), 1u);
  // Group files do not grow without bound: slot 0 and 1 alternate.
  auto size = std::filesystem::file_size(dir_ + "/data/c0/g0.dat");
  EXPECT_LE(size, 2u * 65536u);
}

TEST_F(ChunkEngineTest, DataAndSlotsSurviveReopen) {
  std::vector<std::vector<uint8_t>> written;
  for (uint32_t i = 0; i < 40; ++i) {
    written.push_back(pattern(1000 + i * 3000, i));
    ASSERT_TRUE(engine_->write({1, i}, 0, written.back(), 1).ok());
  }
  ASSERT_TRUE(engine_->remove({1, 5}).ok());
  uint64_t used0 = engine_->usedSlots(0), used1 = engine_->usedSlots(1);
  reopen();
  EXPECT_EQ(engine_->usedSlots(0), used0);
  EXPECT_EQ(engine_->usedSlots(1), used1);
  for (uint32_t i = 0; i < 40; ++i) {
    if (i == 5) {
      std::vector<uint8_t> b(1);
      EXPECT_EQ(engine_->read({1, 5}, 0, b).code(), ErrorCode::kNotFound);
      continue;
    }
    EXPECT_EQ(readAll({1, i}, written[i].size()), written[i]) << i;
  }
  EXPECT_TRUE(engine_->remove({1, 5}).ok());  // removing twice is fine
}

TEST_F(ChunkEngineTest, FlippedBitsAreDetectedByReadAndScrub) {
  std::vector<std::vector<uint8_t>> data;
  for (uint32_t i = 0; i < 20; ++i) {
    data.push_back(pattern(5000, 100 + i));
    ASSERT_TRUE(engine_->write({2, i}, 0, data.back(), 1).ok());
  }
  engine_.reset();  // the target is stopped
  // Flip one bit inside each of the first 10 chunks' bytes (slots 0..9 of c0/g0).
  int fd = ::open((dir_ + "/data/c0/g0.dat").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  for (uint32_t slot = 0; slot < 10; ++slot) {
    off_t pos = static_cast<off_t>(slot * 65536 + 17 * slot + 3);
    uint8_t b;
    ASSERT_EQ(::pread(fd, &b, 1, pos), 1);
    b ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &b, 1, pos), 1);
  }
  ::close(fd);
  reopen();
  int detected = 0;
  for (uint32_t i = 0; i < 20; ++i) {
    std::vector<uint8_t> out(5000);
    auto r = engine_->read({2, i}, 0, out);
    if (!r.ok()) {
      EXPECT_EQ(r.code(), ErrorCode::kCorruption);
      ++detected;
    } else {
      EXPECT_EQ(out, data[i]);
    }
  }
  EXPECT_EQ(detected, 10);
  auto bad = engine_->scrub();
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->size(), 10u);
}

TEST_F(ChunkEngineTest, FailureAfterDataLeavesTheOldChunkAndFreesTheSlot) {
  auto v1 = pattern(3000, 1);
  ASSERT_TRUE(engine_->write({3, 0}, 0, v1, 1).ok());
  fault::enable("storage.write.after_data", fault::Spec{.code = ErrorCode::kIOError});
  EXPECT_EQ(engine_->write({3, 0}, 0, pattern(3000, 2), 1).code(), ErrorCode::kIOError);
  fault::disableAll();
  EXPECT_EQ(readAll({3, 0}, 3000), v1);
  EXPECT_EQ(engine_->usedSlots(0), 1u);
}

TEST_F(ChunkEngineTest, SlotsLeakedByACrashAfterMetadataAreReclaimedOnReopen) {
  ASSERT_TRUE(engine_->write({4, 0}, 0, pattern(100, 1), 1).ok());
  fault::enable("storage.write.after_meta", fault::Spec{.code = ErrorCode::kIOError});
  EXPECT_FALSE(
      engine_->write({4, 0}, 0, pattern(100, 2), 1).ok());  // committed, old slot not released
  fault::disableAll();
  EXPECT_EQ(engine_->usedSlots(0), 2u);
  reopen();
  EXPECT_EQ(engine_->usedSlots(0), 1u);
  EXPECT_EQ(readAll({4, 0}, 100), pattern(100, 2));  // the committed (new) version
}

TEST_F(ChunkEngineTest, ConcurrentWritersToDifferentChunksAllCommit) {
  auto& batches = metrics::Registry::global().histogram("storage_commit_batch_size");
  uint64_t batches_before = batches.count(), writes_before = batches.sum();
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t i = 0; i < 40; ++i) {
        auto m = engine_->write({100 + t, i}, 0, pattern(8192, t * 1000 + i), 1);
        ASSERT_TRUE(m.ok()) << m.status().toString();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (uint32_t t = 0; t < 8; ++t) {
    for (uint32_t i = 0; i < 40; ++i)
      ASSERT_EQ(readAll({100 + t, i}, 8192), pattern(8192, t * 1000 + i));
  }
  // Every write went through exactly one group commit.
  EXPECT_EQ(batches.sum() - writes_before, 320u);
  std::printf("320 writes in %llu group commits\n",
              static_cast<unsigned long long>(batches.count() - batches_before));
  EXPECT_EQ(engine_->usedSlots(0), 320u);
}

TEST_F(ChunkEngineTest, ConcurrentWritersToDisjointRangesOfOneChunk) {
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t i = 0; i < 10; ++i) {
        uint64_t off = (t * 10 + i) * 1000;
        auto m = engine_->write({200, 0}, off, pattern(1000, off), 1);
        ASSERT_TRUE(m.ok()) << m.status().toString();
      }
    });
  }
  for (auto& th : threads) th.join();
  auto all = readAll({200, 0}, 80000);
  ASSERT_EQ(all.size(), 80000u);
  for (uint64_t off = 0; off < 80000; off += 1000) {
    ASSERT_TRUE(std::equal(all.begin() + static_cast<long>(off),
                           all.begin() + static_cast<long>(off + 1000), pattern(1000, off).begin()))
        << off;
  }
  EXPECT_EQ(engine_->query({200, 0})->value().chunk_version, 80u);
}

TEST_F(ChunkEngineTest, BadRequestsGetClearErrors) {
  std::vector<uint8_t> one(1);
  EXPECT_EQ(engine_->write({5, 0}, kMaxChunkBytes, one, 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->read({5, 0}, 0, one).code(), ErrorCode::kNotFound);
  ASSERT_TRUE(engine_->write({5, 0}, 0, one, 1).ok());
  EXPECT_EQ(*engine_->read({5, 0}, 10, one), 0u);  // past the end
}

// A target on a 3 MiB tmpfs fills up: writes fail with kNoSpace (ENOSPC),
// everything written before stays readable, and the target has not failed.
TEST(ChunkEngineNoSpace, FullFilesystemGivesNoSpaceAndKeepsData) {
  char tmpl[] = "/tmp/cistern-enospc-XXXXXX";
  std::string mnt = mkdtemp(tmpl);
  std::string cmd = "mount -t tmpfs -o size=3m tmpfs " + mnt + " 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) {
    std::filesystem::remove_all(mnt);
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root); CI runs as root";
  }
  struct Unmount {
    std::string mnt;
    ~Unmount() {
      (void)std::system(("umount " + mnt).c_str());
      std::filesystem::remove_all(mnt);
    }
  } unmount{mnt};
  {
    ChunkEngineOptions o;
    o.path = mnt + "/target";
    o.group_bytes = 1 << 20;
    o.reserved_bytes = 512 * 1024;
    auto e = ChunkEngine::open(o);
    ASSERT_TRUE(e.ok()) << e.status().toString();
    std::vector<std::vector<uint8_t>> written;
    Status last;
    for (uint32_t i = 0; i < 200; ++i) {
      auto data = pattern(60000, i);
      auto m = (*e)->write({8, i}, 0, data, 1);
      if (!m.ok()) {
        last = m.status();
        break;
      }
      written.push_back(std::move(data));
    }
    EXPECT_EQ(last.code(), ErrorCode::kNoSpace) << last.toString();
    EXPECT_EQ(last.toErrno(), ENOSPC);
    EXPECT_GT(written.size(), 5u);
    EXPECT_FALSE((*e)->failed());
    for (uint32_t i = 0; i < written.size(); ++i) {
      std::vector<uint8_t> out(60000);
      auto n = (*e)->read({8, i}, 0, out);
      ASSERT_TRUE(n.ok()) << i << ": " << n.status().toString();
      EXPECT_EQ(out, written[i]) << i;
    }
  }
}

}  // namespace
}  // namespace cistern::storage
