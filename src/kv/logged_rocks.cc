#include "kv/logged_rocks.h"

#include <fmt/format.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include "common/endian.h"
#include "kv/rocks_batch.h"

namespace cistern::kv {
Result<uint64_t> LoggedRocks::readVersion(rocksdb::DB& db, std::string_view key) {
  std::string raw;
  rocksdb::Status s = db.Get(rocksdb::ReadOptions(), rocksdb::Slice(key.data(), key.size()), &raw);
  if (s.IsNotFound()) return uint64_t{0};
  RETURN_ON_ERROR(fromRocks(s, "read the applied version"));
  if (raw.size() != 8) {
    return Status(ErrorCode::kCorruption,
                  fmt::format("applied version of {} bytes (want 8)", raw.size()));
  }
  return getLE<uint64_t>(raw, 0);
}

void LoggedRocks::putVersion(rocksdb::WriteBatch& wb, std::string_view key, uint64_t version) {
  std::string v;
  appendLE<uint64_t>(v, version);
  (void)wb.Put(rocksdb::Slice(key.data(), key.size()), v);
}

Result<std::unique_ptr<LoggedRocks>> LoggedRocks::open(rocksdb::DB& db, Options options,
                                                       const Replay& replay) {
  std::unique_ptr<LoggedRocks> l(new LoggedRocks(db, std::move(options)));
  ASSIGN_OR_RETURN(l->persisted_, readVersion(db, l->options_.version_key));
  l->last_ = l->persisted_;
  LoggedRocks& self = *l;
  auto each = [&](const LogRecord& rec, WriteBatch& ops) { return replay(self, rec, ops); };
  ASSIGN_OR_RETURN(l->log_, CommitLog::open(l->options_.log, l->persisted_, each, &l->last_));
  return l;
}

LoggedRocks::~LoggedRocks() = default;

Status LoggedRocks::finishReplay(const std::function<Status()>& before_flush) {
  if (last_ == persisted_) return Status::OK();
  if (before_flush) RETURN_ON_ERROR(before_flush());
  return flush();
}

Status LoggedRocks::start(CommitLog::Checkpoint checkpoint) {
  return log_->start(last_ + 1, std::move(checkpoint));
}

Status LoggedRocks::append(uint64_t first, uint64_t last, const WriteBatch& batch, bool sync) {
  return log_->append(first, last, encodeLogBatch(batch), sync);
}

Status LoggedRocks::appendToDevice(uint64_t first, uint64_t last, const WriteBatch& batch) {
  return log_->appendToDevice(first, last, encodeLogBatch(batch));
}

Status LoggedRocks::apply(rocksdb::WriteBatch& wb, uint64_t version) {
  putVersion(wb, options_.version_key, version);
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;  // in the log until a checkpoint flushes the memtable
  return fromRocks(db_.Write(wo, &wb), "write");
}

Status LoggedRocks::apply(const WriteBatch& batch, uint64_t version) {
  rocksdb::WriteBatch wb;
  RETURN_ON_ERROR(appendToRocksBatch(batch, &wb));
  return apply(wb, version);
}

Status LoggedRocks::flush() { return fromRocks(db_.Flush(rocksdb::FlushOptions()), "flush"); }

void LoggedRocks::fail(const Status& s) { log_->fail(s); }

}  // namespace cistern::kv
