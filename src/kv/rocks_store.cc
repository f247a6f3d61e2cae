// The RocksDB Store: snapshots are RocksDB snapshots, a batch is one
// WriteBatch, so a crash leaves each batch wholly applied or absent. The
// redo log is the commit log (commit_log.h; RocksDB's WAL off), or with
// RocksEngineOptions::commit_log = false RocksDB's own WAL, synced per batch.
#include <fmt/format.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/options_util.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <mutex>

#include "common/log.h"
#include "kv/logged_rocks.h"
#include "kv/occ_engine.h"
#include "kv/rocks_batch.h"
#include "kv/store.h"

namespace cistern::kv {
Status fromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::OK();
  ErrorCode code = s.IsNoSpace()      ? ErrorCode::kNoSpace
                   : s.IsCorruption() ? ErrorCode::kCorruption
                                      : ErrorCode::kIOError;
  return Status(code, fmt::format("rocksdb {}: {}", what, s.ToString()));
}

namespace {

rocksdb::Slice slice(std::string_view s) { return {s.data(), s.size()}; }

class RocksIterator final : public StoreIterator {
 public:
  RocksIterator(rocksdb::DB* db, const rocksdb::Snapshot* snap, std::string_view begin,
                std::string_view end)
      : begin_(begin), end_(end), lower_(begin_), upper_(end_) {
    rocksdb::ReadOptions ro;
    ro.snapshot = snap;
    ro.iterate_lower_bound = &lower_;
    ro.iterate_upper_bound = &upper_;
    it_.reset(db->NewIterator(ro));
  }
  void seek(std::string_view key) override { it_->Seek(slice(key)); }
  void seekLast() override { it_->SeekToLast(); }
  bool valid() const override { return it_->Valid(); }
  void next() override { it_->Next(); }
  void prev() override { it_->Prev(); }
  std::string_view key() const override {
    auto k = it_->key();
    return {k.data(), k.size()};
  }
  std::string_view value() const override {
    auto v = it_->value();
    return {v.data(), v.size()};
  }
  Status status() const override { return fromRocks(it_->status(), "iterate"); }

 private:
  std::string begin_, end_;
  rocksdb::Slice lower_, upper_;
  std::unique_ptr<rocksdb::Iterator> it_;
};

class RocksSnapshot final : public StoreSnapshot {
 public:
  RocksSnapshot(rocksdb::DB* db) : db_(db), snap_(db->GetSnapshot()) {}
  ~RocksSnapshot() override { db_->ReleaseSnapshot(snap_); }

  Result<std::optional<std::string>> get(std::string_view key) override {
    rocksdb::ReadOptions ro;
    ro.snapshot = snap_;
    std::string value;
    rocksdb::Status s = db_->Get(ro, slice(key), &value);
    if (s.IsNotFound()) return std::optional<std::string>();
    RETURN_ON_ERROR(fromRocks(s, "get"));
    return std::optional<std::string>(std::move(value));
  }

  std::unique_ptr<StoreIterator> iterate(std::string_view begin, std::string_view end) override {
    return std::make_unique<RocksIterator>(db_, snap_, begin, end);
  }

 private:
  rocksdb::DB* db_;
  const rocksdb::Snapshot* snap_;
};

// The version of the last batch applied, stored with every batch so that a
// crash leaves it consistent with the data RocksDB kept. Keys from "\xff\xff"
// up are reserved (occ_engine.cc refuses them).
constexpr std::string_view kAppliedKey = "\xff\xff/engine/applied_version";

// Writes the batch and its version as one RocksDB batch, through RocksDB's
// WAL (the store without a commit log).
Status writeBatch(rocksdb::DB* db, const WriteBatch& batch, uint64_t version, bool sync) {
  rocksdb::WriteBatch wb;
  RETURN_ON_ERROR(appendToRocksBatch(batch, &wb));
  LoggedRocks::putVersion(wb, kAppliedKey, version);
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  return fromRocks(db->Write(wo, &wb), "write");
}

class RocksStore final : public Store {
 public:
  RocksStore(std::unique_ptr<rocksdb::DB> db, uint64_t recovered)
      : db_(std::move(db)), recovered_(recovered), applied_(recovered) {}
  ~RocksStore() override {
    snap_.reset();
    bool had_log = log_ != nullptr;
    log_.reset();  // stops the checkpoint thread first
    if (had_log) {
      rocksdb::Status f = db_->Flush(rocksdb::FlushOptions());
      if (!f.ok()) CLOG_WARN("kv", "rocksdb flush at close: {}", f.ToString());
    }
    rocksdb::Status s = db_->Close();
    if (!s.ok()) CLOG_WARN("kv", "rocksdb close: {}", s.ToString());
  }

  // With a commit log, RocksDB's WAL is off and the log is the redo log.
  void setLog(std::unique_ptr<LoggedRocks> log) { log_ = std::move(log); }

  // Flushes the memtables; every version applied before the call is then in
  // RocksDB's files.
  Result<uint64_t> checkpoint() {
    uint64_t v = applied_.load(std::memory_order_acquire);
    RETURN_ON_ERROR(log_->flush());
    return v;
  }

