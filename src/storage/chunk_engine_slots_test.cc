// The chunk engine's slots and reads: scrub, kept slots and space, the CRC
// cache while slots change hands, async reads, bad requests, fences, and a
// target whose file system fills up.
#include "storage/chunk_engine_test_util.h"

namespace cistern::storage {
namespace {

using namespace test_util;

// The background scrubber finds a flipped bit at its configured rate, and
// its metrics say so.
TEST_P(ChunkEngineTest, ScrubWorkerReportsBadChunksInItsMetrics) {
  for (uint32_t i = 0; i < 8; ++i)
    ASSERT_TRUE(engine_->write({19, i}, 0, pattern(30000, i), 1).ok());
  engine_.reset();
  int fd = ::open((dir_ + "/data/c0/g0.dat").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  off_t pos = static_cast<off_t>(3 * slotStride(0) + 777);  // chunk {19, 3}
  uint8_t b;
  ASSERT_EQ(::pread(fd, &b, 1, pos), 1);
  b ^= 1;
  ASSERT_EQ(::pwrite(fd, &b, 1, pos), 1);
  ::close(fd);
  reopen();
  auto& bad_total = metrics::Registry::global().counter("storage_scrub_bad_chunks_total");
  auto& scrubbed = metrics::Registry::global().counter("storage_scrub_bytes_total");
  uint64_t bad_before = bad_total.value(), bytes_before = scrubbed.value();
  auto t0 = std::chrono::steady_clock::now();
  {
    ScrubWorker worker(*engine_, /*bytes_per_second=*/480000, std::chrono::milliseconds(10));
    while (worker.passes() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(worker.lastBad(), (std::vector<ChunkId>{ChunkId{19, 3}}));
  }
  // 240,000 bytes at 480,000 bytes/s: a pass takes about half a second.
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(400));
  EXPECT_GE(bad_total.value() - bad_before, 1u);
  EXPECT_GE(scrubbed.value() - bytes_before, 240000u);
  EXPECT_EQ(metrics::Registry::global().gauge("storage_scrub_bad_chunks").value(), 1);
}

TEST_P(ChunkEngineTest, FlippedBitsInTheCrcAreaAreDetected) {
  ChunkId id{14, 0};
  auto data = pattern(40000, 8);
  ASSERT_TRUE(engine_->write(id, 0, data, 1).ok());
  engine_.reset();
  int fd = ::open((dir_ + "/data/c0/g0.dat").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  off_t pos = static_cast<off_t>(classBytes(0) + 4 * 3 + 1);  // CRC of block 3
  uint8_t b;
  ASSERT_EQ(::pread(fd, &b, 1, pos), 1);
  b ^= 0x80;
  ASSERT_EQ(::pwrite(fd, &b, 1, pos), 1);
  ::close(fd);
  reopen();
  std::vector<uint8_t> out(40000);
  EXPECT_EQ(engine_->read(id, 0, out).code(), ErrorCode::kCorruption);
  EXPECT_EQ(engine_->scrub()->size(), 1u);
}

TEST_P(ChunkEngineTest, ListSpaceAndRemoveReturnsSpace) {
  ChunkEngineOptions o = options();
  o.kept_free_bytes = 0;  // every freed slot is punched
  reopen(o);
  for (uint32_t i = 0; i < 10; ++i)
    ASSERT_TRUE(engine_->write({15, i}, 0, pattern(70000, i), 1).ok());
  ASSERT_TRUE(engine_->write({16, 0}, 0, pattern(10, 1), 1).ok());
  auto listed = engine_->list({15, 3}, 4);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 4u);
  EXPECT_EQ((*listed)[0].first, (ChunkId{15, 3}));
  EXPECT_EQ((*listed)[3].first, (ChunkId{15, 6}));
  EXPECT_EQ((*listed)[0].second.length, 70000u);
  listed = engine_->list({15, 8}, 100);
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[2].first, (ChunkId{16, 0}));
  auto space = engine_->space();
  EXPECT_EQ(space.chunks, 11u);
  EXPECT_EQ(space.data_bytes, 700010u);
  EXPECT_EQ(space.classes[1].slots_used, 10u);
  EXPECT_EQ(space.classes[1].data_bytes, 700000u);
  EXPECT_EQ(space.classes[0].slots_used, 1u);
  EXPECT_GT(space.classes[1].slots_max, 0u);
  EXPECT_GT(space.fs_total_bytes, 0u);
  EXPECT_FALSE(space.failed);

  auto allocated = [&] {
    struct stat st;
    EXPECT_EQ(::stat((dir_ + "/data/c1/g0.dat").c_str(), &st), 0);
    return uint64_t(st.st_blocks) * 512;
  };
  uint64_t before = allocated();
  for (uint32_t i = 0; i < 5; ++i) ASSERT_TRUE(engine_->remove({15, i}).ok());
  EXPECT_LE(allocated(), before - 5 * 65536) << "removed chunks still hold disk space";
  space = engine_->space();
  EXPECT_EQ(space.chunks, 6u);
  EXPECT_EQ(space.classes[1].data_bytes, 350000u);
  EXPECT_EQ(space.kept_bytes, 0u);
  reopen(o);
  EXPECT_EQ(engine_->space().classes[1].data_bytes, 350000u);
  EXPECT_EQ(engine_->space().chunks, 6u);
}

// Freed slots keep their blocks within the budget (a later write into them
// allocates nothing), are punched past it, are found again at open, and the
// excess is punched when the budget shrinks.
TEST_P(ChunkEngineTest, FreedSlotsKeepTheirBlocksWithinTheBudget) {
  constexpr uint32_t kClass = 1;  // 128 KiB: written directly, not logged
  const uint64_t stride = slotStride(kClass);
  ChunkEngineOptions o = options();
  o.kept_free_bytes = 3 * stride;
  reopen(o);
  const std::string g0 = dir_ + "/data/c1/g0.dat";
  auto allocated = [&] {
    struct stat st;
    EXPECT_EQ(::stat(g0.c_str(), &st), 0);
    return uint64_t(st.st_blocks) * 512;
  };
  for (uint32_t i = 0; i < 6; ++i)
    ASSERT_TRUE(engine_->write({30, i}, 0, pattern(100000, i), 1).ok());
  const uint64_t full = allocated();
  // Five removals: three slots kept, two punched.
  for (uint32_t i = 0; i < 5; ++i) ASSERT_TRUE(engine_->remove({30, i}).ok());
  auto space = engine_->space();
  EXPECT_EQ(space.classes[kClass].slots_kept, 3u);
  EXPECT_EQ(space.kept_bytes, 3 * stride);
  EXPECT_LE(allocated(), full - 2 * 100000) << "slots past the budget were not punched";
  EXPECT_GE(allocated(), full - 2 * stride) << "kept slots lost their blocks";
  // New chunks take the lowest free slots, the kept ones: nothing allocated.
  const uint64_t before = allocated();
  for (uint32_t i = 0; i < 3; ++i)
    ASSERT_TRUE(engine_->write({31, i}, 0, pattern(100000, 50 + i), 1).ok());
  EXPECT_EQ(engine_->space().kept_bytes, 0u);
  EXPECT_EQ(allocated(), before);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(readAll({31, i}, 100000), pattern(100000, 50 + i));
  // Two kept again, and found by the next open.
  ASSERT_TRUE(engine_->remove({31, 0}).ok());
  ASSERT_TRUE(engine_->remove({31, 1}).ok());
  EXPECT_EQ(engine_->space().classes[kClass].slots_kept, 2u);
  reopen(o);
  EXPECT_EQ(engine_->space().classes[kClass].slots_kept, 2u);
  EXPECT_EQ(readAll({30, 5}, 100000), pattern(100000, 5));
  EXPECT_EQ(readAll({31, 2}, 100000), pattern(100000, 52));
  // A smaller budget: the excess is punched when the target opens.
  const uint64_t two_kept = allocated();
  o.kept_free_bytes = stride;
  reopen(o);
  EXPECT_EQ(engine_->space().classes[kClass].slots_kept, 1u);
  EXPECT_LE(allocated(), two_kept - 100000);
  EXPECT_EQ(readAll({30, 5}, 100000), pattern(100000, 5));
  EXPECT_EQ(readAll({31, 2}, 100000), pattern(100000, 52));
}

// Writers racing on one chunk: every read sees one whole version, never a
// mix or a checksum error, and the final content is one writer's.
TEST_P(ChunkEngineTest, ConcurrentWritersAndReadersOnOneChunk) {
  ChunkId id{17, 0};
  constexpr size_t kLen = 20000;
  ASSERT_TRUE(engine_->write(id, 0, pattern(kLen, 0), 1).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread reader([&] {
    std::vector<uint8_t> out(kLen);
    while (!stop) {
      auto n = engine_->read(id, 0, out);
      if (!n.ok() || *n != kLen) {
        ++bad;
        continue;
      }
      bool whole = false;
      for (uint64_t s = 0; s <= 4 && !whole; ++s) whole = out == pattern(kLen, s);
      if (!whole) ++bad;
    }
  });
  std::vector<std::thread> writers;
  for (uint64_t t = 1; t <= 4; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) ASSERT_TRUE(engine_->write(id, 0, pattern(kLen, t), 1).ok());
    });
  }
  for (auto& w : writers) w.join();
  stop = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(engine_->query(id)->value().chunk_version, 101u);
  EXPECT_EQ(engine_->usedSlots(0), 1u);
}

