// The chunk engine against a real directory: every alignment, copy-on-write
// slot reuse, persistence, detection of flipped bits, and crash points.
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

namespace cistern::storage {
namespace {

// Memory a test reads into or writes from, page-aligned: plain 4 KiB pages
// (large I/O then goes through the engine's own 2 MiB-page buffers and a
// copy), a region in 2 MiB pages (io_memory: no copy), or plain pages with
// huge_page_io off (no copy either).
enum class Mem { kPlain, kHuge, kPlainNoBounce };
const char* memName(Mem m) {
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

std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
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

// Overwrites every copy of `bytes` in the files under `dir`/data with zeros
// (what a lost device cache leaves of data written there); returns how many.
size_t zeroEveryCopy(const std::string& dir, const std::vector<uint8_t>& bytes) {
  size_t found = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir + "/data")) {
    if (!f.is_regular_file()) continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(io)), {});
    const std::string needle(bytes.begin(), bytes.end());
    for (size_t at = content.find(needle); at != std::string::npos;
         at = content.find(needle, at + needle.size())) {
      io.seekp(static_cast<std::streamoff>(at));
      const std::string zeros(needle.size(), '\0');
      io.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
      ++found;
    }
  }
  return found;
}

// The metadata in the commit log (RocksDB's WAL has no replay to check).
class ChunkEngineLogTest : public ChunkEngineTest {
 protected:
  // A write whose batch's sync fails: the target fails, and the write's
  // record stays in the log, unsynced.
  Status writeWithFailedSync(ChunkId id, uint64_t offset, const std::vector<uint8_t>& data) {
    fault::enable("storage.commit.before_data_sync", fault::Spec{.code = ErrorCode::kIOError});
    Status s = engine_->write(id, offset, data, 1).status();
    fault::disableAll();
    return s;
  }
  // The chunk's record; nullopt if it has none or the query fails.
  std::optional<ChunkMeta> recordOf(ChunkId id) {
    auto m = engine_->query(id);
    return m.ok() ? *m : std::nullopt;
  }
};
INSTANTIATE_TEST_SUITE_P(IoEngines, ChunkEngineLogTest, ::testing::Values("io_uring", "psync"),
                         [](const auto& info) { return info.param; });

// A batch's record goes to the log unsynced and becomes durable with the
// fdatasync of its group files. A target that stops between the two (here:
// the sync fails) has the record in its log but maybe not the data: replay
// checks the data of records no later record vouches for, drops a write
// whose data is not on disk (never acknowledged: the chunk keeps its
// previous version and the slot is free again), and keeps one whose data is.
TEST_P(ChunkEngineLogTest, ReplayDropsAnUnacknowledgedWriteWhoseDataNeverReachedTheDisk) {
  const ChunkId id{7, 0};
  auto before = pattern(1 << 20, 1), lost = pattern(1 << 20, 2);
  ASSERT_TRUE(engine_->write(id, 0, before, 1).ok());
  const uint64_t used = engine_->space().data_bytes;
  EXPECT_EQ(writeWithFailedSync(id, 0, lost).code(), ErrorCode::kIOError);
  EXPECT_EQ(engine_->write(ChunkId{8, 0}, 0, before, 1).code(), ErrorCode::kIOError)
      << "the target failed with its sync";
  engine_.reset();
  EXPECT_EQ(zeroEveryCopy(dir_, std::vector<uint8_t>(lost.begin(), lost.begin() + 4096)), 1u);
  reopen();
  auto m = recordOf(id);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->chunk_version, 1u);
  EXPECT_EQ(readAll(id, before.size()), before);
  EXPECT_EQ(engine_->space().data_bytes, used);
  EXPECT_EQ(engine_->usedSlots(m->size_class), 1u) << "the lost write's slot is free";
  ASSERT_TRUE(engine_->write(id, 0, lost, 1).ok());
  EXPECT_EQ(readAll(id, lost.size()), lost);
}

