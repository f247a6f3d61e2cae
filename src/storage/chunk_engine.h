// ChunkEngine: the chunks of one storage target (one disk or directory).
//
// Layout (docs/chunk_format.md): chunk bytes live in fixed-size slots of
// group files, one set of group files per size class
// (`<path>/data/c<class>/g<group>.dat`). A slot holds the chunk's data and,
// after it, a CRC area: the CRC32C of every full 4 KiB block. The CRC of the
// last, partial block is in the chunk's metadata record, in a RocksDB at
// `<path>/meta`. A read verifies only the blocks it touches (a 4 KiB read
// checks one block) and returns kCorruption (CHECKSUM_MISMATCH) and no bytes
// on a mismatch.
//
// Writes: an append that stays in the chunk's size class writes in place past
// the committed length (committed bytes and CRCs are never touched); any other
// write is copy-on-write into a fresh slot. Either way the data is synced,
// then the metadata record is replaced in one synced commit-log record (and
// RocksDB, WAL off; docs/chunk_format.md), then (COW) the old slot is
// released. Writes into 64 KiB (class-0) chunks instead put their bytes into
// that log record and reach the group file unsynced, synced at the next log
// checkpoint ("logged writes"). An unsynced write (write(..., durable =
// false)) skips the sync: it is acknowledged with its data and record on the
// device, made durable by the next sync(), and its old slot is held until
// then. A crash shows the old or the new chunk, never a mix; a slot written
// but not committed is free again after reopen, because the slot bitmaps are
// rebuilt from the metadata. An fsync error puts the engine into a failed,
// read-only state (never retried).
//
// Threads: all methods are thread-safe; writes to one chunk are serialized by
// a striped lock, writes to different chunks run in parallel and are group-
// committed: one fdatasync per touched group file and one synced metadata
// batch for all writes waiting at that moment, the two pipelined.
// Memory: two bits per slot (used, kept), plus a reused scratch buffer of 1 MiB per thread
// that has written or scrubbed; no allocation proportional to a request.
// File descriptors: at most `open_files_max` group files are kept open.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "storage/chunk_meta.h"
#include "storage/io_backend.h"
#include "storage/slot_allocator.h"

namespace rocksdb {
class DB;
}

namespace cistern::storage {
class CrcCache;
class IoBackend;
}  // namespace cistern::storage
namespace cistern::kv {
class LoggedRocks;
}

namespace cistern {
class ConfigBinder;
class GroupCommit;
}  // namespace cistern