// Small reads take their CRCs from the CRC cache once a read brought the
// page in, and never a page of an earlier content of the slot: after an
// overwrite, an append in place and a remove whose slot a new chunk of the
// same version reuses. Scrub still reads the disk's CRCs.
TEST_P(ChunkEngineTest, SmallReadsUseCachedCrcsOfTheirOwnVersionOnly) {
  auto& hits = metrics::Registry::global().counter("storage_crc_cache_hits_total");
  auto& misses = metrics::Registry::global().counter("storage_crc_cache_misses_total");
  const ChunkId id{19, 0};
  auto data = pattern(200000, 31);  // class 2 (256 KiB): not logged, no fused reads
  ASSERT_TRUE(engine_->write(id, 0, data, 1).ok());
  auto first = engine_->query(id);
  ASSERT_TRUE(first.ok() && first->has_value());
  std::vector<uint8_t> out(4096);
  auto readAt = [&](uint64_t at) {
    auto r = engine_->read(id, at, out);
    EXPECT_TRUE(r.ok()) << r.status().toString();
    return r.ok() ? *r : 0;
  };
  uint64_t h0 = hits.value(), m0 = misses.value();
  ASSERT_EQ(readAt(8192), 4096u);
  EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + 8192));
  EXPECT_EQ(misses.value(), m0) << "the write cached the CRC page it wrote";
  for (uint64_t at : {0, 4096 * 10, 4096 * 40}) {
    ASSERT_EQ(readAt(at), 4096u);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + at));
  }
  EXPECT_EQ(hits.value(), h0 + 4);  // one page holds all 48 CRCs
  EXPECT_EQ(misses.value(), m0);

  // An overwrite (copy-on-write into another slot) and an append in place.
  auto mid = pattern(4096, 32);
  ASSERT_TRUE(engine_->write(id, 4096 * 10, mid, 1).ok());
  std::copy(mid.begin(), mid.end(), data.begin() + 4096 * 10);
  auto tail = pattern(40000, 33);
  ASSERT_TRUE(engine_->write(id, data.size(), tail, 1).ok());
  data.insert(data.end(), tail.begin(), tail.end());
  for (uint64_t at : {0, 4096 * 10, 4096 * 50, 4096 * 57}) {
    ASSERT_EQ(readAt(at), 4096u) << at;
    EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + at)) << at;
  }

  // Removed, then written anew: into the first content's slot (the lowest
  // free one), with its version (1), whose CRC page is cached. The write
  // dropped that page: no read below meets a stale CRC (a mismatch would be
  // retried with the disk's CRCs, but counted).
  auto& mismatches = metrics::Registry::global().counter("storage_checksum_mismatch_total");
  const uint64_t mismatches0 = mismatches.value();
  ASSERT_TRUE(engine_->remove(id).ok());
  auto fresh = pattern(data.size(), 34);
  ASSERT_TRUE(engine_->write(id, 0, fresh, 1).ok());
  auto again = engine_->query(id);
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ((*again)->addr, (*first)->addr);
  EXPECT_EQ((*again)->chunk_version, (*first)->chunk_version);
  ASSERT_EQ(readAt(0), 4096u);
  EXPECT_TRUE(std::equal(out.begin(), out.end(), fresh.begin()));
  ASSERT_TRUE(engine_->write(id, 0, fresh, 1).ok());  // a second slot, version 2
  ASSERT_TRUE(engine_->remove(id).ok());
  ASSERT_TRUE(engine_->write(id, 0, fresh, 1).ok());
  for (int round = 0; round < 2; ++round) {
    for (uint64_t at : {0, 4096 * 10, 4096 * 50, 4096 * 57}) {
      ASSERT_EQ(readAt(at), 4096u) << at;
      EXPECT_TRUE(std::equal(out.begin(), out.end(), fresh.begin() + at)) << at;
    }
  }
  EXPECT_EQ(mismatches.value(), mismatches0);

  // A flipped CRC on the disk while its page is cached: reads still verify
  // the bytes against the right CRC, scrub finds the bad page.
  auto now = engine_->query(id);
  ASSERT_TRUE(now.ok() && now->has_value());
  const ChunkMeta& m = **now;
  ASSERT_EQ(m.size_class, 2u);
  std::string group = dir_ + "/data/c2/g" + std::to_string(m.addr.group) + ".dat";
  int fd = ::open(group.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  off_t pos = static_cast<off_t>(m.addr.slot * slotStride(2) + classBytes(2) + 4 * 10);
  uint8_t b;
  ASSERT_EQ(::pread(fd, &b, 1, pos), 1);
  b ^= 0x20;
  ASSERT_EQ(::pwrite(fd, &b, 1, pos), 1);
  ::close(fd);
  ASSERT_EQ(readAt(4096 * 10), 4096u);
  EXPECT_TRUE(std::equal(out.begin(), out.end(), fresh.begin() + 4096 * 10));
  auto bad = engine_->scrub();
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(*bad, std::vector<ChunkId>{id});
}

