#include "storage/chunk_engine.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/falloc.h>
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/listener.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "common/assert.h"
#include "common/config.h"
#include "common/crc32c.h"
#include "common/endian.h"
#include "common/fault.h"
#include "common/io_memory.h"
#include "common/log.h"
#include "common/metrics.h"
#include "kv/commit_log.h"
#include "kv/rocks_batch.h"
#include "storage/crc_cache.h"
#include "storage/io_backend.h"

namespace cistern::storage {
namespace {

Status errnoStatus(int err, const std::string& what) {
  ErrorCode code = err == ENOSPC ? ErrorCode::kNoSpace : ErrorCode::kIOError;
  return Status(code, fmt::format("{}: {}", what, std::strerror(err)));
}

Status fromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::OK();
  return Status(s.IsNoSpace() ? ErrorCode::kNoSpace : ErrorCode::kIOError,
                fmt::format("{}: {}", what, s.ToString()));
}

// Classes from 1 MiB up place new chunks in runs (SlotAllocator::allocateInRun)
// in pre-allocated group files; smaller ones, mostly small files, stay dense
// and sparse.
constexpr uint32_t kRunClass = 4;
static_assert(classBytes(kRunClass) == 1 << 20);

uint32_t slotsPerGroup(const ChunkEngineOptions& o, uint32_t c) {
  return static_cast<uint32_t>(std::max<uint64_t>(4, o.group_bytes / classBytes(c)));
}

uint64_t roundUp(uint64_t n) { return (n + kBlockBytes - 1) / kBlockBytes * kBlockBytes; }
uint64_t slotPos(uint32_t c, SlotAddr a) { return uint64_t{a.slot} * slotStride(c); }
uint64_t crcPos(uint32_t c, SlotAddr a) { return slotPos(c, a) + classBytes(c); }

std::string idText(const ChunkId& id) { return fmt::format("chunk {}:{}", id.inode, id.index); }

// With the metadata commit log, every RocksDB batch also stores its version
// under this key; it is longer than a chunk key (12 bytes) so no chunk can
// have it, and it sorts after all of them.
const std::string kMetaVersionKey = std::string(12, '\xff') + "/applied_version";

// The log-only op that carries a logged write's bytes (encodeLoggedWrite)
// ahead of its chunk record; never stored in RocksDB.
const std::string kLoggedWriteKey = std::string(12, '\xff') + "/logged_write";

// The log-only op that ends every record: the version up to which every
// batch was durable (data and record) when the record was written. Replay
// trusts the records up to the highest one seen and checks the data of the
// later ones, whose data syncs may not have finished.
const std::string kDurableVersionKey = std::string(12, '\xff') + "/durable_version";

bool isChunkKey(const rocksdb::Slice& key) { return key.size() == 12; }

constexpr uint64_t kPieceBytes = 1 << 20;  // scratch size; a multiple of kBlockBytes

std::string encodeVersion(uint64_t v) {
  std::string out;
  appendLE<uint64_t>(out, v);
  return out;
}

// Block-aligned memory for O_DIRECT.
struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, AlignedFree>;
// `bytes`: a multiple of kBlockBytes.
AlignedBuffer alignedBuffer(size_t bytes) {
  return AlignedBuffer(static_cast<uint8_t*>(std::aligned_alloc(kBlockBytes, bytes)));
}
}  // namespace

ChunkEngine::File::~File() {
  if (dfd != fd) ::close(dfd);
  ::close(fd);
}

struct ChunkEngine::PendingCommit {
  std::shared_ptr<File> file;  // to fdatasync; null for record-only and logged writes
  std::string key;
  std::string value;
  bool erase = false;    // delete the record instead of putting `value`
  std::string logged;    // encodeLoggedWrite: the data goes in the log record
  uint64_t version = 0;  // of the batch, once logged
  Status status;
  bool lazy = false;         // unsynced write; false once its batch turned out durable
  bool past_stage1 = false;  // its batch left stage 1
  bool leading = false;      // its writer is leading a stage
  bool done = false;
  std::condition_variable cv;  // its writer waits here (under commit_mu_)
};

// Group commit in two pipelined stages, each led by one thread at a time.
// With the metadata log (the default), stage 1 appends the batch's records
// to the log and stage 2 makes them durable and applies them to RocksDB's
// memtable. A batch that wrote group files has its record go out with
// O_DIRECT unsynced: stage 2's fdatasync of those files is a device cache
// flush that makes the data and the record durable at once (one flush per
// batch instead of two; see docs/chunk_format.md, "Write protocol"). A
// batch without group files (removes, logged writes) has its record synced
// in stage 1. Without the log, stage 1 fdatasyncs the group files and stage
// 2 writes the records to RocksDB with a synced WAL write. Batches enter
// stage 2 in the order they left stage 1, and a write is acknowledged only
// when its batch has left stage 2, so every earlier record is durable then.
// A writer leads whichever stage has work and no leader (stage 2 first once
// its own batch is past stage 1, since that is what it waits for) and
// otherwise sleeps on its own condition variable: a finished stage wakes its
// batch's writers and, for each stage left with work and no leader, one
// writer queued there — never every waiting writer.
Status ChunkEngine::commit(PendingCommit& p) {
  std::unique_lock lock(commit_mu_);
  stage1_queue_.push_back(&p);
  // Wakes one writer queued at each stage that has work and no leader: not
  // the caller (it looks for work itself before it sleeps) and not one that
  // is leading the other stage (it is not asleep).
  auto wakeOne = [&](const std::vector<PendingCommit*>& queue) {
    for (PendingCommit* q : queue) {
      if (q != &p && !q->leading) {
        q->cv.notify_one();
        return;
      }
    }
  };
  auto wakeIdleStages = [&] {
    if (!stage1_led_) wakeOne(stage1_queue_);
    // A caller whose batch left stage 1 leads stage 2 itself next.
    if (!stage2_led_ && (p.done || !p.past_stage1)) wakeOne(stage2_queue_);
  };
  auto finish = [&](const std::vector<PendingCommit*>& batch, const Status& s) {
    for (PendingCommit* q : batch) {
      q->status = s;
      q->done = true;
      if (q != &p) q->cv.notify_one();
    }
  };
  while (!p.done) {
    std::vector<PendingCommit*> batch;
    const bool stage2_free = !stage2_queue_.empty() && !stage2_led_;
    if (!stage1_queue_.empty() && !stage1_led_ && !(stage2_free && p.past_stage1)) {
      stage1_led_ = true;
      p.leading = true;
      // One log record per batch: logged data bounds how many go at once.
      size_t take = 0;
      uint64_t bytes = 0;
      for (; take < stage1_queue_.size(); ++take) {
        bytes += stage1_queue_[take]->logged.size();
        if (take > 0 && bytes > log_batch_bytes_max_) break;
      }
      batch.assign(stage1_queue_.begin(),
                   stage1_queue_.begin() + static_cast<std::ptrdiff_t>(take));
      stage1_queue_.erase(stage1_queue_.begin(),
                          stage1_queue_.begin() + static_cast<std::ptrdiff_t>(take));
      lock.unlock();
      Status s = meta_log_ ? logRecords(batch) : syncData(&batch);
      lock.lock();
      p.leading = false;
      if (s.ok()) {
        for (PendingCommit* q : batch) q->past_stage1 = true;
        stage2_queue_.insert(stage2_queue_.end(), batch.begin(), batch.end());
      } else {
        finish(batch, s);
      }
      stage1_led_ = false;
      wakeIdleStages();
      continue;
    }
    if (!stage2_free) {
      p.cv.wait(lock);
      continue;
    }
    stage2_led_ = true;
    p.leading = true;
    batch.swap(stage2_queue_);
    lock.unlock();
    Status s = meta_log_ ? syncAndApply(batch) : writeRecords(batch);
    lock.lock();
    p.leading = false;
    finish(batch, s);
    stage2_led_ = false;
    wakeIdleStages();
  }
  return p.status;
}

namespace {

metrics::Histogram& batchSizes() {
  static auto& h = metrics::Registry::global().histogram(
      "storage_commit_batch_size", {}, "Chunk writes sharing one data sync and metadata batch");
  return h;
}

}  // namespace

// Without the metadata log: the records in one synced RocksDB write.
Status ChunkEngine::writeRecords(const std::vector<PendingCommit*>& batch) {
  batchSizes().observe(batch.size());
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  kv::WriteBatch ops;
  ops.reserve(batch.size());
  for (PendingCommit* p : batch)
    ops.push_back({p->erase ? kv::WriteOp::kClear : kv::WriteOp::kSet, p->key, p->value});
  rocksdb::WriteBatch wb;
  if (Status bs = kv::appendToRocksBatch(ops, &wb); !bs.ok()) return fail(bs.toString());
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync;
  rocksdb::Status ps = db_->Write(wo, &wb);
  if (ps.IsNoSpace()) return Status(ErrorCode::kNoSpace, "chunk metadata: " + ps.ToString());
  if (!ps.ok()) return fail("metadata write: " + ps.ToString());
  return Status::OK();
}

// Stage 1 with the metadata log: the batch's records (each logged write's
// bytes ahead of its record) and the version up to which every batch is
// durable, in one log record.
Status ChunkEngine::logRecords(const std::vector<PendingCommit*>& batch) {
  batchSizes().observe(batch.size());
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  kv::WriteBatch ops;
  ops.reserve(batch.size() + 1);
  bool files = false;
  for (PendingCommit* p : batch) {
    if (!p->logged.empty())
      ops.push_back({kv::WriteOp::kSet, kLoggedWriteKey, std::move(p->logged)});
    ops.push_back({p->erase ? kv::WriteOp::kClear : kv::WriteOp::kSet, p->key, p->value});
    files |= p->file != nullptr;
  }
  ops.push_back({kv::WriteOp::kSet, kDurableVersionKey,
                 encodeVersion(durable_version_.load(std::memory_order_acquire))});
  const uint64_t version = ++meta_version_;
  for (PendingCommit* p : batch) p->version = version;
  std::string payload = kv::encodeLogBatch(ops);
  // Stage 2's fdatasync of the batch's group files flushes the record too.
  Status ls = !options_.sync               ? meta_log_->append(version, version, payload, false)
              : files && flush_covers_log_ ? meta_log_->appendToDevice(version, version, payload)
                                           : meta_log_->append(version, version, payload, true);
  if (!ls.ok()) return fail("metadata log: " + ls.toString());
  return Status::OK();
}