// The same for an append that goes in place: the old record's length hides
// the lost bytes, and the blocks before it were never touched.
TEST_P(ChunkEngineLogTest, ReplayDropsAnUnacknowledgedAppendWhoseDataNeverReachedTheDisk) {
  const ChunkId id{9, 0};
  auto head = pattern(100 << 10, 3),
       tail = pattern(20 << 10, 4);  // 100 KiB + 20 KiB: class 128 KiB
  auto first = engine_->write(id, 0, head, 1);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(writeWithFailedSync(id, head.size(), tail).ok());
  engine_.reset();
  // The appended bytes start on a block boundary (100 KiB = 25 blocks).
  EXPECT_EQ(zeroEveryCopy(dir_, std::vector<uint8_t>(tail.begin(), tail.begin() + 4096)), 1u);
  reopen();
  auto m = recordOf(id);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->chunk_version, 1u);
  EXPECT_EQ(m->addr, first->addr) << "an append stays in its slot";
  EXPECT_EQ(readAll(id, head.size()), head);
  // Appending again works and reads back whole.
  ASSERT_TRUE(engine_->write(id, head.size(), tail, 1).ok());
  auto both = head;
  both.insert(both.end(), tail.begin(), tail.end());
  EXPECT_EQ(readAll(id, both.size()), both);
}

// Unsynced writes (write(..., durable = false)): acknowledged before their
// data and record are synced. Until a sync makes such a write durable, the
// slot of the chunk's previous version is held (a power loss may bring
// that version back); sync(), a later durable write, or the bound on
// unsynced bytes end that.
TEST_P(ChunkEngineLogTest, UnsyncedWritesHoldTheOldSlotsUntilASyncCoversThem) {
  ChunkEngineOptions o = options();
  o.sync_interval_ms = 600000;  // no sync of the engine's own in this test
  reopen(o);
  const ChunkId id{11, 0};
  auto v1 = pattern(1 << 20, 5), v2 = pattern(1 << 20, 6);
  ASSERT_TRUE(engine_->write(id, 0, v1, 1).ok());
  const uint32_t c = recordOf(id)->size_class;
  ASSERT_TRUE(engine_->write(id, 0, v2, 1, false, 0, /*durable=*/false).ok());
  EXPECT_EQ(readAll(id, v2.size()), v2);
  EXPECT_EQ(engine_->usedSlots(c), 2u) << "the previous version's slot is held";
  ASSERT_TRUE(engine_->sync().ok());
  EXPECT_EQ(engine_->usedSlots(c), 1u);
  EXPECT_EQ(readAll(id, v2.size()), v2);
  // A durable write (here to a chunk of another class) syncs the unsynced
  // writes before it as well.
  ASSERT_TRUE(engine_->write(id, 0, v1, 1, false, 0, /*durable=*/false).ok());
  EXPECT_EQ(engine_->usedSlots(c), 2u);
  ASSERT_TRUE(engine_->write(ChunkId{12, 0}, 0, pattern(200 << 10, 7), 1).ok());
  EXPECT_EQ(engine_->usedSlots(c), 1u);
  // Past unsynced_bytes_max (the data plus the held slot) a write is durable.
  o.unsynced_bytes_max = 1 << 20;
  reopen(o);
  ASSERT_TRUE(engine_->write(id, 0, v2, 1, false, 0, /*durable=*/false).ok());
  EXPECT_EQ(engine_->usedSlots(c), 1u);
  EXPECT_EQ(readAll(id, v2.size()), v2);
  // The engine syncs by itself within sync_interval_ms.
  o.unsynced_bytes_max = 1ull << 30;
  o.sync_interval_ms = 20;
  reopen(o);
  ASSERT_TRUE(engine_->write(id, 0, v1, 1, false, 0, /*durable=*/false).ok());
  for (int i = 0; i < 500 && engine_->usedSlots(c) > 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine_->usedSlots(c), 1u);
  EXPECT_EQ(readAll(id, v1.size()), v1);
}

