// The commit log on its own: record and batch encoding, replay after reopen,
// torn and corrupt records, gaps, epochs, segment reuse and backpressure.
#include "kv/commit_log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "common/fault.h"
#include "kv/kv_test_util.h"

namespace cistern::kv {
namespace {

WriteBatch batchOf(const std::string& tag) {
  return {{WriteOp::kSet, "k/" + tag, "v/" + tag},
          {WriteOp::kClear, "gone", ""},
          {WriteOp::kClearRange, "a", "b"},
          {WriteOp::kAdd, "counter", std::string("\x01\0\0\0\0\0\0\0", 8)}};
}

struct Replayed {
  uint64_t first, last;
  std::string tag;  // the key of the first op
};

// Runs with buffered and with O_DIRECT record writes.
class CommitLogTest : public ::testing::TestWithParam<bool> {
 protected:
  CommitLogOptions opts() const {
    CommitLogOptions o;
    o.dir = dir_.path() + "/log";
    o.segment_bytes = seg_bytes_;
    o.segments_max = 4;
    o.direct_io = GetParam();
    o.lazy_sync_ms = lazy_sync_ms_;
    return o;
  }

  // Opens the log, collecting what it replays after `persisted`, and starts
  // a new epoch whose checkpoints report `checkpointed_`.
  std::unique_ptr<CommitLog> open(uint64_t persisted, std::vector<Replayed>* out = nullptr,
                                  uint64_t* last = nullptr) {
    uint64_t l = 0;
    std::vector<Replayed> seen;
    auto log = CommitLog::open(
        opts(), persisted,
        [&](const LogRecord& r, const WriteBatch& b) {
          EXPECT_EQ(b.size(), 4u);
          seen.push_back({r.first, r.last, b.empty() ? "" : b[0].key});
          return Status::OK();
        },
        &l);
    EXPECT_TRUE(log.ok()) << log.status().toString();
    if (!log.ok()) return nullptr;
    EXPECT_TRUE(
        (*log)->start(l + 1, [this]() -> Result<uint64_t> { return checkpointed_.load(); }).ok());
    if (out) *out = seen;
    if (last) *last = l;
    return std::move(log).value();
  }

  void append(CommitLog& log, uint64_t first, uint64_t last, const std::string& tag) {
    Status s = log.append(first, last, encodeLogBatch(batchOf(tag)), true);
    ASSERT_TRUE(s.ok()) << "version " << first << ": " << s.toString();
  }

  std::string segment(int id) const {
    char name[16];
    std::snprintf(name, sizeof name, "/%06d.log", id);
    return opts().dir + name;
  }

  // Offsets of the records in a segment, in order (the test's own walk).
  std::vector<uint64_t> recordOffsets(int id) const {
    std::string bytes(std::filesystem::file_size(segment(id)), '\0');
    int fd = ::open(segment(id).c_str(), O_RDONLY);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::pread(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
    std::vector<uint64_t> out;
    uint64_t off = kLogSegmentHeaderBytes;
    for (;;) {
      auto r = decodeLogRecord(std::string_view(bytes).substr(off));
      if (!r.ok()) break;
      out.push_back(off);
      off += r->bytes;
    }
    return out;
  }

  void flipByte(int id, uint64_t off) const {
    int fd = ::open(segment(id).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char c;
    ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(off)), 1);
    c ^= 0x40;
    ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(off)), 1);
    ::close(fd);
  }

  TempDir dir_;
  uint64_t seg_bytes_ = 64 << 10;
  uint32_t lazy_sync_ms_ = 60'000;
  std::atomic<uint64_t> checkpointed_{0};
};

TEST(CommitLogFormat, BatchRoundTripsEveryKindOfOp) {
  WriteBatch b = batchOf("x");
  b.push_back({WriteOp::kSet, std::string("\0\xff", 2), std::string(70000, 'v')});
  auto d = decodeLogBatch(encodeLogBatch(b));
  ASSERT_TRUE(d.ok()) << d.status().toString();
  ASSERT_EQ(d->size(), b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ((*d)[i].kind, b[i].kind);
    EXPECT_EQ((*d)[i].key, b[i].key);
    EXPECT_EQ((*d)[i].value, b[i].value);
  }
  EXPECT_TRUE(decodeLogBatch(encodeLogBatch({}))->empty());
}