namespace cistern::storage {

struct ChunkEngineOptions {
  // Target directory; created if missing.
  std::string path;
  // Wall clock for WriteReq.not_after_unix_ns.
  Clock* clock = &SystemClock::instance();
  // Bytes of one group file (slots per group = max(4, group_bytes / class size)). Default: 256 MiB.
  uint64_t group_bytes = 256ull << 20;
  // Groups per size class; past that writes fail with kNoSpace. Default: 4096.
  uint32_t groups_max = 4096;
  // Group files kept open. Default: 256.
  uint32_t open_files_max = 256;
  // RocksDB block cache of the chunk metadata, index and filter blocks
  // included. Default: 32 MiB.
  uint64_t meta_cache_bytes = 32ull << 20;
  // RocksDB memtable of the chunk metadata (`write_buffer_size`; up to two
  // in memory while one is flushed). A full one is flushed on its own,
  // between the commit log's checkpoints. At least 64 KiB. Default: 64 MiB.
  uint64_t meta_memtable_bytes = 64ull << 20;
  // Pages of the slots' CRC areas kept in memory (storage/crc_cache.h): a
  // read of a few blocks then costs one I/O instead of two. 0 turns it off.
  // Default: 64 MiB.
  uint64_t crc_cache_bytes = 64ull << 20;
  // fdatasync data and sync metadata before a write returns. Default: true.
  bool sync = true;
  // Writes fail with kNoSpace while the filesystem has less than this free,
  // so that the metadata store never meets ENOSPC itself (RocksDB does not
  // recover from a failed WAL write). Default: 64 MiB.
  uint64_t reserved_bytes = 64ull << 20;
  // Read and write data blocks with O_DIRECT where the filesystem supports
  // it (buffered otherwise, e.g. on tmpfs). Default: true.
  bool direct_io = true;
  // "io_uring" (falls back to psync where io_uring cannot be set up) or
  // "psync" (pread/pwrite). Default: io_uring.
  std::string io_engine = "io_uring";
  // Metadata records are made durable in a commit log (kv/commit_log.h,
  // `<path>/meta-log`: pre-zeroed segments overwritten with O_DIRECT + DSYNC)
  // instead of RocksDB's appending WAL; RocksDB runs with its WAL off and is
  // flushed when a segment fills. Segments of `meta_log_segment_bytes`, at
  // most 8. false: RocksDB's WAL with sync. Defaults: true, 4 MiB.
  bool meta_commit_log = true;
  uint64_t meta_log_segment_bytes = 4ull << 20;
  // Writes into chunks of the smallest class (64 KiB: small files, file
  // tails) carry their bytes in the metadata log record and go to the group
  // file through the page cache, unsynced: one shared log write per batch
  // instead of an fdatasync (data plus, for new blocks, an ext4 journal
  // commit) followed by the log write. Group files are synced at each log
  // checkpoint, before RocksDB is flushed; a crash replays the bytes into
  // their slots. A slot freed while its logged bytes may still be replayed
  // is held (not reused) until the next checkpoint; past
  // `logged_held_slots_max` held slots a checkpoint is forced. Needs
  // `meta_commit_log` and `sync`, and segments of at least 548 KiB (a
  // record's logged bytes are capped at a quarter segment, and must hold
  // two whole class-0 slots).
  // Defaults: true, 1024.
  bool log_small_writes = true;
  uint32_t logged_held_slots_max = 1024;
  // Freed slots of classes whose data is written directly (all but logged
  // class 0) keep their disk blocks while the kept slots' bytes stay within
  // this budget: a later write into one needs no block allocation or extent
  // conversion, which on ext4 makes each synced batch commit the journal
  // (docs/chunk_format.md, "Fresh space costs more"). Past the budget a
  // freed slot is punched (its space returns to the filesystem). Counted
  // from the blocks the group files hold when the target opens. Default:
  // 4 GiB.
  uint64_t kept_free_bytes = 4ull << 30;
  // Reads and writes of more than 64 KiB whose memory is not in 2 MiB pages
  // (common/io_memory.h: a caller's buffer, a client's shared memory) go
  // through the engine's own 2 MiB-page buffers and one copy, so that the
  // disk gets one segment per I/O instead of one per 4 KiB page. On this
  // project's virtual disk that reads 1.5-2x faster for a copy of ~0.1
  // CPU-seconds per GiB; where scatter-gather lists are cheap (NVMe on bare
  // metal) false saves the copy. No effect where the kernel's transparent
  // huge pages are off. Default: true.
  bool huge_page_io = true;
  // Closing flushes RocksDB's memtable so that the next open replays
  // nothing. Tests turn it off to reopen as after a crash. Default: true.
  bool flush_at_close = true;
  // Unsynced writes (write(..., durable = false); WriteReq.unsynced): each
  // is acknowledged once its data is on the device and its record applied,
  // and made durable by the next sync() — a client's fsync or close — or
  // by the engine itself within `sync_interval_ms`. A write that would take
  // the bytes waiting for a sync (the data, plus the slots of their
  // chunks' previous versions, held until then) past `unsynced_bytes_max`
  // is synced at once instead. A crash of the process loses none of them
  // (their bytes are in the device or the page cache); a power loss may
  // lose those not yet synced, each chunk then showing its previous
  // version (docs/chunk_format.md, "Unsynced writes"). Without the
  // metadata log or `sync`, or when the log lives on another file system
  // than the data, every write is durable. Defaults: 5000 ms (ext4's
  // journal commit interval, which bounds what its direct writes into new
  // blocks may lose), 1 GiB.
  uint32_t sync_interval_ms = 5000;
  uint64_t unsynced_bytes_max = 1ull << 30;

  // Binds the fields a deployment tunes to `<prefix>.<name>` keys (not the
  // ones that fix the layout on disk, such as group_bytes).
  void bind(ConfigBinder& b, const std::string& prefix);
  // kInvalidArgument naming the field when a value cannot work (an unknown
  // io_engine, no open files or groups). open() checks it too.
  Status validate() const;
};

class ChunkEngine {
 public:
  static Result<std::unique_ptr<ChunkEngine>> open(const ChunkEngineOptions& options);
  ~ChunkEngine();