// Stage 2 with the metadata log: fdatasyncs the group files of the batches
// (their records went to the log before) and of the unsynced batches before
// them, then puts the records in RocksDB's memtable. A batch of unsynced
// writes only hands its files to the next sync.
Status ChunkEngine::syncAndApply(const std::vector<PendingCommit*>& batch) {
  const bool lazy = std::all_of(batch.begin(), batch.end(), [](auto* p) { return p->lazy; });
  if (lazy) {
    std::lock_guard lock(unsynced_mu_);
    for (PendingCommit* p : batch) {
      if (std::find(unsynced_files_.begin(), unsynced_files_.end(), p->file) ==
          unsynced_files_.end())
        unsynced_files_.push_back(p->file);
    }
  } else {
    // As a failed sync: the target fails, the records stay in the log unsynced.
    if (Status f = CISTERN_FAULT("storage.commit.before_data_sync"); !f.ok())
      return fail(f.toString());
    for (PendingCommit* p : batch) p->lazy = false;
    RETURN_ON_ERROR(syncData(&batch));
  }
  kv::WriteBatch ops;
  ops.reserve(batch.size());
  for (PendingCommit* p : batch)
    ops.push_back({p->erase ? kv::WriteOp::kClear : kv::WriteOp::kSet, p->key, p->value});
  rocksdb::WriteBatch wb;
  if (Status bs = kv::appendToRocksBatch(ops, &wb); !bs.ok()) return fail(bs.toString());
  const uint64_t version = batch.back()->version;
  (void)wb.Put(kMetaVersionKey, encodeVersion(version));
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;  // in the log; a checkpoint flushes the memtable
  rocksdb::Status ps = db_->Write(wo, &wb);
  if (!ps.ok()) return fail("metadata write: " + ps.ToString());
  meta_applied_.store(version, std::memory_order_release);
  return Status::OK();
}

bool ChunkEngine::unsyncedRoom(uint64_t bytes) {
  std::lock_guard lock(unsynced_mu_);
  if (unsynced_bytes_ + bytes > options_.unsynced_bytes_max) return false;
  unsynced_bytes_ += bytes;
  return true;
}

// Every batch up to `covers` went past stage 2, so the files of the
// unsynced ones among them are in unsynced_files_ or were synced by an
// earlier pass after their data and log record were written; one flush of
// the device after that makes them and their records durable.
Status ChunkEngine::syncData(const std::vector<PendingCommit*>* also, bool release) {
  static auto& syncs = metrics::Registry::global().counter(
      "storage_data_syncs_total", {}, "fdatasync calls on group files (one per file per batch)");
  std::vector<FreedSlot> free;
  {
    std::lock_guard sync_lock(sync_mu_);
    if (failed_)
      return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
    const uint64_t covers =
        also ? also->back()->version : meta_applied_.load(std::memory_order_acquire);
    std::vector<std::shared_ptr<File>> files;
    {
      std::lock_guard lock(unsynced_mu_);
      files.swap(unsynced_files_);
      unsynced_bytes_ = 0;
    }
    if (also) {
      for (PendingCommit* p : *also) {
        if (p->file && std::find(files.begin(), files.end(), p->file) == files.end())
          files.push_back(p->file);
      }
    }
    if (options_.sync) {
      for (const auto& f : files) {
        if (::fdatasync(f->fd) != 0) {
          // Never retried: the page cache may have dropped the dirty pages.
          return fail(fmt::format("fdatasync of a group file: {}", std::strerror(errno)));
        }
        syncs.inc();
      }
    }
    if (covers > durable_version_.load()) durable_version_.store(covers, std::memory_order_release);
    if (!release) return Status::OK();
    std::lock_guard lock(unsynced_mu_);
    const uint64_t durable = durable_version_.load();
    std::erase_if(unsynced_freed_, [&](const FreedSlot& f) {
      if (f.version > durable) return false;
      free.push_back(f);
      return true;
    });
  }
  // Not under sync_mu_: releasing a class-0 slot may force a checkpoint,
  // whose RocksDB flush runs a sync first (FlushListener).
  for (const FreedSlot& f : free) releaseSlot(f.size_class, f.addr, /*removed=*/false);
  return Status::OK();
}

Status ChunkEngine::sync() {
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  return unsynced_ok_ ? syncData() : Status::OK();
}

void ChunkEngine::syncerLoop() {
  std::unique_lock lock(unsynced_mu_);
  for (;;) {
    syncer_cv_.wait_for(lock, std::chrono::milliseconds(options_.sync_interval_ms),
                        [&] { return syncer_stop_; });
    if (syncer_stop_) return;
    if (unsynced_files_.empty() && unsynced_freed_.empty()) continue;
    lock.unlock();
    if (Status s = syncData(); !s.ok())
      CLOG_WARN("storage", "target {}: sync of unsynced writes: {}", options_.path, s.toString());
    lock.lock();
  }
}

// A memtable flush must not persist a record whose data is not yet durable:
// every record in the memtables it writes was applied after its data was
// written and its file handed to the next sync, which this runs first.
struct ChunkEngine::FlushListener : rocksdb::EventListener {
  std::atomic<ChunkEngine*> engine{nullptr};
  void OnFlushBegin(rocksdb::DB*, const rocksdb::FlushJobInfo&) override {
    ChunkEngine* e = engine.load();
    if (e == nullptr || !e->unsynced_ok_) return;
    // Releases nothing: releasing a held class-0 slot may force a
    // checkpoint, whose flush this one would wait for. The next sync does.
    if (Status s = e->syncData(nullptr, /*release=*/false); !s.ok())
      CLOG_WARN("storage", "target {}: sync before a metadata flush: {}", e->options_.path,
                s.toString());
  }
};

// Whether the data a chunk record (key, value) names verifies on disk; a
// record read back from the log after a crash. A chunk whose data does not
// verify is reported and false returned; the group file of one that does is
// synced with the others before the replay is flushed.
Result<bool> ChunkEngine::dataOnDisk(std::string_view key, std::string_view value) {
  ASSIGN_OR_RETURN(ChunkId id, decodeChunkKey(key));
  ASSIGN_OR_RETURN(ChunkMeta m, decodeChunkMeta(value));
  if (m.size_class >= kClassCount || m.addr.group >= options_.groups_max ||
      m.addr.slot >= slotsPerGroup(options_, m.size_class)) {
    return Status(ErrorCode::kCorruption,
                  fmt::format("{} in slot {}/{}/{} past the target's groups", idText(id),
                              m.size_class, m.addr.group, m.addr.slot));
  }
  const auto dropped = [&](std::string_view why) {
    CLOG_WARN("storage",
              "target {}: {} version {} dropped: its {} never reached the disk (the write was "
              "not acknowledged; the chunk keeps its previous version)",
              options_.path, idText(id), m.chunk_version, why);
    return false;
  };
  // First the CRC entries: the slot may hold what it held before (another
  // chunk, or an earlier version), whose bytes verify against its own CRCs.
  Status crcs = checkCrcArea(m);
  if (crcs.code() == ErrorCode::kCorruption) return dropped("checksums");
  RETURN_ON_ERROR(crcs);
  // In 2 MiB pages, so that the pieces are read straight into it.
  io_memory::Region buf(kPieceBytes);
  if (!buf) return Status(ErrorCode::kResourceExhausted, "buffer to check a replayed chunk");
  for (uint64_t at = 0; at < m.length; at += kPieceBytes) {
    Status s = readRange(m, at, std::min<uint64_t>(kPieceBytes, m.length - at), buf.data());
    if (s.code() == ErrorCode::kCorruption) return dropped("data");
    RETURN_ON_ERROR(s);
  }
  ASSIGN_OR_RETURN(auto file, groupFile(m.size_class, m.addr.group));
  addDirty(std::move(file));
  return true;
}

Result<uint32_t> ChunkEngine::crcsCrcOnDisk(const ChunkMeta& m) {
  ASSIGN_OR_RETURN(auto file, groupFile(m.size_class, m.addr.group));
  std::vector<uint8_t> crcs(m.length / kBlockBytes * 4);  // at most 64 KiB
  // Through the page cache, where the CRC area is written; past the end of
  // the file it reads as zeros.
  IoRequest r = IoRequest::readOf(file->fd, crcs.data(), crcs.size(), crcPos(m.size_class, m.addr));
  RETURN_ON_ERROR(page_io_->run({&r, 1}));
  return crc32c(crcs.data(), crcs.size());
}

Status ChunkEngine::checkCrcArea(const ChunkMeta& m) {
  if (!m.crcs_crc) return Status::OK();
  ASSIGN_OR_RETURN(uint32_t on_disk, crcsCrcOnDisk(m));
  if (on_disk == *m.crcs_crc) return Status::OK();
  return Status(ErrorCode::kCorruption,
                fmt::format("the CRC area of slot {}/{}/{} is not its record's", m.size_class,
                            m.addr.group, m.addr.slot));
}

// Replays the metadata log past the version RocksDB holds, then starts it.
Status ChunkEngine::openMetaLog() {
  std::string raw;
  uint64_t persisted = 0;
  rocksdb::Status gs = db_->Get(rocksdb::ReadOptions(), kMetaVersionKey, &raw);
  if (gs.ok() && raw.size() == 8) {
    persisted = getLE<uint64_t>(raw, 0);
  } else if (gs.ok()) {
    return Status(ErrorCode::kCorruption,
                  fmt::format("{}/meta: applied version of {} bytes", options_.path, raw.size()));
  } else if (!gs.IsNotFound()) {
    return fromRocks(gs, "read the metadata version of " + options_.path);
  }
  kv::CommitLogOptions lo;
  lo.dir = options_.path + "/meta-log";
  lo.segment_bytes = options_.meta_log_segment_bytes;
  lo.segments_max = 8;
  lo.direct_io = options_.sync;
  // Puts one record into RocksDB (logged bytes back into their slots,
  // synced below before the flush). `check`: its data syncs may not have
  // finished; a chunk record whose data does not verify is dropped (that
  // write was never acknowledged, and the chunk keeps its previous record).
  auto applyRecord = [this](uint64_t first, uint64_t last, kv::WriteBatch& ops,
                            bool check) -> Status {
    const auto where = [&] {
      return fmt::format("{}/meta-log: versions {}..{}", options_.path, first, last);
    };
    kv::WriteBatch records;
    records.reserve(ops.size());
    bool logged = false;  // the previous op carried this record's bytes
    for (kv::WriteOp& op : ops) {
      if (op.key == kDurableVersionKey) continue;
      if (op.key == kLoggedWriteKey) {
        if (Status ws = replayLoggedWrite(op.value); !ws.ok()) return ws.withContext(where());
        logged = true;
        continue;
      }
      if (check && !logged && op.kind == kv::WriteOp::kSet && isChunkKey(op.key)) {
        auto intact = dataOnDisk(op.key, op.value);
        if (!intact.ok()) return intact.status().withContext(where());
        if (!*intact) continue;
      }
      logged = false;
      records.push_back(std::move(op));
    }
    rocksdb::WriteBatch wb;
    if (Status bs = kv::appendToRocksBatch(records, &wb); !bs.ok())
      return Status(ErrorCode::kCorruption, fmt::format("{}: {}", where(), bs.message()));
    (void)wb.Put(kMetaVersionKey, encodeVersion(last));
    rocksdb::WriteOptions wo;
    wo.disableWAL = true;  // persisted by the flush below
    return fromRocks(db_->Write(wo, &wb), "replay metadata of " + options_.path);
  };
  // Records past the durable version that later records name are held back
  // until one vouches for them; those left at the end are checked.
  struct Unsure {
    uint64_t first, last;
    kv::WriteBatch ops;
  };
  std::deque<Unsure> unsure;
  auto replay = [&](const kv::LogRecord& rec, kv::WriteBatch& ops) -> Status {
    std::optional<uint64_t> durable;
    for (const kv::WriteOp& op : ops) {
      if (op.key != kDurableVersionKey) continue;
      if (op.value.size() != 8) {
        return Status(ErrorCode::kCorruption,
                      fmt::format("{}/meta-log: versions {}..{}: durable version of {} bytes",
                                  options_.path, rec.first, rec.last, op.value.size()));
      }
      durable = getLE<uint64_t>(op.value, 0);
    }
    for (; !unsure.empty() && (!durable || unsure.front().last <= *durable); unsure.pop_front()) {
      Unsure& u = unsure.front();
      RETURN_ON_ERROR(applyRecord(u.first, u.last, u.ops, /*check=*/!durable));
    }
    // A record without one is older than the durable versions: its data was
    // synced before it was written.
    if (!durable) return applyRecord(rec.first, rec.last, ops, /*check=*/false);
    unsure.push_back(Unsure{rec.first, rec.last, std::move(ops)});
    return Status::OK();
  };
  uint64_t last = persisted;
  ASSIGN_OR_RETURN(meta_log_, kv::CommitLog::open(lo, persisted, replay, &last));
  for (Unsure& u : unsure) RETURN_ON_ERROR(applyRecord(u.first, u.last, u.ops, /*check=*/true));
  if (last > persisted) {
    RETURN_ON_ERROR(syncDirtyFiles());
    RETURN_ON_ERROR(fromRocks(db_->Flush(rocksdb::FlushOptions()), "flush " + options_.path));
  }
  // Records written unsynced count on the group files' fdatasync to flush
  // the device's cache: only where both live on one file system.
  struct stat log_st {};
  struct stat data_st {};
  flush_covers_log_ = ::stat(lo.dir.c_str(), &log_st) == 0 &&
                      ::stat((options_.path + "/data").c_str(), &data_st) == 0 &&
                      log_st.st_dev == data_st.st_dev;
  meta_version_ = last;
  meta_applied_.store(last);
  durable_version_.store(last);
  return meta_log_->start(last + 1, [this] { return checkpointMeta(); });
}

