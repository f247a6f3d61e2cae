// The chunk engine's metadata log: what replay keeps and drops after a
// crash or a power loss (data that never reached the disk, slots that still
// hold their old bytes), and the syncs of unsynced writes.
#include "storage/chunk_engine_test_util.h"

namespace cistern::storage {
namespace {

using namespace test_util;

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

}  // namespace
}  // namespace cistern::storage