  // Writes `data` at `offset` of chunk `id`, creating it if needed (bytes
  // before `offset` that were never written read as zeros). Returns the new
  // metadata. kInvalidArgument if the chunk would exceed 64 MiB;
  // kStaleChainVersion if `chain_version` is older than the chunk's.
  // `stable`: the bytes do not change until write() returns (a request's
  // own buffer, not memory a client shares): whole blocks of it at 4 KiB
  // aligned addresses then go to the disk as they are, checksummed and
  // written without a copy. Otherwise they are copied first, so that a
  // change meanwhile cannot make the checksum disagree with the bytes.
  // `not_after_ns` (wall clock, ns since the Unix epoch; 0: none): past it
  // once the chunk is locked, the write is refused with kLeaseExpired and
  // changes nothing (WriteReq.not_after_unix_ns).
  // `durable`: false acknowledges the write before its data and record are
  // synced (ChunkEngineOptions::sync_interval_ms); sync() makes it durable.
  // `*unsynced` (if given) says whether it was: a write that must be
  // durable anyway (a logged class-0 write, one past unsynced_bytes_max,
  // one whose batch synced) is not.
  Result<ChunkMeta> write(ChunkId id, uint64_t offset, std::span<const uint8_t> data,
                          uint64_t chain_version, bool stable = false, int64_t not_after_ns = 0,
                          bool durable = true, bool* unsynced = nullptr, uint32_t chain = 0);
  // Sets the whole content of chunk `id` to `data` and its version to
  // `chunk_version`, durably (copy-on-write, as any write that is not an
  // append): a replica catching up with its predecessor's copy
  // (docs/chain_protocol.md, "Resync"). The chunk records `chain_version`
  // whatever the one it had (the predecessor's copy is the chain's).
  // `durable`: false as in write() (a resync syncs once at its end).
  Result<ChunkMeta> replace(ChunkId id, std::span<const uint8_t> data, uint32_t chain,
                            uint64_t chain_version, uint64_t chunk_version, bool durable = true);
  // Makes every write acknowledged so far durable (one fdatasync per group
  // file unsynced writes went to). An error fails the target, as any
  // failed sync does.
  Status sync();
  // Sets the chunk's length: shorter drops the tail, longer appends zeros.
  // Creates a missing chunk of that length. Returns the new metadata.
  // `chain`: the chain the change is made under (ChunkMeta::chain; 0 on
  // one machine), for write() too.
  Result<ChunkMeta> truncate(ChunkId id, uint64_t length, uint64_t chain_version,
                             int64_t not_after_ns = 0, uint32_t chain = 0);
  // Reads up to out.size() bytes from `offset`; returns the count (short at
  // the end of the chunk, 0 past it). kNotFound for a missing chunk.
  Result<size_t> read(ChunkId id, uint64_t offset, std::span<uint8_t> out);

  // Where a client on this host reads [offset, offset + n) of a chunk itself
  // (a short-circuit read, docs/client.md): the group file, the chunk's
  // place in it, and the CRCs of the blocks the range touches as they are
  // at this call. The caller reads the bytes and must verify them against
  // these CRCs: a slot freed and handed out again after this call holds
  // other bytes, which then fail the check. `crcs` covers the blocks from
  // the one holding `offset` to the one holding the range's last byte
  // within the chunk (none when `offset` is at or past its end); a partial
  // last block's CRC is over its bytes up to the chunk's length.
  struct Location {
    std::string path;  // absolute
    uint64_t dev = 0, ino = 0;
    uint64_t slot_offset = 0;  // the chunk's byte 0 in the file
    uint32_t length = 0;       // the chunk's
    std::vector<uint32_t> crcs;
  };
  struct LocateRange {
    ChunkId id;
    uint64_t offset = 0;
    size_t length = 0;
  };
  // One answer per range, kNotFound for a missing chunk. The CRCs come from
  // the CRC cache, else the disk, all ranges' reads submitted together.
  // `in_memory_only`: nullopt instead of anything that would wait for the
  // disk (a record or CRC page not cached, a group file not open), for a
  // caller on an event loop.
  std::optional<std::vector<Result<Location>>> locate(std::span<const LocateRange> ranges,
                                                      bool in_memory_only = false);

  // A read in two halves, for a caller that waits for the disk on an event
  // loop (StorageService's I/O threads, with an io_uring of their own)
  // instead of blocking a thread on it. startRead() finds the record and
  // the CRCs without blocking and says which I/O to perform; the caller
  // performs it and finishRead() verifies the blocks and copies the bytes
  // out. `a` holds the state and buffers (reuse it: its buffers are
  // allocated once). Only reads of at most kAsyncReadBytesMax whose record
  // is in memory qualify, and none while a fault point is enabled: for the
  // others startRead() returns nullopt and the caller uses read(). Else it
  // returns the byte count the read gives (0: past the end, no I/O) or the
  // error read() would give (kNotFound).
  static constexpr size_t kAsyncReadBytesMax = 64 << 10;
  class AsyncRead {
   public:
    AsyncRead();
    ~AsyncRead();
    // What to perform; results go to finishRead() in the same order.
    std::span<IoRequest> io();