Result<uint64_t> ChunkEngine::checkpointMeta() {
  std::lock_guard checkpoint_lock(checkpoint_mu_);
  uint64_t v = meta_applied_.load(std::memory_order_acquire);
  // Every logged write up to v put its file in the dirty set before it
  // committed, so its bytes are on disk before the flush makes v the
  // version a replay starts after.
  RETURN_ON_ERROR(syncDirtyFiles());
  RETURN_ON_ERROR(fromRocks(db_->Flush(rocksdb::FlushOptions()), "flush " + options_.path));
  // Logged bytes up to v are never replayed again: their slots are free to
  // reuse once freed.
  std::vector<SlotAddr> free;
  {
    std::lock_guard lock(logged_mu_);
    std::erase_if(logged_slots_, [v](const auto& e) { return e.second <= v; });
    std::erase_if(held_, [&](const std::pair<SlotAddr, uint64_t>& h) {
      if (h.second > v) return false;
      free.push_back(h.first);
      return true;
    });
  }
  std::lock_guard lock(alloc_mu_);
  for (SlotAddr a : free) allocators_[0].release(a);
  return v;
}

Status ChunkEngine::replayLoggedWrite(std::string_view bytes) {
  ASSIGN_OR_RETURN(LoggedWrite w, decodeLoggedWrite(bytes));
  if (w.addr.group >= options_.groups_max || w.addr.slot >= slotsPerGroup(options_, w.size_class)) {
    return Status(ErrorCode::kCorruption,
                  fmt::format("logged write to slot {}/{}/{} past the target's groups",
                              w.size_class, w.addr.group, w.addr.slot));
  }
  ASSIGN_OR_RETURN(auto file, groupFile(w.size_class, w.addr.group));
  IoRequest ws[2] = {IoRequest::writeOf(file->fd, w.data.data(), w.data.size(),
                                        slotPos(w.size_class, w.addr) + w.data_offset),
                     IoRequest::writeOf(file->fd, w.crcs.data(), w.crcs.size(),
                                        crcPos(w.size_class, w.addr) + w.crc_offset)};
  RETURN_ON_ERROR(page_io_->run({ws, w.crcs.empty() ? size_t{1} : size_t{2}})
                      .withContext("replay a write into " + groupPath(w.size_class, w.addr.group)));
  addDirty(std::move(file));
  return Status::OK();
}

void ChunkEngine::addDirty(std::shared_ptr<File> file) {
  std::lock_guard lock(logged_mu_);
  if (std::find(dirty_files_.begin(), dirty_files_.end(), file) == dirty_files_.end())
    dirty_files_.push_back(std::move(file));
}

Status ChunkEngine::syncDirtyFiles() {
  std::vector<std::shared_ptr<File>> files;
  {
    std::lock_guard lock(logged_mu_);
    files.swap(dirty_files_);
  }
  for (const auto& f : files) {
    // Never retried: the page cache may have dropped the dirty pages.
    if (::fdatasync(f->fd) != 0)
      return fail(fmt::format("fdatasync of a group file: {}", std::strerror(errno)));
  }
  return Status::OK();
}

bool ChunkEngine::holdSlot(uint32_t c, SlotAddr a) {
  if (!logsData(c)) return false;
  size_t held;
  {
    std::lock_guard lock(logged_mu_);
    auto it = logged_slots_.find(slotKey(a));
    if (it == logged_slots_.end()) return false;
    logged_slots_.erase(it);
    // The record that freed it is applied by now: meta_applied_ covers it.
    held_.emplace_back(a, meta_applied_.load(std::memory_order_acquire));
    held = held_.size();
  }
  if (held > options_.logged_held_slots_max) {
    if (auto v = checkpointMeta(); !v.ok())
      CLOG_WARN("storage", "target {}: checkpoint for held slots: {}", options_.path,
                v.status().toString());
  }
  return true;
}

ChunkEngine::ChunkEngine(ChunkEngineOptions options, std::unique_ptr<rocksdb::DB> db)
    : options_(std::move(options)), db_(std::move(db)) {
  std::error_code ec;
  abs_path_ = std::filesystem::absolute(options_.path, ec).lexically_normal().string();
  if (ec || abs_path_.empty()) abs_path_ = options_.path;
  for (uint32_t c = 0; c < kClassCount; ++c)
    allocators_.emplace_back(slotsPerGroup(options_, c), options_.groups_max);
}

bool ChunkEngine::bounceFor(const uint8_t* p, size_t n) const {
  return options_.huge_page_io && io_memory::hugePagesEnabled() && !io_memory::contains(p, n);
}

ChunkEngine::~ChunkEngine() {
  if (syncer_.joinable()) {
    {
      std::lock_guard lock(unsynced_mu_);
      syncer_stop_ = true;
    }
    syncer_cv_.notify_all();
    syncer_.join();
  }
  if (unsynced_ok_ && options_.flush_at_close) {
    if (Status s = syncData(); !s.ok())
      CLOG_WARN("storage", "target {}: unsynced writes at close: {}", options_.path, s.toString());
  }
  if (meta_log_) {
    meta_log_.reset();  // stops its checkpoint thread
    if (!options_.flush_at_close) {
      (void)db_->Close();  // as a crash leaves it: the log replays
      return;
    }
    // Logged bytes must be on disk before the flush ends their replay.
    if (Status s = syncDirtyFiles(); !s.ok()) {
      CLOG_WARN("storage", "target {}: not flushed at close, the log replays: {}", options_.path,
                s.toString());
    } else if (rocksdb::Status f = db_->Flush(rocksdb::FlushOptions()); !f.ok()) {
      CLOG_WARN("storage", "target {}: metadata flush at close: {}", options_.path, f.ToString());
    }
  }
  if (db_) (void)db_->Close();
  if (flush_listener_) flush_listener_->engine.store(nullptr);
}

void ChunkEngineOptions::bind(ConfigBinder& b, const std::string& p) {
  b.bind(p + ".io_engine", &io_engine,
         "io_uring (psync where io_uring cannot be set up) or psync (pread/pwrite)");
  b.bind(p + ".direct_io", &direct_io,
         "read and write data blocks with O_DIRECT where the file system supports it");
  b.bind(p + ".crc_cache_bytes", &crc_cache_bytes,
         "memory for pages of block CRCs per target (0: off; small reads then cost two I/Os)");
  b.bind(p + ".meta_cache_bytes", &meta_cache_bytes,
         "RocksDB block cache of a target's chunk metadata");
  b.bind(p + ".meta_memtable_bytes", &meta_memtable_bytes,
         "RocksDB memtable of a target's chunk metadata (two while one is flushed; at least "
         "64 KiB)");
  b.bind(p + ".open_files_max", &open_files_max, "group files a target keeps open (at least 1)");
  b.bind(p + ".reserved_bytes", &reserved_bytes,
         "writes fail with ENOSPC while the target's file system has less free");
  b.bind(p + ".huge_page_io", &huge_page_io,
         "reads and writes over 64 KiB of memory in 4 KiB pages go through a 2 MiB-page buffer "
         "and a copy (one segment per I/O)");
  b.bind(p + ".kept_free_bytes", &kept_free_bytes,
         "freed slots keep their disk blocks up to this many bytes per target");
  b.bind(p + ".sync_interval_ms", &sync_interval_ms,
         "longest an unsynced write (a client's, made durable at its fsync or close) waits for "
         "the target to sync it");
  b.bind(p + ".unsynced_bytes_max", &unsynced_bytes_max,
         "bytes of unsynced writes (and the old slots they hold) past which a write is synced at "
         "once");
}

Status ChunkEngineOptions::validate() const {
  RETURN_ON_ERROR(checkIoEngineName(io_engine));
  if (open_files_max == 0 || groups_max == 0) {
    return Status(ErrorCode::kInvalidArgument,
                  "storage open_files_max and groups_max must be at least 1");
  }
  if (sync_interval_ms == 0)
    return Status(ErrorCode::kInvalidArgument, "storage sync_interval_ms must be at least 1");
  if (meta_memtable_bytes < (64 << 10)) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("storage meta_memtable_bytes must be at least 65536, not {}",
                              meta_memtable_bytes));
  }
  return Status::OK();
}