TEST(CommitLogFormat, MalformedBatchesAreCorruption) {
  std::string good = encodeLogBatch(batchOf("x"));
  EXPECT_EQ(decodeLogBatch("").code(), ErrorCode::kCorruption);
  EXPECT_EQ(decodeLogBatch(good.substr(0, good.size() - 1)).code(), ErrorCode::kCorruption);
  EXPECT_EQ(decodeLogBatch(good + "x").code(), ErrorCode::kCorruption);
  std::string bad_kind = good;
  bad_kind[4] = 9;  // the first op's kind
  EXPECT_EQ(decodeLogBatch(bad_kind).code(), ErrorCode::kCorruption);
  std::string huge_count = good;
  huge_count[3] = '\x7f';
  EXPECT_EQ(decodeLogBatch(huge_count).code(), ErrorCode::kCorruption);
}

TEST(CommitLogFormat, RecordsDetectEveryFlippedByteAndTruncation) {
  std::string r = encodeLogRecord(3, 10, 12, "payload bytes");
  std::string with_more = r + "trailing";  // the payload views these bytes
  auto d = decodeLogRecord(with_more);
  ASSERT_TRUE(d.ok()) << d.status().toString();
  EXPECT_EQ(d->epoch, 3u);
  EXPECT_EQ(d->first, 10u);
  EXPECT_EQ(d->last, 12u);
  EXPECT_EQ(d->payload, "payload bytes");
  EXPECT_EQ(d->bytes, r.size());
  for (size_t i = 0; i < r.size(); ++i) {
    std::string bad = r;
    bad[i] ^= 0x01;
    EXPECT_FALSE(decodeLogRecord(bad).ok()) << "flipped byte " << i;
  }
  for (size_t n = 0; n < r.size(); ++n) EXPECT_FALSE(decodeLogRecord(r.substr(0, n)).ok()) << n;
  EXPECT_FALSE(decodeLogRecord(encodeLogRecord(1, 5, 4, "")).ok());  // last < first
  EXPECT_FALSE(decodeLogRecord(std::string(64, '\0')).ok());
}

TEST_P(CommitLogTest, ReopenReplaysWhatFollowsThePersistedVersionInOrder) {
  {
    auto log = open(0);
    ASSERT_TRUE(log);
    append(*log, 1, 1, "a");
    append(*log, 2, 4, "b");
    append(*log, 5, 5, "c");
  }
  std::vector<Replayed> got;
  uint64_t last = 0;
  auto log = open(0, &got, &last);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].first, 1u);
  EXPECT_EQ(got[1].first, 2u);
  EXPECT_EQ(got[1].last, 4u);
  EXPECT_EQ(got[2].tag, "k/c");
  EXPECT_EQ(last, 5u);
  log.reset();

  // What the store already holds is skipped.
  auto again = open(4, &got, &last);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, 5u);
  EXPECT_EQ(last, 5u);
}

TEST_P(CommitLogTest, ATornRecordEndsTheReplayEvenIfLaterOnesAreIntact) {
  {
    auto log = open(0);
    for (uint64_t v = 1; v <= 4; ++v) append(*log, v, v, std::to_string(v));
  }
  auto offs = recordOffsets(0);
  ASSERT_EQ(offs.size(), 4u);
  flipByte(0, offs[1] + kLogRecordHeaderBytes + 3);  // version 2's payload
  std::vector<Replayed> got;
  uint64_t last = 0;
  auto log = open(0, &got, &last);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].tag, "k/1");
  EXPECT_EQ(last, 1u);
}

TEST_P(CommitLogTest, AGapInVersionsEndsTheReplay) {
  // Version 2's record never made it: the records after it were not acknowledged.
  {
    auto log = open(0);
    append(*log, 1, 1, "1");
    append(*log, 2, 2, "2");
    append(*log, 3, 3, "3");
  }
  auto offs = recordOffsets(0);
  // Rewrite version 2's record in place as a record of version 7, valid on its own.
  {
    std::string bytes(offs[2] - offs[1], '\0');
    int fd = ::open(segment(0).c_str(), O_RDWR);
    ASSERT_EQ(::pread(fd, bytes.data(), bytes.size(), static_cast<off_t>(offs[1])),
              static_cast<ssize_t>(bytes.size()));
    auto rec = decodeLogRecord(bytes);
    ASSERT_TRUE(rec.ok());
    std::string moved = encodeLogRecord(rec->epoch, 7, 7, rec->payload);
    ASSERT_EQ(moved.size(), bytes.size());
    ASSERT_EQ(::pwrite(fd, moved.data(), moved.size(), static_cast<off_t>(offs[1])),
              static_cast<ssize_t>(moved.size()));
    ::close(fd);
  }
  std::vector<Replayed> got;
  auto log = open(0, &got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, 1u);
}