  // Transactions that start between two batches share one RocksDB snapshot:
  // taking and releasing one locks the DB mutex, which the writes contend
  // for. A snapshot is labelled with the version applied before it was taken,
  // so it holds at least that version.
  std::shared_ptr<StoreSnapshot> snapshot() override {
    std::lock_guard lock(snap_mu_);
    uint64_t v = applied_.load(std::memory_order_acquire);
    if (!snap_ || snap_version_ != v) {
      snap_ = std::make_shared<RocksSnapshot>(db_.get());
      snap_version_ = v;
    }
    return snap_;
  }

  uint64_t recoveredVersion() const override { return recovered_; }

  bool hasLog() const override { return log_ != nullptr; }
  Status log(const WriteBatch& batch, uint64_t first, uint64_t last, bool sync) override {
    if (!log_) return Status::OK();
    return log_->append(first, last, batch, sync);
  }

  Status sync() override { return log_ ? log_->log().sync() : Status::OK(); }

  void fail(const Status& s) override {
    if (log_) log_->fail(s);
  }

  Status apply(const WriteBatch& batch, uint64_t version, bool sync) override {
    // With the log: durable there already, RocksDB's WAL is off.
    RETURN_ON_ERROR(log_ ? log_->apply(batch, version)
                         : writeBatch(db_.get(), batch, version, sync));
    applied_.store(version, std::memory_order_release);
    return Status::OK();
  }

  std::string_view name() const override { return "rocksdb"; }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  std::unique_ptr<LoggedRocks> log_;  // set before the engine runs
  const uint64_t recovered_;
  std::atomic<uint64_t> applied_;
  std::mutex snap_mu_;
  std::shared_ptr<StoreSnapshot> snap_;  // GUARDED_BY(snap_mu_)
  uint64_t snap_version_ = 0;            // GUARDED_BY(snap_mu_)
};

}  // namespace

Status appendToRocksBatch(const WriteBatch& batch, rocksdb::WriteBatch* out) {
  for (const WriteOp& op : batch) {
    rocksdb::Status s;
    switch (op.kind) {
      case WriteOp::kSet:
        s = out->Put(slice(op.key), slice(op.value));
        break;
      case WriteOp::kClear:
        s = out->Delete(slice(op.key));
        break;
      case WriteOp::kClearRange:
        s = out->DeleteRange(slice(op.key), slice(op.value));
        break;
      case WriteOp::kAdd:
        return Status(ErrorCode::kInternal, "kAdd reached the store");
    }
    RETURN_ON_ERROR(fromRocks(s, "batch"));
  }
  return Status::OK();
}

Result<std::unique_ptr<Engine>> openRocksEngine(const RocksEngineOptions& options) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.IncreaseParallelism(2);
  // Memory is bounded by configuration: memtables (write_buffer_bytes each,
  // at most 3) plus the block cache.
  o.write_buffer_size = options.write_buffer_bytes;
  o.max_write_buffer_number = 3;
  o.compression = rocksdb::kNoCompression;
  o.bottommost_compression = rocksdb::kZSTD;
  o.max_open_files = 1000;  // well under the 20,000 per-process cap
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  // Index and filter blocks count against the cache, so memory does not grow
  // with the number of keys.
  table.cache_index_and_filter_blocks = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, options.path, &raw);
  if (!s.ok()) return fromRocks(s, fmt::format("open {}", options.path));
  std::unique_ptr<rocksdb::DB> db(raw);
  ASSIGN_OR_RETURN(uint64_t persisted, LoggedRocks::readVersion(*db, kAppliedKey));
  if (!options.commit_log) {
    auto store = std::make_unique<RocksStore>(std::move(db), persisted);
    return std::unique_ptr<Engine>(std::make_unique<OccEngine>(std::move(store), options.engine));
  }

  // Replay what the commit log holds past the persisted version, persist it,
  // then start a new epoch of the log.
  rocksdb::DB* dbp = db.get();
  auto replay = [dbp](LoggedRocks& self, const LogRecord& rec, WriteBatch& ops) -> Status {
    RETURN_ON_ERROR(foldAdds([dbp] { return std::make_shared<RocksSnapshot>(dbp); }, &ops));
    return self.apply(ops, rec.last);  // persisted by finishReplay's flush
  };
  LoggedRocks::Options lo;
  lo.log.dir = options.path + "/commit-log";
  lo.log.segment_bytes = options.log_segment_bytes;
  lo.log.segments_max = options.log_segments_max;
  lo.log.direct_io = options.log_direct_io && options.engine.sync_commits;
  lo.log.lazy_sync_ms = options.lazy_sync_ms;
  lo.version_key = std::string(kAppliedKey);
  ASSIGN_OR_RETURN(auto log, LoggedRocks::open(*db, std::move(lo), replay));
  RETURN_ON_ERROR(log->finishReplay());
  auto store = std::make_unique<RocksStore>(std::move(db), log->lastVersion());
  RocksStore* sp = store.get();
  RETURN_ON_ERROR(log->start([sp] { return sp->checkpoint(); }));
  store->setLog(std::move(log));
  return std::unique_ptr<Engine>(std::make_unique<OccEngine>(std::move(store), options.engine));
}

}  // namespace cistern::kv