Result<std::unique_ptr<ChunkEngine>> ChunkEngine::open(const ChunkEngineOptions& options) {
  RETURN_ON_ERROR(options.validate().withContext("target " + options.path));
  std::error_code ec;
  std::filesystem::create_directories(options.path + "/data", ec);
  if (ec)
    return Status(ErrorCode::kIOError,
                  fmt::format("create {}/data: {}", options.path, ec.message()));
  rocksdb::Options o;
  // RocksDB flushes unlogged memtables at close unless told otherwise.
  o.avoid_flush_during_shutdown = !options.flush_at_close;
  o.create_if_missing = true;
  o.max_open_files = 256;
  o.write_buffer_size = options.meta_memtable_bytes;
  o.max_write_buffer_number = 2;
  // Every write to a new chunk looks up a key no table holds: bloom filters
  // answer that without reading each table's index and data blocks. Index
  // and filter blocks live in the block cache, so the metadata's memory is
  // the cache's size however many chunks the target holds.
  rocksdb::BlockBasedTableOptions table;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.block_cache = rocksdb::NewLRUCache(options.meta_cache_bytes);
  table.cache_index_and_filter_blocks = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  auto listener = std::make_shared<FlushListener>();
  o.listeners.push_back(listener);
  rocksdb::DB* raw = nullptr;
  RETURN_ON_ERROR(fromRocks(rocksdb::DB::Open(o, options.path + "/meta", &raw),
                            "open " + options.path + "/meta"));
  std::unique_ptr<ChunkEngine> engine(new ChunkEngine(options, std::unique_ptr<rocksdb::DB>(raw)));
  engine->flush_listener_ = listener;
  listener->engine.store(engine.get());
  auto io = makeIoBackend(options.io_engine);
  if (!io.ok() && io.code() == ErrorCode::kNotSupported) {
    CLOG_WARN("storage", "target {}: {}; using psync", options.path, io.status().toString());
    io = makeIoBackend("psync");
  }
  if (!io.ok()) return io.status().withContext("target " + options.path);
  engine->io_ = std::move(io).value();
  for (std::string_view name : kIoEngineNames) {  // a reopen may switch
    metrics::Registry::global()
        .gauge("storage_io_engine", {{"target", options.path}, {"engine", std::string(name)}},
               "1 for the I/O engine each target uses (storage.io_engine), else 0")
        .set(name == engine->io_->name() ? 1 : 0);
  }
  ASSIGN_OR_RETURN(engine->page_io_, makeIoBackend("psync"));
  if (options.crc_cache_bytes > 0)
    engine->crc_cache_ = std::make_unique<CrcCache>(options.crc_cache_bytes);
  if (options.meta_commit_log) RETURN_ON_ERROR(engine->openMetaLog());
  RETURN_ON_ERROR(engine->rebuild());
  // A record holds the logged data of one batch: a quarter segment, so
  // that the biggest logged write fits with room to spare.
  const uint64_t segment = options.meta_log_segment_bytes;
  engine->log_batch_bytes_max_ =
      segment > kv::kLogSegmentHeaderBytes
          ? std::min<uint64_t>(1 << 20, (segment - kv::kLogSegmentHeaderBytes) / 4)
          : 0;
  engine->log_data_ = options.log_small_writes && options.sync && engine->meta_log_ &&
                      engine->log_batch_bytes_max_ >= 2 * slotStride(0);
  engine->findKeptSlots();  // after log_data_: logged classes keep nothing
  // An unsynced record goes out with O_DIRECT: the group files' sync must
  // flush it from the device's cache too.
  engine->unsynced_ok_ = options.sync && engine->meta_log_ && engine->flush_covers_log_;
  if (engine->unsynced_ok_) engine->syncer_ = std::thread([e = engine.get()] { e->syncerLoop(); });
  return engine;
}

// Rebuilds the slot bitmaps from the committed metadata: any slot that no
// record references (a write that crashed before its metadata) is free.
Status ChunkEngine::rebuild() {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (!isChunkKey(it->key())) continue;
    std::string_view key(it->key().data(), it->key().size());
    ASSIGN_OR_RETURN(ChunkId id, decodeChunkKey(key));
    auto m = decodeChunkMeta(std::string_view(it->value().data(), it->value().size()));
    if (!m.ok()) return m.status().withContext(idText(id));
    data_bytes_[m->size_class] += m->length;
    ++chunks_;
    if (!allocators_[m->size_class].markUsed(m->addr)) {
      return Status(ErrorCode::kCorruption,
                    fmt::format("{}: slot {}/{}/{} is referenced twice or out of range", idText(id),
                                m->size_class, m->addr.group, m->addr.slot));
    }
  }
  return fromRocks(it->status(), "scan chunk metadata");
}

std::mutex& ChunkEngine::chunkLock(const ChunkId& id) {
  return chunk_locks_[(id.inode * 0x9E3779B97F4A7C15ull + id.index) % chunk_locks_.size()];
}

Status ChunkEngine::fail(const std::string& what) {
  failed_ = true;
  CLOG_ERROR("storage", "target {} failed and is now read-only: {}", options_.path, what);
  return Status(ErrorCode::kIOError, fmt::format("target failed: {}", what));
}

Result<std::shared_ptr<ChunkEngine::File>> ChunkEngine::groupFile(uint32_t c, uint32_t group,
                                                                  bool open) {
  uint64_t key = (uint64_t{c} << 32) | group;
  std::lock_guard lock(files_mu_);
  if (auto it = files_.find(key); it != files_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.second);
    return it->second.first;
  }
  if (!open) return std::shared_ptr<File>();
  std::string path = groupPath(c, group);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  // Owner-only: a group file holds every tenant's chunks (short-circuit
  // readers must be the server's user or root).
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return errnoStatus(errno, "open " + path);
  // Data blocks go through O_DIRECT where the filesystem has it (tmpfs does
  // not); the CRC area, in pages of its own, stays in the page cache.
  int dfd = options_.direct_io ? ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_DIRECT) : -1;
  if (c >= kRunClass) {
    // Large classes are read in runs of slots: allocate the whole group at
    // once so that it is contiguous on disk (writes into holes from several
    // writers at a time would scatter it). Best effort: a full disk is
    // reported by the writes themselves.
    struct stat st;
    if (::fstat(fd, &st) == 0 && st.st_size == 0) {
      (void)::fallocate(fd, 0, 0,
                        static_cast<off_t>(uint64_t{slotsPerGroup(options_, c)} * slotStride(c)));
    }
  }
  std::shared_ptr<File> file(new File{fd, dfd >= 0 ? dfd : fd});
  file->path = std::move(path);
  if (struct stat st; ::fstat(fd, &st) == 0) {
    file->dev = st.st_dev;
    file->ino = st.st_ino;
  }
  lru_.push_front(key);
  files_[key] = {file, lru_.begin()};
  while (files_.size() > options_.open_files_max) {
    files_.erase(lru_.back());  // the descriptor closes when its last user is done
    lru_.pop_back();
  }
  return file;
}

