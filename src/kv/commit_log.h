// The redo log under LoggedRocks (logged_rocks.h): the KV's RocksDB store and
// the chunk engine's metadata reach it through that component.
//
// RocksDB's own WAL appends to a growing file, so every synced commit costs a
// data write plus an ext4 journal commit for the new file size (~180 µs
// here), and RocksDB waits for one sync before it starts the next. This log
// instead overwrites segment files that were zero-filled when created, so an
// O_DSYNC write is one device write with FUA (or a write and a cache flush),
// with O_DIRECT when `direct_io` (the default of rocks_store.cc for synced
// commits). RocksDB itself runs with
// its WAL disabled; every batch also stores its version in the database, and
// after a crash the records past that version are replayed.
//
// Layout of `dir`: segment files `NNNNNN.log` of `segment_bytes` each.
//   segment header (first 4 KiB): u32 magic "CSEG", u32 crc32c of the next
//     24 bytes, u64 generation, u64 epoch, u64 segment bytes
//   records from offset 4096, back to back (little-endian):
//     u32 magic "CREC", u32 crc32c of everything after it (header rest and
//     payload), u64 epoch, u64 first version, u64 last version,
//     u32 payload bytes, u32 reserved (0), payload (encodeLogBatch)
// An epoch is one run of the process; generations order the segments. On
// open, only segments of the newest epoch are read, in generation order;
// records up to the store's persisted version are skipped, the next one must
// start at persisted + 1, and the scan stops at the first gap (a batch that
// was never acknowledged: its successors were not either). A record must
// carry its segment's epoch, so leftovers of an earlier run inside a reused
// segment are never read as new. After replay the store is flushed and a new
// epoch starts: nothing written before is needed again.
//
// A segment of another size than configured is replayed, then removed.
// Space: a sealed segment is reused once a checkpoint (a RocksDB flush)
// covers its last version. At most `segments_max` segments exist; an append
// that finds none free waits for the checkpoint thread (backpressure), also
// when a new segment cannot be created for lack of space (kNoSpace) while a
// sealed one exists. Without any segment to wait for, kNoSpace fails the log.
//
// Unsynced records (append with `sync` false): written to the page cache
// (whole blocks, in direct mode), so a process crash keeps them and a power
// loss may not. sync() makes every record appended before it durable (one
// fdatasync per segment written since the last); so does a synced append
// that follows unsynced ones (its record written as they were, then the
// sync: it is durable only with all of them, since replay stops at the first
// gap); and the checkpoint thread does within `lazy_sync_ms` of the first
// unsynced record. What a crash keeps is always a prefix of the versions.
// The fault point kv.log.unsynced_in_memory (tests) keeps unsynced records
// in memory until the next sync writes them: a SIGKILL then loses what a
// power loss would.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/result.h"
#include "kv/store.h"

namespace cistern::kv {

struct CommitLogOptions {
  std::string dir;
  uint64_t segment_bytes = 16ull << 20;
  uint32_t segments_max = 16;
  // Records are written with O_DIRECT in whole 4 KiB blocks: the block that
  // holds the end of the previous record is written again, with the same
  // bytes, ahead of the new record, so appends take turns (one write at a
  // time). This skips the page cache and ext4's writeback work on every
  // commit. Where the file system refuses O_DIRECT (tmpfs) the log falls back
  // to buffered writes.
  bool direct_io = false;
  // Unsynced records are made durable this long after the first of them at
  // the latest. Default: 1,000 ms.
  uint32_t lazy_sync_ms = 1000;
};

// The bytes of one batch in a record (kAdd deltas included: replay folds them
// against the recovered state, as the commit leader did).
std::string encodeLogBatch(const WriteBatch& batch);
// kCorruption when `bytes` is not exactly one encoded batch.
Result<WriteBatch> decodeLogBatch(std::string_view bytes);

struct LogRecord {
  uint64_t epoch = 0;
  uint64_t first = 0;  // versions [first, last]
  uint64_t last = 0;
  std::string_view payload;
  size_t bytes = 0;  // header + payload
};
constexpr size_t kLogRecordHeaderBytes = 40;
constexpr size_t kLogSegmentHeaderBytes = 4096;
std::string encodeLogRecord(uint64_t epoch, uint64_t first, uint64_t last,
                            std::string_view payload);
// Decodes the record at the start of `bytes` (the payload views `bytes`).
// kCorruption when no whole, intact record is there.
Result<LogRecord> decodeLogRecord(std::string_view bytes);

struct HeldWrite {
  int fd;
  uint64_t off;
  std::string bytes;
  std::string path;
};

class CommitLog {
 public:
  // Gets each record and its decoded batch (the callee may consume it).
  using Replay = std::function<Status(const LogRecord&, WriteBatch&)>;
  // Persists the store (a RocksDB flush) and returns the last version it holds.
  using Checkpoint = std::function<Result<uint64_t>()>;

  // Opens or creates the log and passes every record after
  // `persisted_version` to `replay`, in order. `*last_version` becomes the
  // last version replayed (or `persisted_version`).
  static Result<std::unique_ptr<CommitLog>> open(const CommitLogOptions& options,
                                                 uint64_t persisted_version, const Replay& replay,
                                                 uint64_t* last_version);
  ~CommitLog();
  CommitLog(const CommitLog&) = delete;
  CommitLog& operator=(const CommitLog&) = delete;