   private:
    friend class ChunkEngine;
    struct State;
    std::unique_ptr<State> s_;
  };
  Result<std::optional<size_t>> startRead(ChunkId id, uint64_t offset, std::span<uint8_t> out,
                                          AsyncRead& a);
  // `results`: bytes transferred or -errno, per request of a.io(). True when
  // the bytes are in `out`; false when the read must be done again with
  // read(): a failed or short transfer, a block that did not verify, or a
  // slot handed out meanwhile and the record no longer naming it (read()
  // sorts out which, and returns the error if there is one).
  bool finishRead(AsyncRead& a, std::span<const int> results);

  Result<std::optional<ChunkMeta>> query(ChunkId id);
  // Removes the chunk; its slot's space returns to the filesystem (punch
  // hole) unless the slot is kept (`kept_free_bytes`). Removing a missing
  // chunk succeeds (GC retries).
  Status remove(ChunkId id, int64_t not_after_ns = 0);  // not_after_ns: as in write()
  // Removes the chunks of `inode` with index >= `first`, at most `limit` of
  // them; returns how many. `*more` says whether others may remain.
  Result<uint32_t> removeFrom(uint64_t inode, uint32_t first, uint32_t limit, bool* more,
                              int64_t not_after_ns = 0);
  // Up to `limit` chunks with id >= `from`, in (inode, index) order.
  Result<std::vector<std::pair<ChunkId, ChunkMeta>>> list(ChunkId from, uint32_t limit);
  // Re-verifies the CRCs of every block of every chunk; returns the ids that
  // fail. `bytes_per_second` > 0 paces the reads (the scrub worker's rate).
  // `stop`, if given, ends the pass early when it becomes true.
  Result<std::vector<ChunkId>> scrub(uint64_t bytes_per_second = 0,
                                     const std::atomic<bool>* stop = nullptr);

  struct ClassSpace {
    uint64_t slot_bytes = 0;  // class size
    uint64_t slots_used = 0;  // holding a chunk
    uint64_t slots_held = 0;  // freed, reusable after the next checkpoint (log_small_writes)
    uint64_t slots_kept = 0;  // free, still holding their disk blocks (kept_free_bytes)
    uint64_t slots_max = 0;   // groups_max * slots per group
    uint64_t data_bytes = 0;  // sum of chunk lengths
  };
  struct Space {
    uint64_t fs_total_bytes = 0;
    uint64_t fs_free_bytes = 0;  // available to this process
    uint64_t reserved_bytes = 0;
    uint64_t chunks = 0;
    uint64_t data_bytes = 0;
    uint64_t kept_bytes = 0;  // slot bytes of free slots that hold disk blocks
    bool failed = false;
    std::array<ClassSpace, kClassCount> classes;
  };
  Space space() const;
  // Slots holding a chunk; heldSlots: freed slots waiting for a checkpoint.
  uint64_t usedSlots(uint32_t size_class) const;
  uint64_t heldSlots(uint32_t size_class) const;
  bool failed() const { return failed_.load(); }
  // Puts the engine into the failed, read-only state (as an fsync error
  // does) for a reason found outside it; returns the kIOError it reports.
  Status failTarget(const std::string& what) { return fail(what); }
  // kLeaseExpired naming the chunk if the wall clock is past `not_after_ns`
  // (0: never), as write() checks it once it holds the chunk.
  Status checkNotAfter(ChunkId id, int64_t not_after_ns) const;
  const std::string& path() const { return options_.path; }