namespace {

static_assert(std::endian::native == std::endian::little, "CRC areas are stored little-endian");

// Per-thread scratch, reused: touching fresh memory is slow, and a request
// must not allocate in proportion to its size.
// Buffers are block-aligned for O_DIRECT and allocated on first use.
struct Scratch {
  // What a piece goes through: up to kSmallBytes in 4 KiB pages, more in
  // 2 MiB pages (common/io_memory.h) — a 2 MiB page costs its whole size the
  // first time a thread touches it, which 4 KiB reads need not pay.
  struct PieceBuffer {
    static constexpr uint64_t kSmallBytes = (64 << 10) + kBlockBytes;
    AlignedBuffer small;
    io_memory::Region large;
    // Whether `bytes` go through the buffer in 2 MiB pages.
    static bool isLarge(uint64_t bytes) { return bytes > kSmallBytes; }
    // Room for `bytes` (at most a piece and a block).
    uint8_t* get(uint64_t bytes) {
      if (!isLarge(bytes)) {
        if (!small) small = alignedBuffer(kSmallBytes);
        CISTERN_CHECK(small, "out of memory for a chunk I/O buffer");
        return small.get();
      }
      if (!large) large = io_memory::Region(kPieceBytes + kBlockBytes);
      CISTERN_CHECK(large, "out of memory for a chunk I/O buffer");
      return large.data();
    }
  };
  PieceBuffer io;          // readRange
  PieceBuffer piece;       // assembling a write
  AlignedBuffer crc_page;  // readRange: a CRC page read to be cached
  std::vector<uint32_t> crcs;
  std::vector<uint32_t> read_crcs;
  uint8_t* crcPage() {
    if (!crc_page) crc_page = alignedBuffer(CrcCache::kPageBytes);
    return crc_page.get();
  }
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

Status mismatch(const ChunkMeta& m, uint64_t block) {
  static auto& mismatches = metrics::Registry::global().counter(
      "storage_checksum_mismatch_total", {}, "Blocks whose CRC32C did not match on read");
  mismatches.inc();
  return Status(ErrorCode::kCorruption,
                fmt::format("checksum mismatch in block {} of slot {}/{}/{}", block, m.size_class,
                            m.addr.group, m.addr.slot));
}

// The blocks a read of [offset, end) of a chunk `length` bytes long touches
// (b0..b1), and how many of them from b0 on have a CRC in the slot's CRC
// area (its whole blocks). REQUIRES: offset < end <= length.
struct Blocks {
  uint64_t b0 = 0, b1 = 0, full = 0, in_area = 0;
  // Whether those CRCs lie in one page of the CRC area (what the CRC cache keeps).
  bool inOnePage() const {
    return b0 / CrcCache::kEntriesPerPage == (b0 + in_area - 1) / CrcCache::kEntriesPerPage;
  }
};
Blocks blocksOf(uint64_t length, uint64_t offset, uint64_t end) {
  Blocks b;
  b.full = length / kBlockBytes;
  b.b0 = offset / kBlockBytes;
  b.b1 = (end - 1) / kBlockBytes;
  b.in_area = b.b0 < b.full ? std::min(b.b1 + 1, b.full) - b.b0 : 0;
  return b;
}

}  // namespace

// One range read of readRange or startRead/finishRead: the plan, the
// buffers it reads into (the thread's scratch, or an AsyncRead's own), and
// the piece whose I/O is being performed.
struct ChunkEngine::RangeRead {
  ChunkMeta m;
  uint64_t offset = 0, end = 0;
  uint8_t* out = nullptr;
  bool bounce = false;  // read into `buf` even where `out` could take the bytes
  std::shared_ptr<File> file;
  uint8_t* buf = nullptr;       // aligned, a piece and a block
  uint32_t* crcs = nullptr;     // room for the range's CRCs
  uint8_t* crc_page = nullptr;  // aligned, one CRC page
  // Set by beginRange.
  uint64_t b0 = 0, b1 = 0;  // blocks, inclusive
  uint64_t full = 0;        // blocks with a CRC in the CRC area
  uint64_t crc_count = 0;   // of those, in the range
  uint64_t data_to = 0;
  bool fused = false;
  std::optional<IoRequest> crc_read;
  std::optional<CrcCache::Key> crc_key;  // the page read is to be cached
  uint64_t crc_generation = 0;
  bool from_cache = false;
  // The piece in flight.
  uint64_t ps = 0, pe = 0;
  uint8_t* dst = nullptr;
  uint8_t* fused_crcs = nullptr;  // where a fused read puts the CRC page
  IoRequest io[2];
  size_t io_count = 0;
};

void ChunkEngine::beginRange(RangeRead& r, bool cached_crcs) {
  const ChunkMeta& m = r.m;
  const Blocks blocks = blocksOf(m.length, r.offset, r.end);
  r.full = blocks.full;
  r.b0 = blocks.b0;
  r.b1 = blocks.b1;
  r.crc_count = blocks.in_area;
  // A read of a full slot's last blocks whose CRCs lie in the first page of
  // the CRC area (right after the data) fetches data and CRCs in one I/O.
  r.data_to = roundUp(std::min((r.b1 + 1) * kBlockBytes, uint64_t{m.length}));
  r.fused = r.crc_count > 0 && r.data_to == classBytes(m.size_class) &&
            (r.b0 + r.crc_count) * 4 <= kBlockBytes &&
            r.data_to - r.b0 * kBlockBytes <= kPieceBytes;
  // Otherwise the CRCs come from the CRC cache when they lie in one page of
  // the CRC area, or are read together with the first piece's data (the
  // whole page, which is then cached once the data verified against it).
  if (r.crc_count == 0 || r.fused) return;
  constexpr uint64_t kPerPage = CrcCache::kEntriesPerPage;
  const uint64_t b0 = r.b0;
  if (cached_crcs && crc_cache_ && blocks.inOnePage()) {
    static auto& hits = metrics::Registry::global().counter(
        "storage_crc_cache_hits_total", {}, "Reads whose CRCs came from the CRC cache");
    static auto& misses = metrics::Registry::global().counter(
        "storage_crc_cache_misses_total", {}, "Reads that read their CRC page from the disk");
    CrcCache::Key key{m.size_class, m.addr, static_cast<uint32_t>(b0 / kPerPage)};
    if (crc_cache_->get(key, m.chunk_version, static_cast<uint32_t>(b0 % kPerPage),
                        static_cast<uint32_t>(r.crc_count), r.crcs, &r.crc_generation)) {
      hits.inc();
      r.from_cache = true;
    } else {
      misses.inc();
      r.crc_key = key;
      r.crc_read =
          IoRequest::readOf(r.file->fd, r.crc_page, CrcCache::kPageBytes,
                            crcPos(m.size_class, m.addr) + key.page * CrcCache::kPageBytes);
    }
  } else {
    r.crc_read = IoRequest::readOf(r.file->fd, r.crcs, r.crc_count * 4,
                                   crcPos(m.size_class, m.addr) + b0 * 4);
  }
}

// Whole blocks, a piece at a time, into the aligned buffer: verified there,
// then the wanted bytes are copied out.
void ChunkEngine::preparePiece(RangeRead& r, uint64_t ps) {
  const uint64_t base = slotPos(r.m.size_class, r.m.addr);
  r.ps = ps;
  // Data end of the piece: whole blocks, up to the block holding `end`.
  r.pe = std::min({ps + kPieceBytes, (r.b1 + 1) * kBlockBytes, uint64_t{r.m.length}});
  // Whole blocks wanted whole, at a block-aligned place in `out`: read
  // straight into `out` (no copy), unless its pages are small (bounce).
  r.dst = r.buf;
  if (!r.bounce && ps >= r.offset && r.pe <= r.end && (r.pe - ps) % kBlockBytes == 0 &&
      reinterpret_cast<uintptr_t>(r.out + (ps - r.offset)) % kBlockBytes == 0) {
    r.dst = r.out + (ps - r.offset);
  }
  if (r.fused) {
    // Data and the first CRC page in one I/O; the CRC page lands in `buf`.
    uint64_t data_len = r.data_to - ps;
    r.fused_crcs = r.dst == r.buf ? r.buf + data_len : r.buf;
    r.io[0] = IoRequest::readOf(r.file->dfd, r.dst, data_len, base + ps);
    if (r.dst == r.buf) {
      r.io[0].iov[0].iov_len += kBlockBytes;  // contiguous: one buffer
    } else {
      r.io[0].iov[1] = {r.fused_crcs, kBlockBytes};
      r.io[0].iovcnt = 2;
    }
    r.io_count = 1;
    return;
  }
  r.io[0] = IoRequest::readOf(r.file->dfd, r.dst, roundUp(r.pe - ps), base + ps);
  r.io_count = 1;
  if (r.crc_read) {
    r.io[r.io_count++] = *r.crc_read;
    r.crc_read.reset();
  }
}

Status ChunkEngine::finishPiece(RangeRead& r) {
  if (r.fused) {
    std::memcpy(r.crcs, r.fused_crcs + r.b0 * 4, r.crc_count * 4);
  } else if (r.crc_key && r.io_count == 2) {  // the CRC page came with this piece
    std::memcpy(r.crcs, r.crc_page + (r.b0 % CrcCache::kEntriesPerPage) * 4, r.crc_count * 4);
  }
  const ChunkMeta& m = r.m;
  for (uint64_t bs = r.ps; bs < r.pe; bs += kBlockBytes) {
    uint64_t block = bs / kBlockBytes;
    uint32_t want = block < r.full ? r.crcs[block - r.b0] : m.tail_crc;
    if (crc32c(r.dst + (bs - r.ps), std::min(kBlockBytes, r.pe - bs)) != want) {
      // A cached page may be what is wrong: the next attempt reads the disk's.
      if (r.from_cache) crc_cache_->invalidate(m.size_class, m.addr);
      return mismatch(m, block);
    }
  }
  if (r.dst == r.buf) {
    uint64_t from = std::max(r.ps, r.offset), to = std::min(r.pe, r.end);
    std::memcpy(r.out + (from - r.offset), r.buf + (from - r.ps), to - from);
  }
  return Status::OK();
}

void ChunkEngine::endRange(RangeRead& r) {
  // Every block verified against the page: keep it for the next reads.
  if (r.crc_key) crc_cache_->put(*r.crc_key, r.m.chunk_version, r.crc_generation, r.crc_page);
}

Status ChunkEngine::readRange(const ChunkMeta& m, uint64_t offset, size_t n, uint8_t* out,
                              bool cached_crcs) {
  if (n == 0) return Status::OK();
  RangeRead r;
  ASSIGN_OR_RETURN(r.file, groupFile(m.size_class, m.addr.group));
  r.m = m;
  r.offset = offset;
  r.end = offset + n;
  r.out = out;
  Scratch& sc = scratch();
  r.crc_page = sc.crcPage();
  if (sc.read_crcs.empty()) sc.read_crcs.resize(kMaxChunkBytes / kBlockBytes);
  r.crcs = sc.read_crcs.data();
  beginRange(r, cached_crcs);
  // A piece's blocks and one more (a CRC page read with the data).
  const uint64_t need = std::min(kPieceBytes, (r.b1 + 1 - r.b0) * kBlockBytes) + kBlockBytes;
  r.buf = sc.io.get(need);
  r.bounce = Scratch::PieceBuffer::isLarge(need) && bounceFor(out, n);
  for (uint64_t ps = r.b0 * kBlockBytes; ps < r.end; ps += kPieceBytes) {
    preparePiece(r, ps);
    RETURN_ON_ERROR(io_->run({r.io, r.io_count}));
    RETURN_ON_ERROR(finishPiece(r));
  }
  endRange(r);
  return Status::OK();
}

// Reads of at most kAsyncReadBytesMax touch at most this many blocks, and a
// fused read one more (the CRC page).
constexpr size_t kAsyncReadBlocks = ChunkEngine::kAsyncReadBytesMax / kBlockBytes + 2;
static_assert((kAsyncReadBlocks + 1) * kBlockBytes <= kPieceBytes + kBlockBytes);

struct ChunkEngine::AsyncRead::State {
  RangeRead range;
  uint64_t allocations = 0;  // slot_allocations_ when the record was read
  ChunkId id;
  AlignedBuffer buf = alignedBuffer((kAsyncReadBlocks + 1) * kBlockBytes);
  AlignedBuffer crc_page = alignedBuffer(CrcCache::kPageBytes);
  uint32_t crcs[kAsyncReadBlocks] = {};
};

ChunkEngine::AsyncRead::AsyncRead() : s_(std::make_unique<State>()) {}
ChunkEngine::AsyncRead::~AsyncRead() = default;
std::span<IoRequest> ChunkEngine::AsyncRead::io() { return {s_->range.io, s_->range.io_count}; }

Result<std::optional<size_t>> ChunkEngine::startRead(ChunkId id, uint64_t offset,
                                                     std::span<uint8_t> out, AsyncRead& a) {
  using Started = std::optional<size_t>;
  // A delay at a fault point would stall the caller's event loop.
  if (out.size() > kAsyncReadBytesMax || fault::g_enabled_count.load() > 0) return Started();
  AsyncRead::State& s = *a.s_;
  s.allocations = slot_allocations_.load();
  bool in_memory = false;
  ASSIGN_OR_RETURN(auto m, queryInMemory(id, &in_memory));
  if (!in_memory) return Started();
  if (!m) return Status(ErrorCode::kNotFound, idText(id));
  RangeRead& r = s.range;
  r = RangeRead();
  if (offset >= m->length || out.empty()) return Started(0);
  const size_t n = std::min<size_t>(out.size(), m->length - offset);
  ASSIGN_OR_RETURN(r.file, groupFile(m->size_class, m->addr.group, /*open=*/false));
  if (!r.file) return Started();
  s.id = id;
  r.m = *m;
  r.offset = offset;
  r.end = offset + n;
  r.out = out.data();
  r.buf = s.buf.get();
  r.crc_page = s.crc_page.get();
  r.crcs = s.crcs;
  beginRange(r, /*cached_crcs=*/true);
  preparePiece(r, r.b0 * kBlockBytes);
  CISTERN_CHECK(r.pe >= r.end, "an asynchronous read is one piece");
  return Started(n);
}

bool ChunkEngine::finishRead(AsyncRead& a, std::span<const int> results) {
  AsyncRead::State& s = *a.s_;
  RangeRead& r = s.range;
  if (r.io_count == 0) return true;  // nothing to read
  for (size_t i = 0; i < r.io_count; ++i) {
    if (i >= results.size() || results[i] < 0) return false;
    // Short at the end of a file (a CRC page, a slot not written to its
    // end): the rest reads as zeros, as with IoBackend. Every block used is
    // verified below, so zeros that should not be there are caught.
    zeroFrom(r.io[i], static_cast<size_t>(results[i]));
  }
  if (!finishPiece(r).ok()) return false;  // read() tells corruption from a moved chunk
  if (slot_allocations_.load() != s.allocations) {
    // As in read(): the slot may hold another chunk's bytes by now.
    bool in_memory = false;
    auto now = queryInMemory(s.id, &in_memory);
    if (!now.ok() || !in_memory || !*now || (*now)->size_class != r.m.size_class ||
        (*now)->addr != r.m.addr)
      return false;
  }
  endRange(r);
  static auto& read_bytes = metrics::Registry::global().counter("storage_read_bytes_total", {},
                                                                "Chunk bytes read and verified");
  read_bytes.inc(r.end - r.offset);
  return true;
}

Result<std::optional<ChunkMeta>> ChunkEngine::queryInMemory(ChunkId id, bool* in_memory) {
  rocksdb::ReadOptions ro;
  ro.read_tier = rocksdb::kBlockCacheTier;
  std::string value;
  rocksdb::Status s = db_->Get(ro, encodeChunkKey(id), &value);
  *in_memory = !s.IsIncomplete();
  if (s.IsNotFound() || s.IsIncomplete()) return std::optional<ChunkMeta>();
  if (!s.ok()) return fromRocks(s, "read metadata of " + idText(id));  // text only on error
  auto m = decodeChunkMeta(value);
  if (!m.ok()) return m.status().withContext(idText(id));
  return std::optional<ChunkMeta>(*m);
}

Result<std::optional<ChunkMeta>> ChunkEngine::query(ChunkId id) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), encodeChunkKey(id), &value);
  if (s.IsNotFound()) return std::optional<ChunkMeta>();
  if (!s.ok()) return fromRocks(s, "read metadata of " + idText(id));  // text only on error
  auto m = decodeChunkMeta(value);
  if (!m.ok()) return m.status().withContext(idText(id));
  return std::optional<ChunkMeta>(*m);
}

