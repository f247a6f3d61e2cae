// The chunk engine against a real directory: every alignment, copy-on-write
// slot reuse, persistence, detection of flipped bits, crash points,
// concurrency, appends and truncates. The metadata log's replay:
// chunk_engine_log_test.cc; slots, the CRC cache, async reads and a full
// file system: chunk_engine_slots_test.cc.
#include "storage/chunk_engine_test_util.h"

namespace cistern::storage {
namespace {

using namespace test_util;

// Options that cannot work are refused before the target is touched.
TEST_P(ChunkEngineTest, UnusableOptionsAreRefusedBeforeTheTargetIsCreated) {
  std::string fresh = dir_ + "-never";
  ChunkEngineOptions o = options();
  o.path = fresh;
  o.io_engine = "aio";
  auto e = ChunkEngine::open(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("unknown storage I/O engine 'aio'"), std::string::npos)
      << e.status().toString();
  o.io_engine = "psync";
  o.open_files_max = 0;
  e = ChunkEngine::open(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
  o.open_files_max = 1;
  o.meta_memtable_bytes = 4096;
  e = ChunkEngine::open(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("meta_memtable_bytes must be at least 65536, not 4096"),
            std::string::npos)
      << e.status().toString();
  EXPECT_FALSE(std::filesystem::exists(fresh));
}

TEST_P(ChunkEngineTest, WritesAtEveryAlignmentReadBackExactly) {
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

TEST_P(ChunkEngineTest, OverwriteInTheMiddleAndGrowAcrossClasses) {
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

TEST_P(ChunkEngineTest, RepeatedOverwritesReuseSlotsInsteadOfGrowing) {
  // Writes into small chunks carry their bytes in the metadata log, so a
  // slot they freed waits for a checkpoint (at most 16 wait here) before it
  // is reused. With RocksDB's WAL nothing is logged and nothing waits.
  const bool logged = GetParam() != "psync_wal";
  ChunkEngineOptions o = options();
  o.logged_held_slots_max = 16;
  reopen(o);
  ChunkId id{9, 0};
  uint64_t held_max = 0;
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(engine_->write(id, 0, pattern(4096, static_cast<uint64_t>(i)), 1).ok());
    held_max = std::max(held_max, engine_->heldSlots(0));
    ASSERT_EQ(engine_->usedSlots(0), 1u);
  }
  EXPECT_EQ(held_max, logged ? 16u : 0u);
  EXPECT_EQ(readAll(id, 4096), pattern(4096, 199));
  // Group files do not grow without bound: without logging slot 0 and 1
  // alternate; with it, the held slots come on top.
  auto size = std::filesystem::file_size(dir_ + "/data/c0/g0.dat");
  EXPECT_LE(size, (logged ? 18u : 2u) * slotStride(0));
  reopen();  // a reopen starts with nothing held
  EXPECT_EQ(engine_->heldSlots(0), 0u);
  EXPECT_EQ(engine_->usedSlots(0), 1u);
  EXPECT_EQ(readAll(id, 4096), pattern(4096, 199));
}

// A client writes a file's chunks in parallel, so a chunk's predecessor is
// often not committed yet and its placement starts a new run. Run starts must
// not open groups while existing ones have free slots (they once did: a 2 GiB
// file took 77 GB of pre-allocated group files).
TEST_P(ChunkEngineTest, ParallelRunStartsDoNotGrowTheTarget) {
  engine_.reset();
  ChunkEngineOptions o = options();
  o.group_bytes = 128 << 20;  // 128 slots of the 1 MiB class: two 64-slot words
  auto e = ChunkEngine::open(o);
  ASSERT_TRUE(e.ok()) << e.status().toString();
  engine_ = std::move(e).value();
  auto data = pattern(1 << 20, 5);
  for (uint32_t batch = 0; batch < 16; ++batch)
    for (uint32_t k = 4; k-- > 0;)  // 3, 2, 1, 0: predecessors missing
      ASSERT_TRUE(engine_->write(ChunkId{77, batch * 4 + k}, 0, data, 1).ok());
  size_t groups = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir_ + "/data/c4")) {
    (void)f;
    ++groups;
  }
  EXPECT_EQ(groups, 1u);
  EXPECT_EQ(engine_->usedSlots(4), 64u);
  EXPECT_EQ(readAll(ChunkId{77, 63}, 1 << 20), data);
  for (uint32_t i = 0; i < 64; ++i) EXPECT_EQ((*engine_->query(ChunkId{77, i}))->addr.slot, i);
}

// Files written at the same time, each file's chunks in the order a client's
// parallel writes bring them (windows of 8, shuffled), lie in index order on
// disk, 64 to a run, so each reads back sequentially (they once went to the
// lowest free slot whenever a chunk's predecessor was not committed yet:
// 512 chunks of a file lay in ~400 pieces). A reopen forgets the runs; an
// append finds its run from the chunk before it.
TEST_P(ChunkEngineTest, AFilesChunksLieInIndexOrderOnDiskWhateverOrderTheyAreWrittenIn) {
  ChunkEngineOptions o = options();
  o.group_bytes = 256 << 20;  // four 64-slot runs per group of the 1 MiB class
  reopen(o);
  auto data = pattern(520 << 10, 3);  // a chunk of the 1 MiB class
  Xoshiro256 rng(11);
  constexpr uint32_t kChunks = 72;
  for (uint32_t first = 0; first < kChunks; first += 8) {
    for (uint64_t file : {50, 51, 52}) {
      std::vector<uint32_t> window;
      for (uint32_t i = first; i < first + 8; ++i) window.push_back(i);
      for (size_t i = window.size(); i > 1; --i) std::swap(window[i - 1], window[rng.uniform(i)]);
      for (uint32_t i : window) ASSERT_TRUE(engine_->write(ChunkId{file, i}, 0, data, 1).ok());
    }
  }
  auto addr = [&](uint64_t file, uint32_t i) {
    auto m = engine_->query(ChunkId{file, i});
    EXPECT_TRUE(m.ok() && m->has_value()) << file << ":" << i;
    return m.ok() && m->has_value() ? (*m)->addr : SlotAddr{~0u, ~0u};
  };
  std::set<uint32_t> runs;  // 64-slot words
  for (uint64_t file : {50, 51, 52}) {
    for (uint32_t i = 0; i < kChunks; ++i) {
      SlotAddr a = addr(file, i);
      EXPECT_EQ(a.slot % 64, i % 64) << file << ":" << i;
      if (i % 64 == 0) {
        EXPECT_TRUE(runs.insert(a.group * 4 + a.slot / 64).second) << "run shared: " << file;
      } else {
        EXPECT_EQ(a, (SlotAddr{addr(file, i - 1).group, addr(file, i - 1).slot + 1}))
            << file << ":" << i;
      }
    }
  }
  EXPECT_EQ(runs.size(), 6u);  // 2 runs per file
  reopen(o);
  ASSERT_TRUE(engine_->write(ChunkId{51, kChunks}, 0, data, 1).ok());
  EXPECT_EQ(addr(51, kChunks),
            (SlotAddr{addr(51, kChunks - 1).group, addr(51, kChunks - 1).slot + 1}));
  EXPECT_EQ(readAll(ChunkId{51, kChunks}, data.size()), data);
  EXPECT_EQ(readAll(ChunkId{52, 17}, data.size()), data);
}

TEST_P(ChunkEngineTest, DataAndSlotsSurviveReopen) {
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

TEST_P(ChunkEngineTest, FlippedBitsAreDetectedByReadAndScrub) {
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
    off_t pos = static_cast<off_t>(slot * slotStride(0) + 17 * slot + 3);
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

// A slot whose bytes and CRCs agree but are another chunk's (a write that
// went to the wrong place): reads cannot tell, scrub can by the record's
// crcs_crc.
TEST_P(ChunkEngineTest, ScrubFindsASlotThatHoldsAnotherChunksBytesAndCrcs) {
  auto x = pattern(8192, 200), y = pattern(8192, 201);  // whole blocks: no tail CRC
  ASSERT_TRUE(engine_->write({6, 0}, 0, x, 1).ok());
  ASSERT_TRUE(engine_->write({6, 1}, 0, y, 1).ok());
  auto mx = engine_->query({6, 0}), my = engine_->query({6, 1});
  ASSERT_TRUE(mx.ok() && *mx && my.ok() && *my);
  ASSERT_EQ((*mx)->size_class, (*my)->size_class);
  ASSERT_EQ((*mx)->addr.group, (*my)->addr.group);
  engine_.reset();
  const uint32_t c = (*mx)->size_class;
  int fd = ::open(groupFileOf(**mx).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  // y's two blocks and their two CRC entries, over x's.
  const auto copy = [&](uint64_t at, size_t n) {
    std::vector<uint8_t> b(n);
    const uint64_t from = (*my)->addr.slot * slotStride(c) + at;
    const uint64_t to = (*mx)->addr.slot * slotStride(c) + at;
    ASSERT_EQ(::pread(fd, b.data(), n, static_cast<off_t>(from)), static_cast<ssize_t>(n));
    ASSERT_EQ(::pwrite(fd, b.data(), n, static_cast<off_t>(to)), static_cast<ssize_t>(n));
  };
  copy(0, y.size());
  copy(classBytes(c), y.size() / kBlockBytes * 4);
  ::close(fd);
  reopen();
  EXPECT_EQ(readAll({6, 0}, x.size()), y) << "a read has no way to tell";
  auto bad = engine_->scrub();
  ASSERT_TRUE(bad.ok()) << bad.status().toString();
  ASSERT_EQ(bad->size(), 1u);
  EXPECT_EQ((*bad)[0], (ChunkId{6, 0}));
}

TEST_P(ChunkEngineTest, FailureAfterDataLeavesTheOldChunkAndFreesTheSlot) {
  auto v1 = pattern(3000, 1);
  ASSERT_TRUE(engine_->write({3, 0}, 0, v1, 1).ok());
  fault::enable("storage.write.after_data", fault::Spec{.code = ErrorCode::kIOError});
  EXPECT_EQ(engine_->write({3, 0}, 0, pattern(3000, 2), 1).code(), ErrorCode::kIOError);
  fault::disableAll();
  EXPECT_EQ(readAll({3, 0}, 3000), v1);
  EXPECT_EQ(engine_->usedSlots(0), 1u);
}

TEST_P(ChunkEngineTest, SlotsLeakedByACrashAfterMetadataAreReclaimedOnReopen) {
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

TEST_P(ChunkEngineTest, ConcurrentWritersToDifferentChunksAllCommit) {
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

TEST_P(ChunkEngineTest, ConcurrentWritersToDisjointRangesOfOneChunk) {
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

TEST_P(ChunkEngineTest, AppendsWithinTheClassStayInTheirSlot) {
  ChunkId id{11, 0};
  std::vector<uint8_t> all;
  auto first = engine_->write(id, 0, pattern(1000, 1), 1);
  ASSERT_TRUE(first.ok());
  all = pattern(1000, 1);
  for (uint64_t i = 0; i < 30; ++i) {  // unaligned appends, crossing block boundaries
    auto more = pattern(1500 + i, 10 + i);
    auto m = engine_->write(id, all.size(), more, 1);
    ASSERT_TRUE(m.ok()) << m.status().toString();
    all.insert(all.end(), more.begin(), more.end());
    EXPECT_EQ(m->addr, first->addr) << "append " << i << " moved the chunk";
    EXPECT_EQ(m->length, all.size());
    EXPECT_EQ(readAll(id, all.size()), all);
  }
  // An append with a gap: the gap reads as zeros.
  auto m = engine_->write(id, all.size() + 3000, pattern(10, 99), 1);
  ASSERT_TRUE(m.ok());
  all.resize(all.size() + 3000, 0);
  auto ten = pattern(10, 99);
  all.insert(all.end(), ten.begin(), ten.end());
  EXPECT_EQ(readAll(id, all.size()), all);
  EXPECT_EQ(engine_->usedSlots(0), 1u);
  reopen();
  EXPECT_EQ(readAll(id, all.size()), all);
}

TEST_P(ChunkEngineTest, TruncateShrinksAndGrowsWithZeros) {
  ChunkId id{12, 0};
  auto data = pattern(200000, 5);  // class 2 (256 KiB)
  ASSERT_TRUE(engine_->write(id, 0, data, 1).ok());
  auto m = engine_->truncate(id, 150001, 2);  // same class: record only
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_EQ(m->length, 150001u);
  EXPECT_EQ(m->size_class, 2u);
  EXPECT_EQ(m->chain_version, 2u);
  data.resize(150001);
  EXPECT_EQ(readAll(id, data.size()), data);
  m = engine_->truncate(id, 5000, 2);  // into class 0: copied
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size_class, 0u);
  EXPECT_EQ(engine_->usedSlots(2), 0u);
  data.resize(5000);
  EXPECT_EQ(readAll(id, data.size()), data);
  m = engine_->truncate(id, 9000, 2);  // grow: zeros
  ASSERT_TRUE(m.ok());
  data.resize(9000, 0);
  EXPECT_EQ(readAll(id, data.size()), data);
  // The bytes cut off earlier do not come back when the chunk grows again.
  ASSERT_TRUE(engine_->truncate(id, 0, 2).ok());
  ASSERT_TRUE(engine_->truncate(id, 4097, 2).ok());
  EXPECT_EQ(readAll(id, 4097), std::vector<uint8_t>(4097, 0));
  // Truncating a missing chunk creates it.
  ASSERT_TRUE(engine_->truncate({12, 1}, 70000, 1).ok());
  EXPECT_EQ(readAll({12, 1}, 70000), std::vector<uint8_t>(70000, 0));
  EXPECT_EQ(engine_->truncate(id, kMaxChunkBytes + 1, 1).code(), ErrorCode::kInvalidArgument);
}

TEST_P(ChunkEngineTest, SmallReadsVerifyOnlyTheBlocksTheyTouch) {
  ChunkId id{13, 0};
  auto data = pattern(65536, 7);
  ASSERT_TRUE(engine_->write(id, 0, data, 1).ok());
  engine_.reset();
  // Corrupt block 5 only (data bytes 20480..24575 of slot 0).
  int fd = ::open((dir_ + "/data/c0/g0.dat").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b = static_cast<uint8_t>(data[5 * 4096 + 100] ^ 1);
  ASSERT_EQ(::pwrite(fd, &b, 1, 5 * 4096 + 100), 1);
  ::close(fd);
  reopen();
  std::vector<uint8_t> out(4096);
  ASSERT_EQ(*engine_->read(id, 4 * 4096, out), 4096u);
  EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + 4 * 4096));
  EXPECT_EQ(engine_->read(id, 5 * 4096 + 4000, out).code(), ErrorCode::kCorruption);
  EXPECT_EQ(engine_->read(id, 0, std::span<uint8_t>(out).first(100)).code(), ErrorCode::kOk);
  auto bad = engine_->scrub();
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(*bad, std::vector<ChunkId>{id});
}

// Page-aligned destination buffers take the no-copy path (data straight into
// the caller's buffer, with the CRC page in the same I/O for full slots)
// when their pages are large or huge_page_io is off; large reads into plain
// pages go through the engine's buffer. Every way reads exactly and verifies.
TEST_P(ChunkEngineTest, AlignedReadsAreExactAndVerified) {
  for (Mem kind : {Mem::kPlain, Mem::kHuge, Mem::kPlainNoBounce}) {
    SCOPED_TRACE(memName(kind));
    freshTarget(kind);
    auto full = pattern(65536, 21), part = pattern(100000, 22), big = pattern(1 << 20, 23);
    ASSERT_TRUE(engine_->write({18, 0}, 0, full, 1).ok());
    ASSERT_TRUE(engine_->write({18, 1}, 0, part, 1).ok());
    ASSERT_TRUE(engine_->write({18, 2}, 0, big, 1).ok());
    TestMemory mem(kind, 2 << 20);
    std::span<uint8_t> out(mem.data, 2 << 20);
    ASSERT_EQ(*engine_->read({18, 0}, 0, out), 65536u);
    EXPECT_TRUE(std::equal(full.begin(), full.end(), out.begin()));
    ASSERT_EQ(*engine_->read({18, 1}, 0, out), 100000u);
    EXPECT_TRUE(std::equal(part.begin(), part.end(), out.begin()));
    ASSERT_EQ(*engine_->read({18, 1}, 8192, out.first(8192)), 8192u);
    EXPECT_TRUE(std::equal(part.begin() + 8192, part.begin() + 16384, out.begin()));
    // A whole 1 MiB slot (data and CRC page in one I/O), at the start and
    // at a page-aligned place inside the memory; then a large middle part.
    ASSERT_EQ(*engine_->read({18, 2}, 0, out), size_t{1} << 20);
    EXPECT_TRUE(std::equal(big.begin(), big.end(), out.begin()));
    ASSERT_EQ(*engine_->read({18, 2}, 0, out.subspan(4096, 1 << 20)), size_t{1} << 20);
    EXPECT_TRUE(std::equal(big.begin(), big.end(), out.begin() + 4096));
    ASSERT_EQ(*engine_->read({18, 2}, 4096, out.first(600 << 10)), size_t{600} << 10);
    EXPECT_TRUE(std::equal(big.begin() + 4096, big.begin() + 4096 + (600 << 10), out.begin()));
    engine_.reset();
    // Flip a data byte of {18, 0} (slot 0, block 9) and a CRC byte of block 2.
    int fd = ::open((dir_ + "/data/c0/g0.dat").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b;
    for (off_t pos : {off_t(9 * 4096 + 5), off_t(classBytes(0) + 2 * 4)}) {
      ASSERT_EQ(::pread(fd, &b, 1, pos), 1);
      b ^= 0x04;
      ASSERT_EQ(::pwrite(fd, &b, 1, pos), 1);
    }
    ::close(fd);
    // And a data byte in the last block of the 1 MiB chunk.
    auto m = ChunkEngine::open(options());
    ASSERT_TRUE(m.ok());
    auto at = (*m)->query({18, 2});
    ASSERT_TRUE(at.ok() && at->has_value());
    m->reset();
    const uint32_t c2 = (*at)->size_class;
    fd = ::open(groupFileOf(**at).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const off_t last = off_t((*at)->addr.slot) * off_t(slotStride(c2)) + (1 << 20) - 7;
    ASSERT_EQ(::pread(fd, &b, 1, last), 1);
    b ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &b, 1, last), 1);
    ::close(fd);
    ChunkEngineOptions o = options();
    o.huge_page_io = kind != Mem::kPlainNoBounce;
    reopen(o);
    std::memset(out.data(), 0xEE, out.size());
    EXPECT_EQ(engine_->read({18, 0}, 0, out).code(), ErrorCode::kCorruption);
    EXPECT_EQ(engine_->read({18, 0}, 9 * 4096, out.first(4096)).code(), ErrorCode::kCorruption);
    EXPECT_EQ(engine_->read({18, 0}, 2 * 4096, out.first(4096)).code(), ErrorCode::kCorruption);
    EXPECT_EQ(engine_->read({18, 2}, 0, out).code(), ErrorCode::kCorruption);
    EXPECT_EQ(engine_->read({18, 2}, 0, out.subspan(4096, 1 << 20)).code(), ErrorCode::kCorruption);
    ASSERT_EQ(*engine_->read({18, 0}, 3 * 4096, out.first(4096)), 4096u);
    EXPECT_TRUE(std::equal(full.begin() + 3 * 4096, full.begin() + 4 * 4096, out.begin()));
    ASSERT_EQ(*engine_->read({18, 2}, 0, out.first(512 << 10)), size_t{512} << 10);
    EXPECT_TRUE(std::equal(big.begin(), big.begin() + (512 << 10), out.begin()));
  }
}

// Stable source bytes at 4 KiB-aligned addresses go to the disk without a
// copy when they fill a piece's whole blocks (a whole slot with its CRC
// page, a block-aligned append in place) and their pages are large or
// huge_page_io is off; the rest takes the copy. Either way the bytes read
// back exactly and their CRCs hold.
TEST_P(ChunkEngineTest, StableAlignedWritesAreExactAndVerified) {
  for (Mem kind : {Mem::kPlain, Mem::kHuge, Mem::kPlainNoBounce}) {
    SCOPED_TRACE(memName(kind));
    freshTarget(kind);
    constexpr size_t kMem = (2 << 20) + 8192;
    TestMemory mem(kind, kMem);
    auto src = pattern(kMem, 31);
    std::copy(src.begin(), src.end(), mem.data);
    auto bytes = [&](size_t from, size_t n) {
      return std::span<const uint8_t>(mem.data + from, n);
    };
    auto expect = [&](size_t from, size_t n) {
      return std::vector<uint8_t>(src.begin() + from, src.begin() + from + n);
    };
    // A whole 1 MiB slot; 1 MiB + 100 (a copied partial last piece); an
    // unaligned source (copied); then an aligned append in place.
    ASSERT_TRUE(engine_->write({19, 0}, 0, bytes(0, 1 << 20), 1, true).ok());
    ASSERT_TRUE(engine_->write({19, 1}, 0, bytes(4096, (1 << 20) + 100), 1, true).ok());
    ASSERT_TRUE(engine_->write({19, 2}, 0, bytes(1, 1 << 20), 1, true).ok());
    ASSERT_TRUE(engine_->write({19, 3}, 0, bytes(8192, 102400), 1, true).ok());
    auto m = engine_->write({19, 3}, 102400, bytes(8192, 16384), 1, true);
    ASSERT_TRUE(m.ok()) << m.status().toString();
    EXPECT_EQ(m->length, 118784u);
    // A block-aligned append of 128 KiB in place (fills a piece's blocks).
    ASSERT_TRUE(engine_->write({19, 4}, 0, bytes(0, 131072), 1, true).ok());
    ASSERT_TRUE(engine_->write({19, 4}, 131072, bytes(1 << 20, 131072), 1, true).ok());
    EXPECT_EQ(readAll({19, 0}, 1 << 20), expect(0, 1 << 20));
    EXPECT_EQ(readAll({19, 1}, (1 << 20) + 100), expect(4096, (1 << 20) + 100));
    EXPECT_EQ(readAll({19, 2}, 1 << 20), expect(1, 1 << 20));
    auto appended = expect(8192, 102400), tail = expect(8192, 16384);
    appended.insert(appended.end(), tail.begin(), tail.end());
    EXPECT_EQ(readAll({19, 3}, 118784), appended);
    auto two = expect(0, 131072), second = expect(1 << 20, 131072);
    two.insert(two.end(), second.begin(), second.end());
    EXPECT_EQ(readAll({19, 4}, 262144), two);
    auto clean = engine_->scrub();
    ASSERT_TRUE(clean.ok());
    EXPECT_TRUE(clean->empty());
    // The same after a reopen, from the disk.
    reopen();
    EXPECT_EQ(readAll({19, 0}, 1 << 20), expect(0, 1 << 20));
    EXPECT_EQ(readAll({19, 3}, 118784), appended);
    EXPECT_EQ(readAll({19, 4}, 262144), two);
  }
}

INSTANTIATE_TEST_SUITE_P(IoEngines, ChunkEngineTest,
                         ::testing::Values("io_uring", "psync", "psync_wal"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace cistern::storage
