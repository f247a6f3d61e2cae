// The RocksDB Store: snapshots are RocksDB snapshots, a batch is one
// WriteBatch written with the WAL (synced when asked), so a crash leaves each
// batch wholly applied or absent.
#include <fmt/format.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/options_util.h>
#include <rocksdb/write_batch.h>

#include "common/log.h"
#include "kv/occ_engine.h"
#include "kv/store.h"

namespace cistern::kv {
namespace {

Status fromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::OK();
  ErrorCode code = s.IsNoSpace()      ? ErrorCode::kNoSpace
                   : s.IsCorruption() ? ErrorCode::kCorruption
                                      : ErrorCode::kIOError;
  return Status(code, fmt::format("rocksdb {}: {}", what, s.ToString()));
}

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

class RocksStore final : public Store {
 public:
  explicit RocksStore(std::unique_ptr<rocksdb::DB> db) : db_(std::move(db)) {}
  ~RocksStore() override {
    rocksdb::Status s = db_->Close();
    if (!s.ok()) CLOG_WARN("kv", "rocksdb close: {}", s.ToString());
  }

  std::shared_ptr<StoreSnapshot> snapshot() override {
    return std::make_shared<RocksSnapshot>(db_.get());
  }

  Status apply(const WriteBatch& batch, uint64_t /*version*/, bool sync) override {
    rocksdb::WriteBatch wb;
    for (const WriteOp& op : batch) {
      rocksdb::Status s;
      switch (op.kind) {
        case WriteOp::kSet:
          s = wb.Put(slice(op.key), slice(op.value));
          break;
        case WriteOp::kClear:
          s = wb.Delete(slice(op.key));
          break;
        case WriteOp::kClearRange:
          s = wb.DeleteRange(slice(op.key), slice(op.value));
          break;
        case WriteOp::kAdd:
          return Status(ErrorCode::kInternal, "kAdd reached the store");
      }
      RETURN_ON_ERROR(fromRocks(s, "batch"));
    }
    rocksdb::WriteOptions wo;
    wo.sync = sync;
    return fromRocks(db_->Write(wo, &wb), "write");
  }

  std::string_view name() const override { return "rocksdb"; }

 private:
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace

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
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, options.path, &raw);
  if (!s.ok()) return fromRocks(s, fmt::format("open {}", options.path));
  auto store = std::make_unique<RocksStore>(std::unique_ptr<rocksdb::DB>(raw));
  return std::unique_ptr<Engine>(std::make_unique<OccEngine>(std::move(store), options.engine));
}

}  // namespace cistern::kv