// Readers of small ranges while the chunk is rewritten, removed and written
// anew (same slot, same version): every read gets one whole content or
// kNotFound, never a checksum error from a cached page of another content.
TEST_P(ChunkEngineTest, CachedCrcsHoldWhileSlotsChangeHands) {
  const ChunkId id{20, 0};
  constexpr size_t kLen = 150000;
  ASSERT_TRUE(engine_->write(id, 0, pattern(kLen, 0), 1).ok());
  std::vector<std::vector<uint8_t>> contents;
  for (uint64_t s = 0; s <= 3; ++s) contents.push_back(pattern(kLen, s));
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, reads{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      Xoshiro256 rng(static_cast<uint64_t>(t) + 1);
      std::vector<uint8_t> out(8192);
      while (!stop) {
        uint64_t at = rng.uniform(kLen / 4096 - 2) * 4096;
        auto n = engine_->read(id, at, out);
        if (!n.ok() && n.code() == ErrorCode::kNotFound) continue;
        ++reads;
        if (!n.ok() || *n != out.size()) {
          ++bad;
          continue;
        }
        bool whole = false;
        for (auto& c : contents) whole |= std::equal(out.begin(), out.end(), c.begin() + at);
        if (!whole) ++bad;
      }
    });
  }
  for (int i = 0; i < 60; ++i) {
    ASSERT_TRUE(engine_->remove(id).ok());
    ASSERT_TRUE(engine_->write(id, 0, contents[1 + i % 3], 1).ok());
    ASSERT_TRUE(engine_->write(id, 0, contents[1 + (i + 1) % 3], 1).ok());
  }
  stop = true;
  for (auto& r : readers) r.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(reads.load(), 0);
}