// A sync that releases a held class-0 slot may force a checkpoint (here:
// every held class-0 slot does), whose RocksDB flush runs a sync of its own
// first: the release comes after the sync lets go of its lock.
TEST_P(ChunkEngineLogTest, ASyncThatReleasesASmallSlotMayCheckpoint) {
  ChunkEngineOptions o = options();
  o.sync_interval_ms = 600000;
  o.logged_held_slots_max = 0;
  reopen(o);
  const ChunkId id{15, 0};
  auto small = pattern(4096, 11), grown = pattern(100 << 10, 12);
  ASSERT_TRUE(engine_->write(id, 0, small, 1).ok());
  ASSERT_EQ(recordOf(id)->size_class, 0u);
  // Grows into class 1: copy-on-write, the class-0 slot held until the sync.
  ASSERT_TRUE(engine_->write(id, 0, grown, 1, false, 0, /*durable=*/false).ok());
  EXPECT_EQ(engine_->usedSlots(0), 1u);
  ASSERT_TRUE(engine_->sync().ok());
  EXPECT_EQ(engine_->usedSlots(0), 0u);
  EXPECT_EQ(readAll(id, grown.size()), grown);
  reopen(o);
  EXPECT_EQ(readAll(id, grown.size()), grown);
}

// The sync that RocksDB's flush runs first (FlushListener) releases no held
// slot: releasing a class-0 slot past logged_held_slots_max checkpoints,
// and the checkpoint's flush would wait for the flush the listener runs
// in. Here RocksDB flushes a full memtable on its own while only unsynced
// writes come in (a durable write's sync would release the slot first) and
// a class-0 slot of an unsynced copy-on-write waits for a sync.
TEST_P(ChunkEngineLogTest, TheSyncBeforeAMetadataFlushReleasesNoSlot) {
  ChunkEngineOptions o = options();
  o.sync_interval_ms = 600000;
  o.logged_held_slots_max = 0;
  o.meta_memtable_bytes = 64 << 10;
  reopen(o);
  // On a thread: a flush that waits for itself hangs every flush after it,
  // the engine's close included.
  auto body = std::async(std::launch::async, [&] {
    const ChunkId grows{16, 0};
    auto grown = pattern(100 << 10, 14), other = pattern(65 << 10, 15);
    ASSERT_TRUE(engine_->write(grows, 0, pattern(4096, 13), 1).ok());
    // Copy-on-write into class 1: the class-0 slot waits for the sync.
    ASSERT_TRUE(engine_->write(grows, 0, grown, 1, false, 0, /*durable=*/false).ok());
    EXPECT_EQ(engine_->usedSlots(0), 1u);
    auto& syncs = metrics::Registry::global().counter("storage_data_syncs_total");
    const uint64_t syncs0 = syncs.value();
    // Unsynced writes until a memtable flush has synced (nothing else syncs).
    uint32_t n = 0;
    while (syncs.value() == syncs0) {
      ASSERT_LT(n, 4000u) << "no memtable flush";
      auto m = engine_->write({18, n++}, 0, other, 1, false, 0, /*durable=*/false);
      ASSERT_TRUE(m.ok()) << m.status().toString();
    }
    EXPECT_EQ(engine_->usedSlots(0), 1u) << "the listener's sync released a slot";
    ASSERT_TRUE(engine_->sync().ok());
    EXPECT_EQ(engine_->usedSlots(0), 0u);
    EXPECT_EQ(readAll(grows, grown.size()), grown);
    reopen(o);
    EXPECT_EQ(readAll(grows, grown.size()), grown);
    for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(readAll({18, i}, other.size()), other) << i;
    engine_.reset();
  });
  if (body.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "no return in 60 s: a metadata flush waits for itself\n");
    std::_Exit(1);  // a deadlocked thread cannot be unwound
  }
  body.get();
}