TEST_P(CommitLogTest, UnacknowledgedRecordsOfAnEarlierRunNeverComeBack) {
  // Run 1 writes versions 1..4 and "crashes" with version 2 torn: 3 and 4 are
  // on disk but were never acknowledged.
  {
    auto log = open(0);
    for (uint64_t v = 1; v <= 4; ++v) append(*log, v, v, "old" + std::to_string(v));
  }
  auto offs = recordOffsets(0);
  flipByte(0, offs[1] + kLogRecordHeaderBytes);
  // Run 2 replays version 1 only, and commits versions 2..3 anew.
  std::vector<Replayed> got;
  uint64_t last = 0;
  {
    auto log = open(0, &got, &last);
    ASSERT_EQ(got.size(), 1u);
    ASSERT_EQ(last, 1u);
    append(*log, 2, 2, "new2");
    append(*log, 3, 3, "new3");
  }
  // Run 3 (the store kept only version 1) replays run 2's versions, never
  // run 1's leftovers with the same numbers.
  auto log = open(1, &got, &last);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].tag, "k/new2");
  EXPECT_EQ(got[1].tag, "k/new3");
  EXPECT_EQ(last, 3u);
}

TEST_P(CommitLogTest, SegmentsAreReusedOnceACheckpointCoversThem) {
  uint64_t v = 0;
  {
    auto log = open(0);
    // ~200 bytes a record, 64 KiB segments: 1,000 records cross several
    // segments and would need many more than the 4 allowed without reuse.
    for (int i = 0; i < 1000; ++i) {
      ++v;
      append(*log, v, v, std::to_string(v));
      checkpointed_ = v;  // the store persists everything at once
    }
    EXPECT_LE(log->segmentCount(), 4u);
    EXPECT_GT(log->checkpoints(), 0u);
  }
  // The store holds up to 990: exactly the last 10 are replayed, from
  // whichever reused segments hold them.
  std::vector<Replayed> got;
  uint64_t last = 0;
  auto log = open(990, &got, &last);
  ASSERT_EQ(got.size(), 10u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].first, 991 + i);
  EXPECT_EQ(last, 1000u);
}

TEST_P(CommitLogTest, AppendsWaitForACheckpointWhenEverySegmentIsInUse) {
  auto log = open(0);
  // Four 64 KiB segments hold ~1,700 of these records; no checkpoint covers
  // any of them, so the writer must stop before 3,000.
  std::atomic<uint64_t> written{0};
  std::thread writer([&] {
    for (uint64_t v = 1; v <= 3000; ++v) {
      append(*log, v, v, std::to_string(v));
      written = v;
    }
  });
  // Wait for the writer to run out of segments (however slow the disk is),
  // then check that it stays stopped.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (log->spaceWaits() == 0 && written.load() < 3000 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  uint64_t stalled_at = written.load();
  EXPECT_GT(log->spaceWaits(), 0u);
  EXPECT_LT(stalled_at, 3000u) << "appends went past the segment limit";
  EXPECT_GT(stalled_at, 1000u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(written.load(), stalled_at) << "appends went on without a checkpoint";
  EXPECT_LE(log->segmentCount(), 4u);
  checkpointed_ = 1u << 30;  // the store caught up
  writer.join();
  EXPECT_EQ(written.load(), 3000u);
  EXPECT_LE(log->segmentCount(), 4u);
}

TEST_P(CommitLogTest, OverlappingAppendsTakeTurnsInVersionOrder) {
  auto log = open(0);
  constexpr int kThreads = 4, kEach = 50;
  std::vector<std::thread> ts;
  // Thread t appends versions t+1, t+1+kThreads, ... and each append waits
  // for its predecessor's turn.
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        uint64_t ver = static_cast<uint64_t>(i * kThreads + t + 1);
        EXPECT_TRUE(log->append(ver, ver, encodeLogBatch(batchOf(std::to_string(ver))), true).ok());
      }
    });
  }
  for (auto& th : ts) th.join();
  log.reset();
  std::vector<Replayed> got;
  auto again = open(0, &got);
  ASSERT_EQ(got.size(), static_cast<size_t>(kThreads * kEach));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tag, "k/" + std::to_string(i + 1));
}