 private:
  ChunkEngine(ChunkEngineOptions options, std::unique_ptr<rocksdb::DB> db);
  Status rebuild();
  struct File {
    int fd;            // buffered: the CRC area, fdatasync, punch hole
    int dfd;           // data blocks: O_DIRECT when available, else == fd
    std::string path;  // absolute
    uint64_t dev = 0, ino = 0;
    ~File();
  };
  // `open`: false returns null for a file not open now (no system call).
  Result<std::shared_ptr<File>> groupFile(uint32_t size_class, uint32_t group, bool open = true);
  // `<path>/data/c<class>/g<group>.dat`, with `path` made absolute.
  std::string groupPath(uint32_t size_class, uint32_t group) const;
  // Reads [offset, offset + n) of the chunk `m` into `out`, verifying every
  // block it touches. `cached_crcs`: CRCs may come from the CRC cache (scrub
  // reads the disk's). REQUIRES: offset + n <= m.length.
  Status readRange(const ChunkMeta& m, uint64_t offset, size_t n, uint8_t* out,
                   bool cached_crcs = true);
  // Whether large I/O of `n` bytes at `p` goes through the scratch buffers
  // instead (ChunkEngineOptions::huge_page_io).
  bool bounceFor(const uint8_t* p, size_t n) const;
  // readRange in steps, shared with startRead/finishRead (RangeRead in
  // chunk_engine.cc): plans the CRCs; fills in the I/O of the piece at `ps`;
  // verifies it and copies it out; caches a CRC page read on the way.
  struct RangeRead;
  void beginRange(RangeRead& r, bool cached_crcs);
  void preparePiece(RangeRead& r, uint64_t ps);
  Status finishPiece(RangeRead& r);
  void endRange(RangeRead& r);
  // query() from RocksDB's memtable and block cache only: `*in_memory` is
  // false (and the result nullopt) where the lookup would read the disk.
  Result<std::optional<ChunkMeta>> queryInMemory(ChunkId id, bool* in_memory);
  // What a change records besides the bytes: its chain and that chain's
  // version, and the chunk version it makes (0: the old one's plus one).
  struct Stamp {
    uint32_t chain = 0;
    uint64_t chain_version = 0;
    uint64_t chunk_version = 0;
  };
  // The write path shared by write(), truncate() and replace(): the new
  // content is the first `keep` bytes of `old` with [offset, offset + len)
  // replaced by `data` (zeros if null). REQUIRES: the chunk lock is held.
  Result<ChunkMeta> apply(ChunkId id, const std::optional<ChunkMeta>& old, uint64_t offset,
                          const uint8_t* data, uint64_t len, const Stamp& stamp, uint64_t keep,
                          bool stable = false, bool durable = true, bool* unsynced = nullptr);
  // kNoSpace unless the filesystem has `bytes` free past the reserve, after
  // punching every kept slot if that is what it takes.
  Status checkReserve(uint64_t bytes);
  Status checkChainVersion(ChunkId id, const std::optional<ChunkMeta>& old,
                           uint64_t chain_version) const;
  // Frees the slot; it keeps its blocks if the budget allows, else a hole is
  // punched. `removed`: freed by remove (a logged class punches only then).
  void releaseSlot(uint32_t size_class, SlotAddr a, bool removed);
  // Bytes of kept slots. REQUIRES: alloc_mu_ held.
  uint64_t keptBytesLocked() const;
  void punch(uint32_t size_class, SlotAddr a);
  // At open: marks the free slots whose blocks the group files still hold,
  // then punches kept slots past the budget.
  void findKeptSlots();
  // Punches kept slots until their bytes are within `budget`.
  void trimKept(uint64_t budget);
  Status fail(const std::string& what);
  std::mutex& chunkLock(const ChunkId& id);

  // Group commit (two pipelined stages, see commit()): concurrent writes
  // share one metadata-log record and one fdatasync per group file.
  struct PendingCommit;
  Status commit(PendingCommit& p);
  Status writeRecords(const std::vector<PendingCommit*>& batch);
  Status logRecords(const std::vector<PendingCommit*>& batch);
  Status syncAndApply(const std::vector<PendingCommit*>& batch);
  Result<bool> dataOnDisk(std::string_view key, std::string_view value);
  // ChunkMeta::crcs_crc of what the slot of `m` holds on disk: the CRC32C
  // of its first m.length / kBlockBytes CRC-area entries.
  Result<uint32_t> crcsCrcOnDisk(const ChunkMeta& m);
  // kCorruption if they are not the entries `m` recorded (nothing to check
  // for a record without crcs_crc).
  Status checkCrcArea(const ChunkMeta& m);

  Status openMetaLog();