// A reader holds a chunk's record while the chunk moves (copy-on-write) and
// another chunk takes the slot it left, with bytes that verify against their
// own CRCs: the read must not return the other chunk's bytes.
TEST_P(ChunkEngineTest, AReadNeverReturnsBytesOfTheChunkThatTookItsSlot) {
  SlotSwap s{.a = {21, 0}, .b = {22, 0}};
  ASSERT_NO_FATAL_FAILURE(writeFirst(s));
  fault::enable(
      "storage.read.after_meta",
      {.action = fault::Action::kDelay, .delay = std::chrono::milliseconds(300), .times = 1});
  std::vector<uint8_t> out(SlotSwap::kLen);
  Result<size_t> got = size_t{0};
  std::thread reader([&] { got = engine_->read(s.a, 0, out); });
  while (fault::fired("storage.read.after_meta") == 0) std::this_thread::yield();
  swap(s);
  reader.join();
  ASSERT_TRUE(got.ok()) << got.status().toString();
  ASSERT_EQ(*got, SlotSwap::kLen);
  EXPECT_TRUE(out == s.new_a || out == s.old_a);
  EXPECT_NE(out, s.bytes_b);
}

// Performs an AsyncRead's I/O as a StorageService I/O thread's ring would.
std::vector<int> perform(ChunkEngine::AsyncRead& a) {
  std::vector<int> results;
  for (IoRequest& q : a.io()) {
    ssize_t n = ::preadv(q.fd, q.iov, q.iovcnt, static_cast<off_t>(q.pos));
    results.push_back(n < 0 ? -errno : static_cast<int>(n));
  }
  return results;
}