// A crash of the process loses no unsynced write: its bytes and record are
// in the device's or the kernel's cache. A power loss may lose the data of
// one; replay then finds it does not verify and shows the chunk's previous
// version, whose slot was held for that, and keeps the writes whose data
// did reach the disk.
TEST_P(ChunkEngineLogTest, UnsyncedWritesSurviveACrashAndAPowerLossShowsThePreviousVersion) {
  ChunkEngineOptions o = options();
  o.sync_interval_ms = 600000;
  o.flush_at_close = false;  // closing is a crash: nothing synced, the log replays
  const ChunkId a{13, 0}, b{14, 0};
  auto a1 = pattern(1 << 20, 8), a2 = pattern(1 << 20, 9), b1 = pattern(1 << 20, 10);
  for (bool power_loss : {false, true}) {
    SCOPED_TRACE(power_loss ? "power loss" : "crash");
    engine_.reset();
    std::filesystem::remove_all(dir_);
    reopen(o);
    ASSERT_TRUE(engine_->write(a, 0, a1, 1).ok());
    ASSERT_TRUE(engine_->write(a, 0, a2, 1, false, 0, /*durable=*/false).ok());
    ASSERT_TRUE(engine_->write(b, 0, b1, 1, false, 0, /*durable=*/false).ok());
    engine_.reset();
    // The device lost a2's data from its cache; b1's made it.
    if (power_loss) {
      EXPECT_EQ(zeroEveryCopy(dir_, std::vector<uint8_t>(a2.begin(), a2.begin() + 4096)), 1u);
    }
    reopen(o);
    auto m = recordOf(a);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->chunk_version, power_loss ? 1u : 2u);
    EXPECT_EQ(readAll(a, a1.size()), power_loss ? a1 : a2);
    EXPECT_EQ(readAll(b, b1.size()), b1);
    EXPECT_EQ(engine_->usedSlots(m->size_class), 2u) << "a's other slot is free again";
  }
}

// A new slot may hold what it held before (here: a removed chunk's bytes
// with their own valid CRCs). A power loss that drops a write's bytes and
// CRCs from the device's cache but keeps its log record must not let the
// record pass for them: its crcs_crc pins the CRC entries it wrote.
TEST_P(ChunkEngineLogTest, ReplayDropsAWriteWhoseSlotStillHoldsWhatItHeldBefore) {
  ChunkEngineOptions o = options();
  o.sync_interval_ms = 600000;
  o.flush_at_close = false;  // closing is a crash: nothing synced, the log replays
  reopen(o);
  const ChunkId removed_id{21, 0}, id{22, 0};
  auto removed = pattern(256 << 10, 30), lost = pattern(256 << 10, 31);
  ASSERT_TRUE(engine_->write(removed_id, 0, removed, 1).ok());
  auto was = recordOf(removed_id);
  ASSERT_TRUE(was);
  ASSERT_TRUE(engine_->remove(removed_id).ok());
  ASSERT_TRUE(engine_->sync().ok());
  // What the slot holds on disk now: the removed chunk's bytes and CRCs.
  const std::string file = groupFileOf(*was);
  const off_t at = static_cast<off_t>(was->addr.slot * slotStride(was->size_class));
  std::vector<uint8_t> before(slotStride(was->size_class));
  int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << file;
  ASSERT_EQ(::pread(fd, before.data(), before.size(), at), static_cast<ssize_t>(before.size()));
  ::close(fd);
  ASSERT_TRUE(engine_->write(id, 0, lost, 1, false, 0, /*durable=*/false).ok());
  auto m = recordOf(id);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->addr, was->addr) << "the write reuses the removed chunk's slot";
  ASSERT_TRUE(m->crcs_crc);
  engine_.reset();
  // The power loss: the device's cache never wrote the new bytes or CRCs.
  fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, before.data(), before.size(), at), static_cast<ssize_t>(before.size()));
  ::close(fd);
  reopen(o);
  EXPECT_FALSE(recordOf(id)) << "the removed chunk's bytes passed for the lost write";
  std::vector<uint8_t> out(lost.size());
  EXPECT_EQ(engine_->read(id, 0, out).code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine_->usedSlots(was->size_class), 0u);
}

