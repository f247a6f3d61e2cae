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