// A writer routed by an older chain table than the chunk's last writer may
// not know of a newer replica set; it must refresh its routing and retry.
Status ChunkEngine::checkChainVersion(ChunkId id, const std::optional<ChunkMeta>& old,
                                      uint64_t chain_version) const {
  if (old && chain_version < old->chain_version) {
    return Status(ErrorCode::kStaleChainVersion,
                  fmt::format("{}: write with chain version {} after version {}", idText(id),
                              chain_version, old->chain_version));
  }
  return Status::OK();
}

// Under the chunk lock: whatever changed the chunk before this returned OK
// has finished, and whatever changes it next starts after it.
Status ChunkEngine::checkNotAfter(ChunkId id, int64_t not_after_ns) const {
  if (not_after_ns == 0) return Status::OK();
  const int64_t now_ns = options_.clock->wallMicros() * 1000;
  if (now_ns <= not_after_ns) return Status::OK();
  return Status(ErrorCode::kLeaseExpired,
                fmt::format("{}: refused {} ms past the call's not-after time (a lease that ran "
                            "out, or an attempt its client gave up on)",
                            idText(id), (now_ns - not_after_ns) / 1'000'000));
}

Status ChunkEngine::checkReserve(uint64_t bytes) {
  struct statvfs vfs;
  if (::statvfs(options_.path.c_str(), &vfs) != 0) return Status::OK();
  uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  if (free_bytes < options_.reserved_bytes + bytes) {
    // Kept slots hold space this write may not get: give it all back first.
    bool kept;
    {
      std::lock_guard lock(alloc_mu_);
      kept = keptBytesLocked() > 0;
    }
    if (kept) {
      trimKept(0);
      if (::statvfs(options_.path.c_str(), &vfs) == 0)
        free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
    }
  }
  if (free_bytes < options_.reserved_bytes + bytes) {
    return Status(ErrorCode::kNoSpace,
                  fmt::format("target {} has {} bytes free, below the {} byte reserve",
                              options_.path, free_bytes, options_.reserved_bytes));
  }
  return Status::OK();
}

std::string ChunkEngine::groupPath(uint32_t c, uint32_t group) const {
  return fmt::format("{}/data/c{}/g{}.dat", abs_path_, c, group);
}

void ChunkEngine::punch(uint32_t c, SlotAddr a) {
  if (auto file = groupFile(c, a.group); file.ok()) {
    if (::fallocate((*file)->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(slotPos(c, a)), static_cast<off_t>(slotStride(c))) != 0) {
      CLOG_DEBUG("storage", "punch hole in {}: {}", options_.path, std::strerror(errno));
    }
  }
}

uint64_t ChunkEngine::keptBytesLocked() const {
  uint64_t bytes = 0;
  for (uint32_t c = 0; c < kClassCount; ++c) bytes += allocators_[c].keptSlots() * slotStride(c);
  return bytes;
}

void ChunkEngine::releaseSlot(uint32_t c, SlotAddr a, bool removed) {
  if (logsData(c)) {
    // Logged bytes reach the group file at checkpoints, in bulk: nothing to
    // keep. Punched before the slot is free again (afterwards a new chunk
    // may be in it).
    if (removed) punch(c, a);
    if (holdSlot(c, a)) return;
    std::lock_guard lock(alloc_mu_);
    allocators_[c].release(a);
    return;
  }
  {
    std::lock_guard lock(alloc_mu_);
    if (keptBytesLocked() + slotStride(c) <= options_.kept_free_bytes) {
      allocators_[c].release(a, /*kept=*/true);
      return;
    }
  }
  punch(c, a);
  std::lock_guard lock(alloc_mu_);
  allocators_[c].release(a);
}

void ChunkEngine::findKeptSlots() {
  std::unique_lock lock(alloc_mu_);
  for (uint32_t c = 0; c < kClassCount; ++c) {
    if (logsData(c)) continue;
    SlotAllocator& alloc = allocators_[c];
    for (uint32_t g = 0; g < alloc.groups(); ++g) {
      int fd = ::open(groupPath(c, g).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      // Data segments: written blocks (holes and, on ext4 and xfs,
      // fallocate's unwritten extents are skipped).
      off_t at = 0;
      for (;;) {
        off_t data = ::lseek(fd, at, SEEK_DATA);
        if (data < 0) break;  // ENXIO: no more data; EINVAL: not supported
        off_t hole = ::lseek(fd, data, SEEK_HOLE);
        if (hole <= data) break;
        uint64_t first = static_cast<uint64_t>(data) / slotStride(c);
        uint64_t last = (static_cast<uint64_t>(hole) - 1) / slotStride(c);
        for (uint64_t s = first; s <= last && s < alloc.slotsPerGroup(); ++s)
          (void)alloc.markKept(SlotAddr{g, static_cast<uint32_t>(s)});  // false if in use
        at = hole;
      }
      ::close(fd);
    }
  }
  lock.unlock();
  trimKept(options_.kept_free_bytes);
}

void ChunkEngine::trimKept(uint64_t budget) {
  // The highest slots of the largest classes go first.
  std::unique_lock lock(alloc_mu_);
  while (keptBytesLocked() > budget) {
    std::optional<std::pair<uint32_t, SlotAddr>> drop;
    for (uint32_t c = kClassCount; c-- > 0 && !drop;) {
      if (auto a = allocators_[c].dropHighestKept()) drop.emplace(c, *a);
    }
    if (!drop) break;
    lock.unlock();
    punch(drop->first, drop->second);
    lock.lock();
  }
}

Result<ChunkMeta> ChunkEngine::write(ChunkId id, uint64_t offset, std::span<const uint8_t> data,
                                     uint64_t chain_version, bool stable, int64_t not_after_ns,
                                     bool durable, bool* unsynced) {
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  if (offset + data.size() > kMaxChunkBytes) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("write to {} ends at {} past {}", idText(id), offset + data.size(),
                              kMaxChunkBytes));
  }
  std::lock_guard chunk_lock(chunkLock(id));
  RETURN_ON_ERROR(checkNotAfter(id, not_after_ns));
  ASSIGN_OR_RETURN(auto old, query(id));
  RETURN_ON_ERROR(checkChainVersion(id, old, chain_version));
  return apply(id, old, offset, data.data(), data.size(), chain_version,
               old ? old->length : uint64_t{0}, stable, durable, unsynced);
}

Result<ChunkMeta> ChunkEngine::truncate(ChunkId id, uint64_t length, uint64_t chain_version,
                                        int64_t not_after_ns) {
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  if (length > kMaxChunkBytes) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("truncate {} to {} past {}", idText(id), length, kMaxChunkBytes));
  }
  std::lock_guard chunk_lock(chunkLock(id));
  RETURN_ON_ERROR(checkNotAfter(id, not_after_ns));
  ASSIGN_OR_RETURN(auto old, query(id));
  RETURN_ON_ERROR(checkChainVersion(id, old, chain_version));
  uint64_t old_len = old ? old->length : 0;
  if (!old || length >= old_len)  // grow: append zeros
    return apply(id, old, old_len, nullptr, length - old_len, chain_version, old_len);
  ASSIGN_OR_RETURN(uint32_t c, classFor(length));
  if (c != old->size_class)  // shrink into a smaller class: copy what stays
    return apply(id, old, length, nullptr, 0, chain_version, length);
  // Shrink within the class: only the record changes (new length, new tail CRC).
  ChunkMeta m = *old;
  m.length = static_cast<uint32_t>(length);
  m.chunk_version = old->chunk_version + 1;
  m.chain_version = chain_version;
  uint64_t tail_at = length / kBlockBytes * kBlockBytes;
  alignas(64) uint8_t tail[kBlockBytes];
  RETURN_ON_ERROR(readRange(*old, tail_at, length - tail_at, tail).withContext(idText(id)));
  m.tail_crc = crc32c(tail, length - tail_at);
  if (m.crcs_crc) {
    ASSIGN_OR_RETURN(m.crcs_crc, crcsCrcOnDisk(m));
  }
  PendingCommit pending{nullptr, encodeChunkKey(id), encodeChunkMeta(m)};
  RETURN_ON_ERROR(commit(pending).withContext(idText(id)));
  std::lock_guard lock(alloc_mu_);
  data_bytes_[c] -= old_len - length;
  return m;
}