// The two halves of a read (startRead, the I/O, finishRead) give what read()
// gives, at every alignment, in every size class; fused data-and-CRC reads
// at a full slot's end included.
TEST_P(ChunkEngineTest, AsyncReadsMatchReadsAtEveryAlignment) {
  ChunkEngine::AsyncRead a;
  uint32_t index = 0;
  for (size_t len : {size_t{1}, size_t{4095}, size_t{5000}, size_t{65536}, size_t{100000},
                     size_t{131072}, size_t{1} << 20}) {
    const ChunkId id{40, index++};
    auto data = pattern(len, len);
    ASSERT_TRUE(engine_->write(id, 0, data, 1).ok());
    for (uint64_t offset :
         {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{4096}, uint64_t{len - 1},
          uint64_t{len > 4096 ? len - 4096 : 0}, uint64_t{len}, uint64_t{len + 5}}) {
      for (size_t size :
           {size_t{1}, size_t{4095}, size_t{4096}, size_t{8192}, ChunkEngine::kAsyncReadBytesMax}) {
        // Odd places in the buffer too: the blocks then go through the bounce buffer.
        for (size_t shift : {size_t{0}, size_t{3}}) {
          std::vector<uint8_t> want(size), got(size + 4096 + shift, 0xEE);
          auto rr = engine_->read(id, offset, want);
          ASSERT_TRUE(rr.ok()) << rr.status().toString();
          uint8_t* at =
              got.data() + (4096 - reinterpret_cast<uintptr_t>(got.data()) % 4096) + shift;
          auto n = engine_->startRead(id, offset, {at, size}, a);
          ASSERT_TRUE(n.ok()) << n.status().toString();
          ASSERT_TRUE(n->has_value()) << "the record is in the memtable";
          ASSERT_EQ(**n, *rr) << len << " " << offset << "+" << size;
          if (**n == 0) {
            EXPECT_TRUE(a.io().empty());
          }
          ASSERT_TRUE(engine_->finishRead(a, perform(a))) << len << " " << offset << "+" << size;
          EXPECT_TRUE(std::equal(at, at + **n, want.begin()))
              << len << " " << offset << "+" << size << " shift " << shift;
        }
      }
    }
  }
}