  // Starts a new epoch once everything replayed is persisted: the next
  // append carries `next_version`. Starts the checkpoint thread.
  Status start(uint64_t next_version, Checkpoint checkpoint);

  // Writes the record of versions [first, last]; returns when it is on disk
  // with every record before it (`sync`), or in the page cache (durable at
  // the next sync(), synced append or background sync; see the header
  // comment). Calls for successive batches may overlap:
  // each waits until the previous batch has reserved its space, then writes
  // concurrently with the others. Any failure is sticky (an fsync error is
  // never retried): later appends fail with it.
  Status append(uint64_t first, uint64_t last, std::string_view payload, bool sync);
  // As append, but unsynced when the record goes out with O_DIRECT (synced
  // when the log writes through the page cache): it is on the device when
  // this returns, and the caller's next device cache flush on this file
  // system (an fdatasync of any file on it) makes it durable.
  Status appendToDevice(uint64_t first, uint64_t last, std::string_view payload);

  // Makes every record whose append returned before this call durable.
  // A failed fdatasync fails the log (never retried).
  Status sync();

  // Makes every current and later append fail with `s` (the engine gave up).
  void fail(const Status& s);

  uint32_t segmentCount() const;
  uint64_t checkpoints() const;
  // Times an append found every segment in use and waited for a checkpoint.
  uint64_t spaceWaits() const;
  // fdatasync rounds made for unsynced records (sync(), synced appends after
  // unsynced ones, the background sync).
  uint64_t lazySyncs() const;

 private:
  struct Segment {
    uint32_t id = 0;
    int fd = -1;
    int direct_fd = -1;  // O_DIRECT, for records; opened when first activated
    uint64_t bytes = 0;  // the file's size
    uint64_t generation = 0;
    uint64_t last_version = 0;  // of the records written in the current use
    bool dirty = false;         // holds unsynced records not yet covered by a sync
    enum State { kFree, kActive, kSealed } state = kFree;
  };

  enum class Sync { kNo, kYes, kUnlessDirect };
  Status appendRecord(uint64_t first, uint64_t last, std::string_view payload, Sync sync);

  explicit CommitLog(const CommitLogOptions& options)
      : options_(options), direct_(options.direct_io) {}
  Status scan(uint64_t persisted_version, const Replay& replay, uint64_t* last_version);
  Result<int> createSegmentFile(uint32_t id);             // zero-filled, synced
  Status addSegment(std::unique_lock<std::mutex>& lock);  // REQUIRES: mu_ held
  Status activate(std::unique_lock<std::mutex>& lock);    // REQUIRES: mu_ held
  void checkpointLoop();
  // The O_DIRECT record write of append(); REQUIRES: writing_ set by the caller.
  // With `hold`, the blocks go there instead of to the file.
  Status appendDirect(int fd, uint64_t off, std::string_view record, bool sync,
                      const std::string& path, std::string* hold = nullptr);
  // Writes held_ (in order). REQUIRES: mu_ held, or held_ taken by the caller.
  static Status writeHeld(std::vector<HeldWrite>& held);
  // Makes every version <= `target` durable: waits for earlier appends to
  // finish writing and for a sync in progress, then fdatasyncs the dirty
  // segments outside the lock. REQUIRES: mu_ held.
  Status syncLocked(std::unique_lock<std::mutex>& lock, uint64_t target);

  const CommitLogOptions options_;
  Checkpoint checkpoint_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // turn, space, failure, checkpoint work
  std::vector<Segment> segments_;
  int active_ = -1;
  uint64_t offset_ = 0;  // next record offset in the active segment
  uint64_t next_first_ = 0;
  uint32_t turn_waiters_ = 0;
  uint64_t epoch_ = 0;
  uint64_t generation_ = 0;    // the newest in use
  bool creating_ = false;      // a segment file is being created
  bool spare_failed_ = false;  // since the last activation
  bool stop_ = false;
  uint64_t checkpoints_ = 0;
  uint64_t space_waits_ = 0;
  // Unsynced records: the newest unsynced version appended, every version
  // <= synced_through_ durable, when the oldest unsynced one came (for the
  // background sync), appends reserved and still writing (by first
  // version), a sync running, and the rounds made.
  uint64_t lazy_last_ = 0;
  uint64_t synced_through_ = 0;
  std::chrono::steady_clock::time_point lazy_since_;
  std::set<uint64_t> writing_firsts_;
  bool syncing_ = false;
  uint32_t sync_waiters_ = 0;
  uint64_t lazy_syncs_ = 0;
  // Unsynced writes kept in memory (kv.log.unsynced_in_memory), in order.
  std::vector<HeldWrite> held_;
  Status failed_;
  std::thread thread_;

  // O_DIRECT appends (options_.direct_io and the file system allows it).
  // Owned by the one append in progress (writing_).
  bool direct_ = false;
  bool writing_ = false;
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };
  static constexpr size_t kBlockBufMin = 256 * 1024;
  // Replaces block_buf_ with one of `cap` bytes, keeping the tail; false
  // when the memory cannot be had.
  bool resizeBlockBuf(size_t cap);
  std::unique_ptr<char, FreeDeleter> block_buf_;  // 4 KiB-aligned
  size_t block_cap_ = 0;
  size_t tail_len_ = 0;  // bytes of the active segment's last partial block, at block_buf_
};

}  // namespace cistern::kv