// The new content: the old content's first `keep` bytes, with [offset,
// offset + len) replaced by `data` (zeros if null); bytes never written are
// zeros. REQUIRES: the chunk lock is held; keep <= old length.
Result<ChunkMeta> ChunkEngine::apply(ChunkId id, const std::optional<ChunkMeta>& old,
                                     uint64_t offset, const uint8_t* data, uint64_t len,
                                     uint64_t chain_version, uint64_t keep, bool stable,
                                     bool durable, bool* unsynced) {
  static auto& write_bytes = metrics::Registry::global().counter(
      "storage_write_bytes_total", {}, "Chunk bytes written by writes and truncates");
  write_bytes.inc(len);
  const uint64_t old_len = old ? old->length : 0;
  const uint64_t end = offset + len;
  const uint64_t new_len = std::max(keep, end);
  ASSIGN_OR_RETURN(uint32_t c, classFor(new_len));
  // An append within the class goes in place, past the committed bytes.
  const bool in_place = old && old->size_class == c && keep == old_len && offset >= old_len;
  RETURN_ON_ERROR(checkReserve(in_place ? new_len - old_len : new_len));
  SlotAddr addr;
  if (in_place) {
    addr = old->addr;
  } else if (old || c < kRunClass) {
    std::lock_guard lock(alloc_mu_);
    ASSIGN_OR_RETURN(addr, allocators_[c].allocate());  // lowest free: dense
  } else {
    // A new large chunk goes into its file's run of 64 slots, in index
    // order, so the file reads back sequentially from disk whatever order
    // its chunks were written in. The previous chunk's slot finds the run of
    // a file written before a restart.
    std::optional<ChunkMeta> prev;
    if (id.index > 0) {
      ASSIGN_OR_RETURN(prev, query(ChunkId{id.inode, id.index - 1}));
    }
    std::optional<SlotAddr> prev_addr;
    if (prev && prev->size_class == c) prev_addr = prev->addr;
    std::lock_guard lock(alloc_mu_);
    ASSIGN_OR_RETURN(addr, allocators_[c].allocateInRun(id.inode, id.index, prev_addr));
  }
  // Before any byte goes into the slot: a reader that fetched an older
  // record naming it must learn that the slot may have changed hands.
  if (!in_place) slot_allocations_.fetch_add(1);
  auto releaseNew = [&] {
    if (!in_place) releaseSlot(c, addr, /*removed=*/false);
  };
  auto file = groupFile(c, addr.group);
  if (!file.ok()) {
    releaseNew();
    return file.status();
  }
  // Logged writes go through the page cache: the log record makes them
  // durable, the checkpoint's fdatasync writes them out in bulk.
  const bool logged = logsData(c);
  const int fd = (*file)->fd, dfd = logged ? fd : (*file)->dfd;
  std::string logged_bytes;
  const uint64_t base = slotPos(c, addr);
  const uint64_t write_from = in_place ? old_len : 0;
  const uint64_t first_block = write_from / kBlockBytes;
  const uint64_t full = new_len / kBlockBytes;
  Scratch& sc = scratch();
  if (sc.crcs.size() < full - first_block) sc.crcs.resize(kMaxChunkBytes / kBlockBytes);
  uint32_t tail_crc = 0;
  auto writePieces = [&]() -> Status {
    const uint64_t need = std::min(kPieceBytes, roundUp(new_len - first_block * kBlockBytes));
    uint8_t* buf = sc.piece.get(need);
    const bool large = Scratch::PieceBuffer::isLarge(need);
    for (uint64_t ps = first_block * kBlockBytes; ps < new_len; ps += kPieceBytes) {
      const uint64_t pe = std::min(ps + kPieceBytes, new_len);
      // Assemble whole blocks in the aligned buffer: kept old bytes, new
      // bytes, zeros (also past the end, up to the block boundary). Only the
      // old bytes that the new ones leave standing are read.
      uint64_t old_to = std::min(pe, keep);
      uint64_t from = std::max(ps, offset), to = std::min(pe, end);
      const bool fresh = from < to && data;  // new bytes land in this piece
      const uint64_t head_to = fresh ? std::min(old_to, from) : old_to;
      if (ps < head_to) RETURN_ON_ERROR(readRange(*old, ps, head_to - ps, buf));
      if (fresh && to < old_to) RETURN_ON_ERROR(readRange(*old, to, old_to - to, buf + (to - ps)));
      // Past the kept bytes: new bytes where the write covers, zeros elsewhere.
      const uint64_t zero_from = std::max(ps, old_to), buf_end = ps + roundUp(pe - ps);
      // What goes to the disk: the aligned buffer, or the caller's bytes
      // themselves when they alone fill the piece's whole blocks.
      const uint8_t* src = buf;
      if (stable && fresh && !logged && from == ps && to == pe && (pe - ps) % kBlockBytes == 0 &&
          reinterpret_cast<uintptr_t>(data + (ps - offset)) % kBlockBytes == 0 &&
          !(large && bounceFor(data + (ps - offset), pe - ps))) {
        src = data + (ps - offset);
      } else if (fresh) {
        std::memcpy(buf + (from - ps), data + (from - offset), to - from);
        if (zero_from < from) std::memset(buf + (zero_from - ps), 0, from - zero_from);
        uint64_t zero_to = std::max(to, zero_from);
        std::memset(buf + (zero_to - ps), 0, buf_end - zero_to);
      } else {
        std::memset(buf + (zero_from - ps), 0, buf_end - zero_from);
      }
      // In place, the block holding the old end is rewritten with the same
      // committed bytes; nothing before it is touched.
      for (uint64_t bs = ps; bs < pe; bs += kBlockBytes) {
        uint64_t be = std::min(bs + kBlockBytes, pe);
        uint32_t crc = crc32c(src + (bs - ps), be - bs);
        if (bs / kBlockBytes < full)
          sc.crcs[bs / kBlockBytes - first_block] = crc;
        else
          tail_crc = crc;
      }
      const uint64_t wstart = std::max(ps, write_from / kBlockBytes * kBlockBytes);
      IoRequest ws[2] = {
          IoRequest::writeOf(dfd, src + (wstart - ps), roundUp(pe - wstart), base + wstart)};
      size_t count = 1;
      if (pe == new_len && first_block == 0 && new_len == classBytes(c) && wstart == 0 &&
          full * 4 <= kBlockBytes) {
        // A whole slot rewritten: its CRC page follows the data, so both go
        // out as one direct I/O (no dirty page left for the sync to write).
        uint8_t* page = sc.io.get(kBlockBytes);
        std::memcpy(page, sc.crcs.data(), full * 4);
        std::memset(page + full * 4, 0, kBlockBytes - full * 4);
        ws[0].iov[1] = {page, kBlockBytes};
        ws[0].iovcnt = 2;
      } else if (pe == new_len && full > first_block) {  // the last piece: with the CRCs
        ws[count++] = IoRequest::writeOf(fd, sc.crcs.data(), (full - first_block) * 4,
                                         crcPos(c, addr) + first_block * 4);
      }
      // Page-cache writes finish in the system call: io_uring would only
      // hand them to a worker thread.
      RETURN_ON_ERROR((logged ? *page_io_ : *io_).run({ws, count}));
      if (logged) {
        // A class-0 slot is smaller than a piece: this is the only one.
        const uint64_t crc_count = full > first_block ? full - first_block : 0;
        logged_bytes = encodeLoggedWrite(LoggedWrite{
            .size_class = c,
            .addr = addr,
            .data_offset = static_cast<uint32_t>(wstart),
            .data = {reinterpret_cast<const char*>(buf + (wstart - ps)), roundUp(pe - wstart)},
            .crc_offset = static_cast<uint32_t>(first_block * 4),
            .crcs = {reinterpret_cast<const char*>(sc.crcs.data()), crc_count * 4}});
      }
    }
    return CISTERN_FAULT("storage.write.after_data");
  };
  if (Status s = writePieces(); !s.ok()) {
    releaseNew();
    return s.withContext(idText(id));
  }
  // The slot's new CRCs are on the disk and its new record not yet
  // published: no reader can take a cached page of what was there before.
  if (crc_cache_) crc_cache_->invalidate(c, addr);
  // A slot written from its first block has all its CRCs in `sc.crcs`: its
  // first CRC page is cached once the record is published (after the
  // invalidation, so a reader's older page cannot replace it), and a read
  // or Locate that follows needs no I/O for them.
  const bool cache_page = crc_cache_ && first_block == 0 && full > 0;
  const uint64_t page_generation = cache_page ? crc_cache_->generation(c, addr) : 0;
  ChunkMeta m;
  m.size_class = c;
  m.addr = addr;
  m.length = static_cast<uint32_t>(new_len);
  m.chunk_version = (old ? old->chunk_version : 0) + 1;
  m.chain_version = chain_version;
  m.tail_crc = tail_crc;
  // An append extends the CRC of the entries before it (a version 2 record
  // stays without one: its entries' CRC would need the whole area read).
  const size_t new_entries = full > first_block ? (full - first_block) * 4 : 0;
  if (first_block == 0)
    m.crcs_crc = crc32c(sc.crcs.data(), new_entries);
  else if (old->crcs_crc)
    m.crcs_crc = crc32cExtend(*old->crcs_crc, sc.crcs.data(), new_entries);
  PendingCommit pending{logged ? nullptr : *file, encodeChunkKey(id), encodeChunkMeta(m)};
  // Unsynced: the bytes written, and the old slot held until the sync.
  pending.lazy =
      !durable && unsynced_ok_ && !logged &&
      unsyncedRoom(new_len - write_from + (old && !in_place ? classBytes(old->size_class) : 0));
  if (logged) {
    addDirty(*file);  // after its bytes were written, before its record commits
    pending.logged = std::move(logged_bytes);
  }
  Status committed = commit(pending);
  if (committed.code() == ErrorCode::kNoSpace) {
    releaseNew();  // the old record is intact; a new slot was never referenced
    return committed.withContext(idText(id));
  }
  RETURN_ON_ERROR(committed);
  if (cache_page) {
    uint8_t page[CrcCache::kPageBytes] = {};
    std::memcpy(page, sc.crcs.data(), std::min<uint64_t>(full, CrcCache::kEntriesPerPage) * 4);
    crc_cache_->put(CrcCache::Key{c, addr, 0}, m.chunk_version, page_generation, page);
  }
  if (logged) {
    std::lock_guard lock(logged_mu_);
    logged_slots_[slotKey(addr)] = pending.version;
  }
  {
    std::lock_guard lock(alloc_mu_);
    if (old)
      data_bytes_[old->size_class] -= old_len;
    else
      ++chunks_;
    data_bytes_[c] += new_len;
  }
  if (unsynced) *unsynced = pending.lazy;
  RETURN_ON_ERROR(CISTERN_FAULT("storage.write.after_meta"));
  if (old && !in_place) {
    // A crash before the sync may bring the old record back: its slot
    // waits for the sync that makes this one durable.
    if (pending.lazy) {
      std::lock_guard lock(unsynced_mu_);
      if (durable_version_.load() < pending.version) {
        unsynced_freed_.push_back(FreedSlot{old->size_class, old->addr, pending.version});
        return m;
      }
    }
    releaseSlot(old->size_class, old->addr, /*removed=*/false);
  }
  return m;
}

Result<size_t> ChunkEngine::read(ChunkId id, uint64_t offset, std::span<uint8_t> out) {
  // A copy-on-write commit may release the slot between our metadata read
  // and our data read, and a new chunk may fill it. Its bytes may verify
  // against its CRCs, so a read during which any slot was handed out again
  // checks that the record still names the slot (else it reads anew). A
  // mismatch is only corruption if the record is still the one we read, and
  // if the disk's own CRCs disagree too (the first attempt may take them from
  // the CRC cache).
  for (int attempt = 0;; ++attempt) {
    const uint64_t allocations = slot_allocations_.load();
    ASSIGN_OR_RETURN(auto m, query(id));
    if (!m) return Status(ErrorCode::kNotFound, idText(id));
    if (offset >= m->length) return size_t{0};
    RETURN_ON_ERROR(CISTERN_FAULT("storage.read.after_meta"));
    size_t n = std::min<size_t>(out.size(), m->length - offset);
    Status s = readRange(*m, offset, n, out.data(), /*cached_crcs=*/attempt == 0);
    if (s.ok() && slot_allocations_.load() != allocations) {
      ASSIGN_OR_RETURN(auto now, query(id));
      if (!now || now->size_class != m->size_class || now->addr != m->addr) {
        if (attempt < 100) continue;  // moved: read it where it is now
        return Status(ErrorCode::kTargetBusy,
                      fmt::format("{} moved during 100 reads in a row", idText(id)));
      }
    }
    if (s.ok()) {
      static auto& read_bytes = metrics::Registry::global().counter(
          "storage_read_bytes_total", {}, "Chunk bytes read and verified");
      read_bytes.inc(n);
      return n;
    }
    if (s.code() == ErrorCode::kCorruption && attempt < 3) {
      ASSIGN_OR_RETURN(auto again, query(id));
      if (again != m || attempt == 0) continue;
    }
    return s.withContext(idText(id));
  }
}