TEST_P(CommitLogTest, AFailureIsStickyAndReleasesWaitingAppends) {
  auto log = open(0);
  append(*log, 1, 1, "1");
  // Version 3 waits for version 2's turn, which never comes.
  Status waiting;
  std::thread t([&] { waiting = log->append(3, 3, encodeLogBatch(batchOf("3")), true); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  log->fail(Status(ErrorCode::kIOError, "the engine gave up"));
  t.join();
  EXPECT_EQ(waiting.code(), ErrorCode::kIOError);
  EXPECT_EQ(log->append(2, 2, encodeLogBatch(batchOf("2")), true).code(), ErrorCode::kIOError);
}

TEST_P(CommitLogTest, ABatchLargerThanASegmentIsRefused) {
  auto log = open(0);
  std::string big(opts().segment_bytes, 'x');
  EXPECT_EQ(log->append(1, 1, big, true).code(), ErrorCode::kTxnTooLarge);
}

TEST_P(CommitLogTest, BadOptionsAndUnusableDirectoriesAreClearErrors) {
  CommitLogOptions o = opts();
  o.segment_bytes = 1000;
  uint64_t last;
  auto r = CommitLog::open(o, 0, nullptr, &last);
  EXPECT_EQ(r.code(), ErrorCode::kConfigInvalid);
  o = opts();
  o.dir = "/proc/cistern-no-such/log";
  r = CommitLog::open(o, 0, nullptr, &last);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(o.dir), std::string::npos) << r.status().toString();
}

TEST_P(CommitLogTest, SegmentsOfAnotherSizeAreReplayedThenRemoved) {
  {
    auto log = open(0);
    append(*log, 1, 1, "1");
    append(*log, 2, 2, "2");
  }
  // The segment size changes; leftovers of an unfinished creation lie around.
  seg_bytes_ = 128 << 10;
  std::FILE* f = std::fopen((opts().dir + "/000009.log.tmp").c_str(), "w");
  std::fclose(f);
  f = std::fopen((opts().dir + "/000008.log").c_str(), "w");
  std::fputs("short", f);
  std::fclose(f);
  std::vector<Replayed> got;
  auto log = open(0, &got);
  ASSERT_TRUE(log);
  EXPECT_EQ(got.size(), 2u);
  EXPECT_FALSE(std::filesystem::exists(opts().dir + "/000009.log.tmp"));
  EXPECT_FALSE(std::filesystem::exists(opts().dir + "/000008.log"));
  EXPECT_FALSE(std::filesystem::exists(segment(0)));  // the 64 KiB one
  append(*log, 3, 3, "3");
  for (const auto& e : std::filesystem::directory_iterator(opts().dir)) {
    if (e.path().extension() == ".tmp") continue;  // a spare being made
    EXPECT_EQ(e.file_size(), 128u << 10) << e.path();
  }
}

TEST_P(CommitLogTest, RecordsOfEverySizeAcrossBlockBoundariesAllComeBack) {
  // Direct writes rewrite the block holding the previous record's end; sizes
  // from tiny to several blocks put record ends at every offset in a block.
  seg_bytes_ = 1 << 20;
  std::vector<std::string> values;
  {
    auto log = open(0);
    ASSERT_TRUE(log);
    for (uint64_t v = 1; v <= 120; ++v) {
      values.emplace_back((v * 379) % 9000 + 1, static_cast<char>('a' + v % 26));
      WriteBatch b{{WriteOp::kSet, "k" + std::to_string(v), values.back()}};
      ASSERT_TRUE(log->append(v, v, encodeLogBatch(b), true).ok());
    }
  }
  std::vector<std::string> got;
  uint64_t last = 0;
  auto log = CommitLog::open(
      opts(), 0,
      [&](const LogRecord& r, const WriteBatch& b) {
        EXPECT_EQ(r.first, got.size() + 1);
        EXPECT_EQ(b.size(), 1u);
        got.push_back(b.empty() ? "" : b[0].value);
        return Status::OK();
      },
      &last);
  ASSERT_TRUE(log.ok()) << log.status().toString();
  EXPECT_EQ(last, 120u);
  ASSERT_EQ(got.size(), values.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], values[i]) << "version " << i + 1;
}