TEST_P(ChunkEngineTest, AsyncReadsDeclineWhatWouldBlockOrIsTooLarge) {
  const ChunkId id{41, 0};
  auto data = pattern(200000, 7);
  ASSERT_TRUE(engine_->write(id, 0, data, 1).ok());
  ChunkEngine::AsyncRead a;
  std::vector<uint8_t> out(ChunkEngine::kAsyncReadBytesMax + 1);
  // Larger than the limit.
  auto n = engine_->startRead(id, 0, out, a);
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->has_value());
  // Nothing wanted: nothing to read.
  n = engine_->startRead(id, 0, {out.data(), 0}, a);
  ASSERT_TRUE(n.ok() && n->has_value());
  EXPECT_EQ(**n, 0u);
  EXPECT_TRUE(a.io().empty());
  EXPECT_TRUE(engine_->finishRead(a, {}));
  // A missing chunk: read()'s error.
  n = engine_->startRead({41, 9}, 0, {out.data(), 10}, a);
  EXPECT_EQ(n.code(), ErrorCode::kNotFound);
  // While a fault point is enabled (a delay there would stall an event loop).
  fault::enable(
      "storage.read.after_meta",
      {.action = fault::Action::kDelay, .delay = std::chrono::milliseconds(1), .times = 1});
  n = engine_->startRead(id, 0, {out.data(), 10}, a);
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->has_value());
  fault::disableAll();
  // After a restart the group file is not open until a read() opens it
  // (an open() could wait for the disk).
  reopen();
  n = engine_->startRead(id, 0, {out.data(), 10}, a);
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->has_value()) << "the group file needs an open()";
  ASSERT_EQ(*engine_->read(id, 0, {out.data(), 10}), 10u);
  n = engine_->startRead(id, 0, {out.data(), 10}, a);
  ASSERT_TRUE(n.ok() && n->has_value());
  ASSERT_TRUE(engine_->finishRead(a, perform(a)));
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 10, data.begin()));
  // A failed transfer is left to read(); so is a short one, whose missing
  // bytes read as zeros, which do not verify.
  n = engine_->startRead(id, 4096, {out.data(), 4096}, a);
  ASSERT_TRUE(n.ok() && n->has_value());
  std::vector<int> failed(a.io().size(), -EIO);
  EXPECT_FALSE(engine_->finishRead(a, failed));
  n = engine_->startRead(id, 4096, {out.data(), 4096}, a);
  ASSERT_TRUE(n.ok() && n->has_value());
  std::vector<int> short_read = perform(a);
  short_read[0] -= 1;
  EXPECT_FALSE(engine_->finishRead(a, short_read));
}

TEST_P(ChunkEngineTest, AsyncReadsOfFlippedBitsAreLeftToReadWhichReportsThem) {
  const ChunkId id{42, 0};
  auto data = pattern(20000, 8);
  ASSERT_TRUE(engine_->write(id, 0, data, 1).ok());
  engine_.reset();
  int fd = ::open((dir_ + "/data/c0/g0.dat").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b;
  ASSERT_EQ(::pread(fd, &b, 1, 5000), 1);
  b ^= 0x01;
  ASSERT_EQ(::pwrite(fd, &b, 1, 5000), 1);
  ::close(fd);
  reopen();
  ChunkEngine::AsyncRead a;
  std::vector<uint8_t> out(8192);
  ASSERT_EQ(*engine_->read(id, 0, {out.data(), 10}), 10u);  // opens the group file
  auto n = engine_->startRead(id, 4096, out, a);
  ASSERT_TRUE(n.ok() && n->has_value());
  EXPECT_FALSE(engine_->finishRead(a, perform(a)));
  EXPECT_EQ(engine_->read(id, 4096, out).code(), ErrorCode::kCorruption);
  // The blocks around it still read, either way.
  n = engine_->startRead(id, 8192, out, a);
  ASSERT_TRUE(n.ok() && n->has_value());
  ASSERT_TRUE(engine_->finishRead(a, perform(a)));
  EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + 8192));
}

// As AReadNeverReturnsBytesOfTheChunkThatTookItsSlot, for a read whose I/O
// runs after the chunk moved and another took its slot: the bytes there
// verify against the CRCs read with them, yet the read is not done.
TEST_P(ChunkEngineTest, AsyncReadsNeverReturnBytesOfTheChunkThatTookTheirSlot) {
  SlotSwap s{.a = {43, 0}, .b = {44, 0}};
  ASSERT_NO_FATAL_FAILURE(writeFirst(s));
  ChunkEngine::AsyncRead r;
  std::vector<uint8_t> out(16 * 4096);
  auto n = engine_->startRead(s.a, 4096, out, r);
  ASSERT_TRUE(n.ok() && n->has_value());
  ASSERT_NO_FATAL_FAILURE(swap(s));
  EXPECT_FALSE(engine_->finishRead(r, perform(r)));
  ASSERT_EQ(*engine_->read(s.a, 4096, out), out.size());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), s.new_a.begin() + 4096));
}