  // The one data sync of every path: fdatasyncs the group files that
  // batches of unsynced writes up to the applied version went to, and
  // `also`'s (a durable batch's own: its stage-1 sync without the log, its
  // stage 2 with it), then marks that version (`also`'s last) durable and,
  // with `release`, releases the slots the unsynced writes freed.
  Status syncData(const std::vector<PendingCommit*>* also = nullptr, bool release = true);
  // Unsynced writes: whether `bytes` more may wait for a sync (counted if so).
  bool unsyncedRoom(uint64_t bytes);
  void syncerLoop();
  struct FlushListener;
  // Syncs the group files logged writes went to, flushes RocksDB, then lets
  // go of held slots; returns the version RocksDB holds.
  Result<uint64_t> checkpointMeta();

  // Logged writes (ChunkEngineOptions::log_small_writes).
  bool logsData(uint32_t size_class) const { return log_data_ && size_class == 0; }
  uint64_t slotKey(SlotAddr a) const { return (uint64_t{a.group} << 32) | a.slot; }  // class 0
  Status replayLoggedWrite(std::string_view bytes);
  void addDirty(std::shared_ptr<File> file);
  Status syncDirtyFiles();
  // Returns true when the slot must wait for a checkpoint instead.
  bool holdSlot(uint32_t size_class, SlotAddr a);

  ChunkEngineOptions options_;
  std::string abs_path_;  // options_.path made absolute at open (groupPath)
  std::unique_ptr<IoBackend> io_;
  std::unique_ptr<CrcCache> crc_cache_;  // null: off
  std::unique_ptr<IoBackend> page_io_;   // psync: logged writes into the page cache
  std::unique_ptr<rocksdb::DB> db_;
  std::unique_ptr<kv::LoggedRocks> meta_log_;  // null: RocksDB's WAL
  uint64_t meta_version_ = 0;                  // last batch logged; by the stage-1 leader
  // Last batch in RocksDB's memtable; with the log, every batch up to it
  // has its data and record durable.
  std::atomic<uint64_t> meta_applied_{0};
  // Unsynced records are made durable by the group files' fdatasync (the
  // log and the group files share a file system).
  bool flush_covers_log_ = false;
  mutable std::mutex alloc_mu_;
  std::vector<SlotAllocator> allocators_;           // one per size class
  std::array<uint64_t, kClassCount> data_bytes_{};  // under alloc_mu_
  uint64_t chunks_ = 0;                             // under alloc_mu_
  std::mutex files_mu_;
  std::unordered_map<uint64_t, std::pair<std::shared_ptr<File>, std::list<uint64_t>::iterator>>
      files_;
  std::list<uint64_t> lru_;  // front: most recent
  std::array<std::mutex, 64> chunk_locks_;
  class CommitStages;
  std::unique_ptr<CommitStages> commit_stages_;
  std::unique_ptr<GroupCommit> group_commit_;
  std::atomic<bool> failed_{false};
  // Slots handed out to copy-on-write and new chunks (read() checks it).
  std::atomic<uint64_t> slot_allocations_{0};

  bool log_data_ = false;
  uint64_t log_batch_bytes_max_ = 0;  // of logged data in one log record
  std::mutex checkpoint_mu_;          // one checkpoint at a time
  mutable std::mutex logged_mu_;
  // Under logged_mu_: group files written by logged writes since the last
  // checkpoint; class-0 slots (by allocator index) whose logged data a
  // replay may still write, with the version of their last logged write;
  // freed such slots with the version they were freed at.
  std::vector<std::shared_ptr<File>> dirty_files_;
  std::unordered_map<uint64_t, uint64_t> logged_slots_;
  std::vector<std::pair<SlotAddr, uint64_t>> held_;

  // Unsynced writes (ChunkEngineOptions::sync_interval_ms).
  bool unsynced_ok_ = false;  // the options and the log's place allow them
  // Batches up to it have their data and record durable (with the log).
  std::atomic<uint64_t> durable_version_{0};
  std::mutex sync_mu_;  // one syncData at a time, held across its fdatasyncs
  std::mutex unsynced_mu_;
  // Under unsynced_mu_: group files of unsynced batches that went past
  // stage 1 (their log records are on the device too); the bytes waiting;
  // slots those writes freed (class, slot, the batch's version).
  std::vector<std::shared_ptr<File>> unsynced_files_;
  uint64_t unsynced_bytes_ = 0;
  struct FreedSlot {
    uint32_t size_class;
    SlotAddr addr;
    uint64_t version;
  };
  std::vector<FreedSlot> unsynced_freed_;
  std::thread syncer_;
  std::condition_variable syncer_cv_;
  bool syncer_stop_ = false;  // under unsynced_mu_
  std::shared_ptr<FlushListener> flush_listener_;
};

}  // namespace cistern::storage