TEST_P(CommitLogTest, AFullDiskWaitsForACheckpointInsteadOfFailing) {
  auto log = open(0);
  ASSERT_TRUE(log);
  append(*log, 1, 1, "1");  // the first segment exists
  // From now on no segment file can be created: the spare made at half a
  // segment fails (once, not in a loop), and when the active segment fills
  // the append waits for the checkpoint to free it and reuses it.
  fault::Spec full;
  full.code = ErrorCode::kNoSpace;
  fault::enable("kv.log.create_segment", full);
  checkpointed_ = 1u << 30;  // the store persists everything
  // ~200 bytes a record, 64 KiB segments: 1,000 records fill several.
  for (uint64_t v = 2; v <= 1000; ++v) append(*log, v, v, std::to_string(v));
  uint64_t attempts = fault::fired("kv.log.create_segment");
  EXPECT_GE(attempts, 1u);
  EXPECT_LE(attempts, 20u) << "segment creation retried in a loop";
  EXPECT_EQ(log->segmentCount(), 1u);
  EXPECT_GT(log->checkpoints(), 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(fault::fired("kv.log.create_segment"), attempts) << "retried while idle";
  fault::disableAll();
  log.reset();
  std::vector<Replayed> got;
  uint64_t last = 0;
  auto again = open(990, &got, &last);
  ASSERT_EQ(got.size(), 10u);
  EXPECT_EQ(got.front().first, 991u);
  EXPECT_EQ(last, 1000u);
}

TEST_P(CommitLogTest, AFullDiskBeforeTheFirstSegmentFailsTheAppend) {
  auto log = open(0);
  ASSERT_TRUE(log);
  fault::Spec full;
  full.code = ErrorCode::kNoSpace;
  fault::enable("kv.log.create_segment", full);
  EXPECT_EQ(log->append(1, 1, encodeLogBatch(batchOf("1")), true).code(), ErrorCode::kNoSpace);
  fault::disableAll();
}

TEST(CommitLogDirect, AFileSystemWithoutODirectFallsBackToBufferedWrites) {
  TempDir dir;
  CommitLogOptions o;
  o.dir = dir.path() + "/log";
  o.segment_bytes = 64 << 10;
  o.direct_io = true;
  fault::enable("kv.log.open_direct", {});  // open(O_DIRECT) fails with EINVAL
  uint64_t last = 0;
  {
    auto log = CommitLog::open(o, 0, nullptr, &last);
    ASSERT_TRUE(log.ok()) << log.status().toString();
    ASSERT_TRUE((*log)->start(1, [] { return Result<uint64_t>(0); }).ok());
    for (uint64_t v = 1; v <= 3; ++v)
      ASSERT_TRUE((*log)->append(v, v, encodeLogBatch(batchOf(std::to_string(v))), true).ok());
  }
  EXPECT_EQ(fault::fired("kv.log.open_direct"), 1u);
  fault::disableAll();
  int replayed = 0;
  auto log = CommitLog::open(
      o, 0,
      [&](const LogRecord&, const WriteBatch&) {
        ++replayed;
        return Status::OK();
      },
      &last);
  ASSERT_TRUE(log.ok()) << log.status().toString();
  EXPECT_EQ(replayed, 3);
  EXPECT_EQ(last, 3u);
}

// Unsynced records: sync() and a synced append behind them make them
// durable (one fdatasync round each), a synced append with none pending
// needs no round, and records of both kinds, interleaved in one segment and
// across block boundaries (page-cache and O_DIRECT writes of the same
// blocks), all come back on reopen.
TEST_P(CommitLogTest, UnsyncedRecordsAreSyncedOnRequestAndComeBack) {
  seg_bytes_ = 256 << 10;
  std::vector<std::string> tags;
  {
    auto log = open(0);
    auto put = [&](uint64_t v, bool sync) {
      tags.push_back(std::string(1 + (v * 977) % 3000, static_cast<char>('a' + v % 26)));
      ASSERT_TRUE(log->append(v, v, encodeLogBatch(batchOf(tags.back())), sync).ok()) << v;
    };
    put(1, false);
    put(2, false);
    EXPECT_EQ(log->lazySyncs(), 0u);
    ASSERT_TRUE(log->sync().ok());
    EXPECT_EQ(log->lazySyncs(), 1u);
    ASSERT_TRUE(log->sync().ok());  // nothing new: no round
    EXPECT_EQ(log->lazySyncs(), 1u);
    put(3, false);
    put(4, true);  // behind an unsynced one: synced with it
    EXPECT_EQ(log->lazySyncs(), 2u);
    put(5, true);  // nothing unsynced before it
    EXPECT_EQ(log->lazySyncs(), 2u);
    for (uint64_t v = 6; v <= 120; ++v) put(v, v % 3 == 0);
    if (::testing::Test::HasFailure()) return;
  }
  std::vector<Replayed> got;
  uint64_t last = 0;
  auto log = open(0, &got, &last);
  EXPECT_EQ(last, 120u);
  ASSERT_EQ(got.size(), 120u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tag, "k/" + tags[i]) << i;
}

// Nobody asks: the checkpoint thread syncs within lazy_sync_ms.
TEST_P(CommitLogTest, UnsyncedRecordsAreSyncedInTheBackground) {
  lazy_sync_ms_ = 20;
  auto log = open(0);
  ASSERT_TRUE(log->append(1, 1, encodeLogBatch(batchOf("1")), false).ok());
  for (int i = 0; i < 500 && log->lazySyncs() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(log->lazySyncs(), 1u);
  // Once synced, the thread waits for the next unsynced record.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(log->lazySyncs(), 1u);
}

// Overlapping appends: a sync covers only records whose writes finished,
// and a synced append behind unsynced ones waits for them.
TEST_P(CommitLogTest, ASyncedAppendBehindOverlappingUnsyncedOnesWaitsForThem) {
  auto log = open(0);
  constexpr int kThreads = 4, kEach = 40;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        uint64_t ver = static_cast<uint64_t>(i * kThreads + t + 1);
        EXPECT_TRUE(
            log->append(ver, ver, encodeLogBatch(batchOf(std::to_string(ver))), ver % 5 == 0).ok());
        if (ver % 7 == 0) {
          EXPECT_TRUE(log->sync().ok());
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_GT(log->lazySyncs(), 0u);
  log.reset();
  std::vector<Replayed> got;
  auto again = open(0, &got);
  ASSERT_EQ(got.size(), static_cast<size_t>(kThreads * kEach));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].tag, "k/" + std::to_string(i + 1));
}

// A failed fdatasync is never retried: the log fails, and so does every
// later append and sync.
TEST_P(CommitLogTest, AFailedSyncOfUnsyncedRecordsFailsTheLog) {
  auto log = open(0);
  ASSERT_TRUE(log->append(1, 1, encodeLogBatch(batchOf("1")), false).ok());
  fault::enable("kv.log.lazy_sync", {});
  Status s = log->append(2, 2, encodeLogBatch(batchOf("2")), true);
  fault::disableAll();
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(log->sync().ok());
  EXPECT_EQ(log->append(3, 3, encodeLogBatch(batchOf("3")), false).code(), s.code());
}

// kv.log.unsynced_in_memory stands for a power loss: a process that dies
// (here a child that _exits) loses the unsynced records after the last
// sync, and replay ends at that gap; a synced record behind unsynced ones
// brings them all.
TEST_P(CommitLogTest, UnsyncedRecordsHeldInMemoryAreLostAtACrashAfterTheLastSync) {
  auto run = [&](const std::vector<std::pair<uint64_t, bool>>& appends, bool sync_at_3) {
    pid_t pid = ::fork();
    if (pid == 0) {
      fault::enable("kv.log.unsynced_in_memory", {});
      uint64_t l = 0;
      auto log = CommitLog::open(opts(), 0, nullptr, &l);
      if (!log.ok() || !(*log)->start(l + 1, [] { return Result<uint64_t>(0); }).ok()) _exit(2);
      for (auto [v, sync] : appends) {
        if (!(*log)->append(v, v, encodeLogBatch(batchOf(std::to_string(v))), sync).ok()) _exit(3);
        if (v == 3 && sync_at_3 && !(*log)->sync().ok()) _exit(4);
      }
      _exit(0);  // no destructor: what is held is lost
    }
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  };
  run({{1, false}, {2, false}, {3, false}, {4, false}, {5, false}}, /*sync_at_3=*/true);
  uint64_t last = 0;
  std::vector<Replayed> got;
  open(0, &got, &last).reset();
  EXPECT_EQ(last, 3u);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2].tag, "k/3");

  std::filesystem::remove_all(opts().dir);
  run({{1, false}, {2, false}, {3, true}, {4, false}}, false);
  open(0, &got, &last).reset();
  EXPECT_EQ(last, 3u);
  EXPECT_EQ(got.size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Writes, CommitLogTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "direct" : "buffered";
                         });

}  // namespace
}  // namespace cistern::kv
