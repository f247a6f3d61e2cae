// The chunk engine's group commit: writers' records batched through two
// pipelined stages (log append, then data sync and apply), and the syncs of
// unsynced writes (docs/chunk_format.md, "Write protocol").
#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "common/fault.h"
#include "kv/logged_rocks.h"
#include "storage/chunk_engine_internal.h"

namespace cistern::storage {

using namespace engine_detail;

// Group commit in two pipelined stages (common/group_commit.h, led by the
// writers). With the metadata log (the default), stage 1 appends the batch's
// records to the log and stage 2 makes them durable and applies them to
// RocksDB's memtable. A batch that wrote group files has its record go out
// with O_DIRECT unsynced: stage 2's fdatasync of those files is a device
// cache flush that makes the data and the record durable at once (one flush
// per batch instead of two; see docs/chunk_format.md, "Write protocol"). A
// batch without group files (removes, logged writes) has its record synced
// in stage 1. Without the log, stage 1 fdatasyncs the group files and stage
// 2 writes the records to RocksDB with a synced WAL write. Batches enter
// stage 2 in the order they left stage 1 (several that left it during one
// stage 2 share the next), and a write is acknowledged only when its batch
// has left stage 2, so every earlier record is durable then.
Status ChunkEngine::commit(PendingCommit& p) {
  p.entry.item = &p;
  return group_commit_->commit(p.entry);
}

std::vector<ChunkEngine::PendingCommit*> ChunkEngine::CommitStages::pendingOf(
    const std::vector<GroupCommit::Entry*>& batch) {
  std::vector<PendingCommit*> out;
  out.reserve(batch.size());
  for (GroupCommit::Entry* e : batch) out.push_back(static_cast<PendingCommit*>(e->item));
  return out;
}

// One log record per batch: logged data bounds how many go at once.
size_t ChunkEngine::CommitStages::take(const std::deque<GroupCommit::Entry*>& queued) {
  size_t take = 0;
  uint64_t bytes = 0;
  for (; take < queued.size(); ++take) {
    bytes += static_cast<PendingCommit*>(queued[take]->item)->logged.size();
    if (take > 0 && bytes > engine_->log_batch_bytes_max_) break;
  }
  return take;
}

Status ChunkEngine::CommitStages::stage1(const std::vector<GroupCommit::Entry*>& batch) {
  std::vector<PendingCommit*> pending = pendingOf(batch);
  return engine_->meta_log_ ? engine_->logRecords(pending) : engine_->syncData(&pending);
}

Status ChunkEngine::CommitStages::stage2(const std::vector<GroupCommit::Entry*>& batch) {
  std::vector<PendingCommit*> pending = pendingOf(batch);
  return engine_->meta_log_ ? engine_->syncAndApply(pending) : engine_->writeRecords(pending);
}

namespace {

metrics::Histogram& batchSizes() {
  static auto& h = metrics::Registry::global().histogram(
      "storage_commit_batch_size", {}, "Chunk writes sharing one data sync and metadata batch");
  return h;
}

}  // namespace

rocksdb::WriteBatch ChunkEngine::PendingCommit::recordsBatch(
    const std::vector<PendingCommit*>& batch) {
  rocksdb::WriteBatch wb;
  for (const PendingCommit* p : batch) {
    if (p->erase)
      (void)wb.Delete(p->key);
    else
      (void)wb.Put(p->key, p->value);
  }
  return wb;
}

// Without the metadata log: the records in one synced RocksDB write.
Status ChunkEngine::writeRecords(const std::vector<PendingCommit*>& batch) {
  batchSizes().observe(batch.size());
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  rocksdb::WriteBatch wb = PendingCommit::recordsBatch(batch);
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
  // Stage 2's fdatasync of the batch's group files flushes the record too.
  Status ls = !options_.sync               ? meta_log_->append(version, version, ops, false)
              : files && flush_covers_log_ ? meta_log_->appendToDevice(version, version, ops)
                                           : meta_log_->append(version, version, ops, true);
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
  rocksdb::WriteBatch wb = PendingCommit::recordsBatch(batch);
  const uint64_t version = batch.back()->version;
  if (Status ps = meta_log_->apply(wb, version); !ps.ok())
    return fail("metadata write: " + ps.toString());
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

}  // namespace cistern::storage