// Each kind of change computes its record's crcs_crc (a whole write, an
// append in place that extends the previous one, a shrink within the class
// that reads the entries it keeps): a crash after each replays its record
// unvouched, checks it against the disk and keeps it.
TEST_P(ChunkEngineLogTest, EveryChangeRecordsTheCrcOfItsCrcEntries) {
  ChunkEngineOptions o = options();
  o.sync_interval_ms = 600000;
  o.flush_at_close = false;
  reopen(o);
  const ChunkId id{23, 0};
  std::vector<uint8_t> want = pattern(100 << 10, 40);
  auto step = [&](const char* what, auto change) {
    SCOPED_TRACE(what);
    ASSERT_TRUE(change().ok());
    auto m = recordOf(id);
    ASSERT_TRUE(m && m->crcs_crc);
    engine_.reset();
    reopen(o);
    auto back = recordOf(id);
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, *m) << "replay dropped it";
    EXPECT_EQ(readAll(id, want.size()), want);
  };
  step("write", [&] { return engine_->write(id, 0, want, 1, false, 0, false).status(); });
  auto more = pattern(90 << 10, 41);
  step("append in place", [&] {
    want.insert(want.end(), more.begin(), more.end());
    return engine_->write(id, 100 << 10, more, 1, false, 0, false).status();
  });
  step("shrink within the class", [&] {
    want.resize(150 << 10);
    return engine_->truncate(id, 150 << 10, 1).status();
  });
  step("append after the shrink", [&] {
    want.insert(want.end(), more.begin(), more.begin() + 5000);
    return engine_->write(id, 150 << 10, std::span(more.data(), 5000), 1, false, 0, false).status();
  });
}

TEST_P(ChunkEngineLogTest, ReplayKeepsAnUnacknowledgedWriteWhoseDataIsOnDisk) {
  const ChunkId id{7, 0};
  auto before = pattern(1 << 20, 1), after = pattern(1 << 20, 2);
  ASSERT_TRUE(engine_->write(id, 0, before, 1).ok());
  EXPECT_FALSE(writeWithFailedSync(id, 0, after).ok());
  reopen();
  auto m = recordOf(id);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->chunk_version, 2u);
  EXPECT_EQ(readAll(id, after.size()), after);
  // Replayed, then flushed: a second reopen reads the same.
  reopen();
  EXPECT_EQ(readAll(id, after.size()), after);
}

// Each log record names the version up to which every batch was durable
// when it was written: replay trusts those records without reading their
// data. An acknowledged write whose data went bad afterwards is reported as
// a checksum mismatch, never rolled back to its previous version.
TEST_P(ChunkEngineLogTest, ReplayTrustsRecordsThatALaterRecordVouchesFor) {
  ChunkEngineOptions o = options();
  o.flush_at_close = false;
  reopen(o);
  const ChunkId x{7, 0}, y{8, 0};
  auto v1 = pattern(1 << 20, 1), v2 = pattern(1 << 20, 2), other = pattern(1 << 20, 3);
  ASSERT_TRUE(engine_->write(x, 0, v1, 1).ok());
  ASSERT_TRUE(engine_->write(x, 0, v2, 1).ok());
  ASSERT_TRUE(engine_->write(y, 0, other, 1).ok());  // its record vouches for x's
  engine_.reset();  // no flush: the next open replays all three records
  EXPECT_EQ(zeroEveryCopy(dir_, std::vector<uint8_t>(v2.begin(), v2.begin() + 4096)), 1u);
  reopen();
  auto m = recordOf(x);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->chunk_version, 2u);
  std::vector<uint8_t> out(v2.size());
  EXPECT_EQ(engine_->read(x, 0, out).code(), ErrorCode::kCorruption);
  EXPECT_EQ(readAll(y, other.size()), other);
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

INSTANTIATE_TEST_SUITE_P(IoEngines, ChunkEngineTest,
                         ::testing::Values("io_uring", "psync", "psync_wal"),
                         [](const auto& info) { return info.param; });

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