TEST_P(ChunkEngineTest, BadRequestsGetClearErrors) {
  std::vector<uint8_t> one(1);
  EXPECT_EQ(engine_->write({5, 0}, kMaxChunkBytes, one, 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->read({5, 0}, 0, one).code(), ErrorCode::kNotFound);
  ASSERT_TRUE(engine_->write({5, 0}, 0, one, 1).ok());
  EXPECT_EQ(*engine_->read({5, 0}, 10, one), 0u);  // past the end
  // A writer with an older chain table than the chunk's last writer is refused.
  ASSERT_TRUE(engine_->write({5, 1}, 0, one, 7).ok());
  EXPECT_EQ(engine_->write({5, 1}, 0, one, 6).code(), ErrorCode::kStaleChainVersion);
  EXPECT_EQ(engine_->truncate({5, 1}, 0, 6).code(), ErrorCode::kStaleChainVersion);
  EXPECT_EQ(engine_->query({5, 1})->value().length, 1u);
  EXPECT_TRUE(engine_->write({5, 1}, 0, one, 8).ok());
}

// A caller acting under a lease (an inline file's conversion) fences its
// writes, truncates and removes with the lease's end: past it, by the
// engine's wall clock once the chunk is locked, each is refused with
// kLeaseExpired and the chunk keeps what it had.
TEST_P(ChunkEngineTest, CallsPastTheirLeaseAreRefusedAndChangeNothing) {
  ManualClock clock;
  ChunkEngineOptions o = options();
  o.clock = &clock;
  reopen(o);
  const int64_t lease_end = clock.wallMicros() * 1000 + 1'000'000;  // 1 ms from now
  auto before = pattern(5000, 1), stale = pattern(6000, 2);
  ASSERT_TRUE(engine_->write({7, 0}, 0, before, 1, false, lease_end).ok());  // within the lease
  clock.advance(std::chrono::microseconds(999));
  ASSERT_TRUE(engine_->truncate({7, 0}, 5000, 1, lease_end).ok());  // at 999 us: still within
  clock.advance(std::chrono::microseconds(2));
  auto w = engine_->write({7, 0}, 0, stale, 1, false, lease_end);
  EXPECT_EQ(w.code(), ErrorCode::kLeaseExpired) << w.status().toString();
  EXPECT_EQ(engine_->truncate({7, 0}, 10, 1, lease_end).code(), ErrorCode::kLeaseExpired);
  EXPECT_EQ(engine_->remove({7, 0}, lease_end).code(), ErrorCode::kLeaseExpired);
  EXPECT_EQ(engine_->write({7, 1}, 0, stale, 1, false, lease_end).code(),
            ErrorCode::kLeaseExpired);  // nor does it create a chunk
  EXPECT_EQ(readAll({7, 0}, 5000), before);
  EXPECT_FALSE(engine_->query({7, 1})->has_value());
  // Calls without a fence, and the next holder's, go ahead.
  EXPECT_TRUE(engine_->write({7, 0}, 0, stale, 1).ok());
  EXPECT_EQ(readAll({7, 0}, 6000), stale);
  const int64_t next_lease_end = clock.wallMicros() * 1000 + 10'000'000'000;
  EXPECT_TRUE(engine_->remove({7, 0}, next_lease_end).ok());
  EXPECT_FALSE(engine_->query({7, 0})->has_value());
}

// A truncate's cut and a deleted file's GC: every chunk of one inode from an
// index on, in calls of at most `limit`, and nothing of the inodes around it.
TEST_P(ChunkEngineTest, RemoveFromTakesOneInodesChunksFromAnIndexOn) {
  auto data = pattern(3000, 5);
  for (uint32_t i : {0u, 1u, 2u, 5u, 9u, 1000u})
    ASSERT_TRUE(engine_->write({7, i}, 0, data, 1).ok());
  ASSERT_TRUE(engine_->write({6, 3}, 0, data, 1).ok());
  ASSERT_TRUE(engine_->write({8, 0}, 0, data, 1).ok());
  bool more = false;
  auto n = engine_->removeFrom(7, 2, 3, &more);
  ASSERT_TRUE(n.ok()) << n.status().toString();
  EXPECT_EQ(*n, 3u);  // 2, 5, 9
  EXPECT_TRUE(more);
  n = engine_->removeFrom(7, 2, 3, &more);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);  // 1000
  EXPECT_FALSE(more);
  for (uint32_t i : {2u, 5u, 9u, 1000u}) EXPECT_FALSE(engine_->query({7, i})->has_value()) << i;
  for (ChunkId id : {ChunkId{7, 0}, ChunkId{7, 1}, ChunkId{6, 3}, ChunkId{8, 0}})
    EXPECT_EQ(readAll(id, 3000), data) << id.inode << ":" << id.index;
  EXPECT_EQ(*engine_->removeFrom(7, 2, 3, &more), 0u);  // nothing left there: fine
  EXPECT_EQ(*engine_->removeFrom(9, 0, 3, &more), 0u);  // an inode with no chunks
  EXPECT_EQ(engine_->space().chunks, 4u);
  reopen(options());
  EXPECT_EQ(engine_->space().chunks, 4u);
  EXPECT_FALSE(engine_->query({7, 5})->has_value());
}

