// LoggedRocks: a RocksDB database whose redo log is a CommitLog instead of
// RocksDB's WAL (commit_log.h says why). Every batch applied through it also
// stores its version under `version_key`, so the version in RocksDB's files
// after a crash says where the log's replay starts; a checkpoint (a flush)
// lets the log reuse the segments it covers.
//
// One component for both users of the pattern: the KV's RocksDB store
// (rocks_store.cc) and each storage target's chunk metadata
// (storage/chunk_meta_log.cc). What a record means is theirs: replay hands
// each record's decoded batch to the owner, which applies what it keeps.
//
// Life: open() reads the persisted version and replays the log past it;
// finishReplay() flushes what replay applied; start() begins a new epoch of
// the log with the owner's checkpoint. Thread-safety: append and apply may
// be called from many threads (the owner orders versions); the rest once.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/result.h"
#include "kv/commit_log.h"

namespace rocksdb {
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace cistern::kv {

class LoggedRocks {
 public:
  struct Options {
    CommitLogOptions log;
    // Where each applied batch's version is stored (8 bytes, little-endian):
    // a key outside every range the owner uses.
    std::string version_key;
  };

  // Gets each record past the persisted version and its decoded batch, and
  // applies what it keeps with `self.apply()`.
  using Replay = std::function<Status(LoggedRocks& self, const LogRecord&, WriteBatch&)>;

  // Reads the version `db` holds and replays the log's records past it, in
  // order, through `replay`. `db` must outlive the LoggedRocks.
  static Result<std::unique_ptr<LoggedRocks>> open(rocksdb::DB& db, Options options,
                                                   const Replay& replay);
  ~LoggedRocks();
  LoggedRocks(const LoggedRocks&) = delete;
  LoggedRocks& operator=(const LoggedRocks&) = delete;

  // The version RocksDB's files held when opened, and the last one replayed.
  uint64_t persistedVersion() const { return persisted_; }
  uint64_t lastVersion() const { return last_; }

  // After replay: when it applied anything, runs `before_flush` (the owner
  // makes durable what the records point at) and flushes RocksDB, so that
  // nothing replayed is needed again.
  Status finishReplay(const std::function<Status()>& before_flush = nullptr);
  // Starts a new epoch of the log (the next append carries lastVersion() + 1)
  // and its checkpoint thread, which calls `checkpoint` when segments run low.
  Status start(CommitLog::Checkpoint checkpoint);

  // The batch as the log record of versions [first, last] (commit_log.h).
  Status append(uint64_t first, uint64_t last, const WriteBatch& batch, bool sync);
  Status appendToDevice(uint64_t first, uint64_t last, const WriteBatch& batch);
  // Applies `wb` with `version` under the version key, RocksDB's WAL off
  // (the log holds it until a checkpoint).
  Status apply(rocksdb::WriteBatch& wb, uint64_t version);
  Status apply(const WriteBatch& batch, uint64_t version);
  // Flushes RocksDB's memtables: every version applied before is in its files.
  Status flush();
  // Every current and later append fails with `s`.
  void fail(const Status& s);

  CommitLog& log() { return *log_; }

  // The version stored under `key` in `db`: 0 when absent, kCorruption when
  // it is not 8 bytes. Also for a database that uses RocksDB's WAL instead.
  static Result<uint64_t> readVersion(rocksdb::DB& db, std::string_view key);
  // Adds `version` under `key` to `wb`.
  static void putVersion(rocksdb::WriteBatch& wb, std::string_view key, uint64_t version);

 private:
  LoggedRocks(rocksdb::DB& db, Options options) : db_(db), options_(std::move(options)) {}

  rocksdb::DB& db_;
  const Options options_;
  std::unique_ptr<CommitLog> log_;
  uint64_t persisted_ = 0;
  uint64_t last_ = 0;
};

}  // namespace cistern::kv