std::optional<std::vector<Result<ChunkEngine::Location>>> ChunkEngine::locate(
    std::span<const LocateRange> ranges, bool in_memory_only) {
  // Per range: its record, and where its CRCs come from.
  struct Plan {
    std::optional<ChunkMeta> m;
    Blocks blocks;                     // none when the range starts at or past the chunk's end
    std::optional<CrcCache::Key> key;  // the page read is to be cached
    uint64_t generation = 0;
    AlignedBuffer page;
  };
  std::vector<Result<Location>> out;
  // As in read(): a slot handed out again between a record and its CRCs
  // could give another chunk's CRCs, which its bytes would then pass.
  for (int attempt = 0;; ++attempt) {
    out.clear();
    out.reserve(ranges.size());  // (reads below point into its locations)
    const uint64_t allocations = slot_allocations_.load();
    std::vector<Plan> plans(ranges.size());
    std::vector<IoRequest> io;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const LocateRange& r = ranges[i];
      Plan& p = plans[i];
      bool in_memory = true;
      auto m = in_memory_only ? queryInMemory(r.id, &in_memory) : query(r.id);
      if (!in_memory) return std::nullopt;
      if (!m.ok()) {
        out.emplace_back(m.status());
        continue;
      }
      if (!*m) {
        out.emplace_back(Status(ErrorCode::kNotFound, idText(r.id)));
        continue;
      }
      p.m = **m;
      auto file = groupFile(p.m->size_class, p.m->addr.group, /*open=*/!in_memory_only);
      if (file.ok() && !*file) return std::nullopt;  // not open now
      if (!file.ok()) {
        out.emplace_back(file.status());
        continue;
      }
      Location loc;
      loc.path = (*file)->path;
      loc.dev = (*file)->dev;
      loc.ino = (*file)->ino;
      loc.slot_offset = slotPos(p.m->size_class, p.m->addr);
      loc.length = p.m->length;
      const uint64_t end = std::min<uint64_t>(r.offset + r.length, p.m->length);
      if (r.offset < end) {
        p.blocks = blocksOf(p.m->length, r.offset, end);
        loc.crcs.resize(p.blocks.b1 - p.blocks.b0 + 1);
        if (p.blocks.b1 >= p.blocks.full) loc.crcs.back() = p.m->tail_crc;
      }
      constexpr uint64_t kPerPage = CrcCache::kEntriesPerPage;
      const uint64_t b0 = p.blocks.b0, in_area = p.blocks.in_area;
      if (in_area > 0 && crc_cache_ && p.blocks.inOnePage()) {
        CrcCache::Key key{p.m->size_class, p.m->addr, static_cast<uint32_t>(b0 / kPerPage)};
        if (!crc_cache_->get(key, p.m->chunk_version, static_cast<uint32_t>(b0 % kPerPage),
                             static_cast<uint32_t>(in_area), loc.crcs.data(), &p.generation)) {
          if (in_memory_only) return std::nullopt;
          // The whole page, cached once read.
          p.key = key;
          p.page = alignedBuffer(CrcCache::kPageBytes);
          io.push_back(IoRequest::readOf(
              (*file)->fd, p.page.get(), CrcCache::kPageBytes,
              crcPos(p.m->size_class, p.m->addr) + key.page * CrcCache::kPageBytes));
        }
      } else if (in_area > 0) {
        if (in_memory_only) return std::nullopt;
        io.push_back(IoRequest::readOf((*file)->fd, loc.crcs.data(), in_area * 4,
                                       crcPos(p.m->size_class, p.m->addr) + b0 * 4));
      }
      out.emplace_back(std::move(loc));
    }
    if (!io.empty()) {
      // (The requests point into `out`'s locations, which no longer move.)
      Status s = io_->run(io);
      if (!s.ok()) {
        for (auto& r : out)
          if (r.ok()) r = s;
        return out;
      }
    }
    bool moved = false;
    for (size_t i = 0; i < ranges.size(); ++i) {
      Plan& p = plans[i];
      if (!out[i].ok()) continue;
      if (p.key) {
        std::memcpy(out[i]->crcs.data(),
                    p.page.get() + (p.blocks.b0 % CrcCache::kEntriesPerPage) * 4,
                    p.blocks.in_area * 4);
      }
      if (slot_allocations_.load() != allocations) {
        auto now = query(ranges[i].id);
        if (!now.ok() || !*now || (*now)->size_class != p.m->size_class ||
            (*now)->addr != p.m->addr) {
          moved = true;
          continue;
        }
      }
      // Not cached before the slot was checked: a page of a later occupant
      // must not be kept under this version.
      if (p.key) crc_cache_->put(*p.key, p.m->chunk_version, p.generation, p.page.get());
    }
    if (!moved) return out;
    if (attempt >= 100) {
      for (auto& r : out)
        if (r.ok()) r = Status(ErrorCode::kTargetBusy, "chunks moved during 100 locates in a row");
      return out;
    }
  }
}

Status ChunkEngine::remove(ChunkId id, int64_t not_after_ns) {
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  std::lock_guard chunk_lock(chunkLock(id));
  RETURN_ON_ERROR(checkNotAfter(id, not_after_ns));
  ASSIGN_OR_RETURN(auto m, query(id));
  if (!m) return Status::OK();
  PendingCommit pending{nullptr, encodeChunkKey(id), {}, /*erase=*/true};
  RETURN_ON_ERROR(commit(pending).withContext(idText(id)));
  {
    std::lock_guard lock(alloc_mu_);
    data_bytes_[m->size_class] -= m->length;
    --chunks_;
  }
  releaseSlot(m->size_class, m->addr, /*removed=*/true);
  return Status::OK();
}

Result<uint32_t> ChunkEngine::removeFrom(uint64_t inode, uint32_t first, uint32_t limit, bool* more,
                                         int64_t not_after_ns) {
  *more = false;
  ASSIGN_OR_RETURN(auto chunks, list(ChunkId{inode, first}, limit + 1));
  uint32_t removed = 0;
  for (const auto& [id, m] : chunks) {
    if (id.inode != inode) break;
    if (removed == limit) {
      *more = true;
      break;
    }
    RETURN_ON_ERROR(remove(id, not_after_ns));
    ++removed;
  }
  return removed;
}

Result<std::vector<std::pair<ChunkId, ChunkMeta>>> ChunkEngine::list(ChunkId from, uint32_t limit) {
  std::vector<std::pair<ChunkId, ChunkMeta>> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(encodeChunkKey(from)); it->Valid() && out.size() < limit; it->Next()) {
    if (!isChunkKey(it->key())) continue;
    ASSIGN_OR_RETURN(ChunkId id,
                     decodeChunkKey(std::string_view(it->key().data(), it->key().size())));
    auto m = decodeChunkMeta(std::string_view(it->value().data(), it->value().size()));
    if (!m.ok()) return m.status().withContext(idText(id));
    out.emplace_back(id, *m);
  }
  RETURN_ON_ERROR(fromRocks(it->status(), "list chunks"));
  return out;
}

Result<std::vector<ChunkId>> ChunkEngine::scrub(uint64_t bytes_per_second,
                                                const std::atomic<bool>* stop) {
  static auto& scrubbed = metrics::Registry::global().counter(
      "storage_scrub_bytes_total", {}, "Chunk bytes re-read and verified by scrub");
  static auto& bad_total = metrics::Registry::global().counter(
      "storage_scrub_bad_chunks_total", {}, "Chunks that failed verification in a scrub");
  std::vector<ChunkId> bad;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  uint8_t* buf = scratch().piece.get(kPieceBytes);
  auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (stop && stop->load()) break;
    if (!isChunkKey(it->key())) continue;
    ASSIGN_OR_RETURN(ChunkId id,
                     decodeChunkKey(std::string_view(it->key().data(), it->key().size())));
    auto m = decodeChunkMeta(std::string_view(it->value().data(), it->value().size()));
    Status s = m.status();
    for (uint64_t at = 0; s.ok() && at < m->length; at += kPieceBytes) {
      size_t n = std::min<uint64_t>(kPieceBytes, m->length - at);
      s = readRange(*m, at, n, buf, /*cached_crcs=*/false);  // the disk's own CRCs
      bytes += n;
    }
    // Bytes and CRCs that agree but are not the record's (a write that went
    // to the wrong slot, or a slot's earlier content).
    if (s.ok()) s = checkCrcArea(*m);
    if (s.code() == ErrorCode::kCorruption) {
      // Overwritten since the scan began? Then the new version is checked by reads.
      auto now = query(id);
      if (now.ok() && *now == std::optional<ChunkMeta>(*m)) {
        bad.push_back(id);
        bad_total.inc();
      }
    } else if (!s.ok()) {
      return s.withContext(idText(id));
    }
    scrubbed.inc(m.ok() ? m->length : 0);
    if (bytes_per_second > 0) {
      auto due = t0 + std::chrono::duration<double>(static_cast<double>(bytes) /
                                                    static_cast<double>(bytes_per_second));
      std::this_thread::sleep_until(due);
    }
  }
  RETURN_ON_ERROR(fromRocks(it->status(), "scrub scan"));
  return bad;
}

ChunkEngine::Space ChunkEngine::space() const {
  Space out;
  struct statvfs vfs;
  if (::statvfs(options_.path.c_str(), &vfs) == 0) {
    out.fs_total_bytes = uint64_t{vfs.f_blocks} * vfs.f_frsize;
    out.fs_free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  }
  out.reserved_bytes = options_.reserved_bytes;
  out.failed = failed_;
  std::lock_guard logged_lock(logged_mu_);
  out.classes[0].slots_held = held_.size();
  std::lock_guard lock(alloc_mu_);
  out.chunks = chunks_;
  for (uint32_t c = 0; c < kClassCount; ++c) {
    auto& k = out.classes[c];
    k.slot_bytes = classBytes(c);
    k.slots_used = allocators_[c].usedSlots() - k.slots_held;
    k.slots_max = uint64_t{allocators_[c].slotsPerGroup()} * options_.groups_max;
    k.data_bytes = data_bytes_[c];
    k.slots_kept = allocators_[c].keptSlots();
    out.data_bytes += k.data_bytes;
    out.kept_bytes += k.slots_kept * slotStride(c);
  }
  return out;
}

uint64_t ChunkEngine::heldSlots(uint32_t size_class) const {
  if (size_class != 0) return 0;
  std::lock_guard lock(logged_mu_);
  return held_.size();
}

uint64_t ChunkEngine::usedSlots(uint32_t size_class) const {
  // Held slots are released to the allocator after they leave held_, so
  // with logged_mu_ held the difference never goes below zero.
  std::lock_guard logged_lock(logged_mu_);
  std::lock_guard lock(alloc_mu_);
  return allocators_[size_class].usedSlots() - (size_class == 0 ? held_.size() : 0);
}

}  // namespace cistern::storage