// A target on a small tmpfs fills up: writes fail with kNoSpace (ENOSPC),
// everything written before stays readable (also after a reopen), and the
// target has not failed. "small_segments": a 3 MiB file system with 64 KiB
// log segments (too small for logged writes); "logged": 1 MiB segments on 32
// MiB, so 60,000-byte writes carry their bytes in the log.
class ChunkEngineNoSpace : public ::testing::TestWithParam<std::string> {};

TEST_P(ChunkEngineNoSpace, FullFilesystemGivesNoSpaceAndKeepsData) {
  const bool logged = GetParam() == "logged";
  char tmpl[] = "/tmp/cistern-enospc-XXXXXX";
  std::string mnt = mkdtemp(tmpl);
  std::string cmd = "mount -t tmpfs -o size=" + std::string(logged ? "32m" : "3m") + " tmpfs " +
                    mnt + " 2>/dev/null";
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
  ChunkEngineOptions o;
  o.path = mnt + "/target";
  o.group_bytes = 1 << 20;
  // The reserve keeps room for the log's segments (at most 8).
  o.reserved_bytes = logged ? 10 << 20 : 512 << 10;
  o.meta_log_segment_bytes = logged ? 1 << 20 : 64 << 10;
  std::vector<std::vector<uint8_t>> written;
  auto verify = [&](ChunkEngine& e) {
    for (uint32_t i = 0; i < written.size(); ++i) {
      std::vector<uint8_t> out(60000);
      auto n = e.read({8, i}, 0, out);
      if (written[i].empty()) {
        EXPECT_EQ(n.code(), ErrorCode::kNotFound) << i;
        continue;
      }
      ASSERT_TRUE(n.ok()) << i << ": " << n.status().toString();
      EXPECT_EQ(out, written[i]) << i;
    }
  };
  {
    auto e = ChunkEngine::open(o);
    ASSERT_TRUE(e.ok()) << e.status().toString();
    auto& syncs = metrics::Registry::global().counter("storage_data_syncs_total");
    uint64_t syncs0 = syncs.value();
    Status last;
    for (uint32_t i = 0; i < 1000; ++i) {
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
    // Logged writes sync no group file (their bytes are in the log).
    if (logged)
      EXPECT_EQ(syncs.value(), syncs0);
    else
      EXPECT_GE(syncs.value() - syncs0, written.size() / 2);
    verify(**e);
  }
  auto e = ChunkEngine::open(o);
  ASSERT_TRUE(e.ok()) << e.status().toString();
  verify(**e);
  // Removing chunks makes room again, whether their slots were kept (the
  // next write punches them to get the space) or punched at once. With the
  // log's 1 MiB segments, enough for one more segment too: the log may have
  // made its spare (which counts against the reserve) just before the disk
  // filled.
  const uint32_t removed = logged ? 24 : 8;
  ASSERT_GT(written.size(), removed);
  for (uint32_t i = 0; i < removed; ++i) ASSERT_TRUE((*e)->remove({8, i}).ok());
  for (uint32_t i = 4; i < removed; ++i) written[i].clear();  // gone: read as missing
  for (uint32_t i = 0; i < 4; ++i) {
    written[i] = pattern(60000, 5000 + i);
    auto m = (*e)->write({8, i}, 0, written[i], 1);
    ASSERT_TRUE(m.ok()) << i << ": " << m.status().toString();
  }
  verify(**e);
}

INSTANTIATE_TEST_SUITE_P(Logs, ChunkEngineNoSpace, ::testing::Values("small_segments", "logged"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace cistern::storage
