// kv::Engine / kv::Transaction: the transactional, ordered key-value store
// behind all cluster state and metadata (DESIGN.md §3).
//
// The model is FoundationDB's. A transaction reads a consistent snapshot taken
// when it began (its read version) and sees its own writes; writes are
// buffered in the transaction and applied atomically by commit(). Read-write
// transactions are serializable: commit() fails with kTxnConflict when a
// transaction that committed after this one's read version wrote a key or a
// range that this one read (including rows that would have appeared in a
// range read, i.e. phantoms) or wrote. A failed transaction has no effect and
// is retried from scratch; runTransaction() does that with bounded retries.
// Reads taken with `snapshot = true` add no read conflict (use for data whose
// change does not invalidate the transaction).
//
// Threads: an Engine is thread-safe; a Transaction is used by one thread at a
// time. Lifetime: transactions must be destroyed before their engine.
// Memory: a transaction's buffered writes are bounded by
// EngineOptions::txn_bytes_max; range reads by RangeOptions::limit.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace cistern::kv {

struct KeyValue {
  std::string key;
  std::string value;
  bool operator==(const KeyValue&) const = default;
};

struct RangeOptions {
  // Maximum rows returned; 0 means kRangeLimitMax. Default: 0.
  uint32_t limit = 0;
  // Return rows from the end of the range backwards. Default: false.
  bool reverse = false;
  // Read without adding a read conflict range. Default: false.
  bool snapshot = false;
};
inline constexpr uint32_t kRangeLimitMax = 100'000;

struct RangeResult {
  std::vector<KeyValue> kvs;
  // True when the limit stopped the read before the end of the range; read
  // on from just after the last key (or before it, when reverse).
  bool more = false;
};

class ReadTransaction {
 public:
  virtual ~ReadTransaction() = default;
  // The value of `key`, or nullopt when absent.
  virtual Result<std::optional<std::string>> get(std::string_view key, bool snapshot = false) = 0;
  // Rows with begin <= key < end in key order (or reverse).
  virtual Result<RangeResult> getRange(std::string_view begin, std::string_view end,
                                       const RangeOptions& options = {}) = 0;
  // The commit version of the state this transaction reads.
  virtual uint64_t readVersion() const = 0;
};

// How durable a commit is when commit() returns (with
// EngineOptions::sync_commits; without it nothing is synced).
//   kSynced: on disk, with every commit before it.
//   kLazy: in the operating system (a process crash keeps it, a power loss
//     may not); durable once a later kSynced commit or Engine::sync()
//     returns, or within the store's lazy sync delay (RocksEngineOptions::
//     lazy_sync_ms). A crash keeps a prefix of the commits in version
//     order: never a commit without every one before it.
// Engines whose every commit is durable (etcd) treat kLazy as kSynced.
enum class Durability : uint8_t { kSynced, kLazy };

class Transaction : public ReadTransaction {
 public:
  // Default: kSynced.
  virtual void setDurability(Durability) {}
  // Writes are buffered; an invalid write (key or value too large, a write
  // after commit) makes the transaction fail and commit() return that error.
  virtual void set(std::string_view key, std::string_view value) = 0;
  virtual void clear(std::string_view key) = 0;
  // Clears begin <= key < end.
  virtual void clearRange(std::string_view begin, std::string_view end) = 0;
  // Adds `delta` to the counter at `key` (encodeCounter format; absent = 0)
  // when the transaction commits. Two transactions that only add to the same
  // key do not conflict; a transaction that read the key conflicts with an
  // add committed after its read version. Reads in this transaction see the
  // sum (a get() of the key adds a read conflict, as any read does).
  virtual void atomicAdd(std::string_view key, int64_t delta) = 0;
  // Atomically applies the writes, durably when EngineOptions::sync_commits
  // (see Durability).
  // Errors: kTxnConflict, kTxnTooOld (retry), kTxnTooLarge, kKeyTooLarge,
  // kValueTooLarge, kTxnFinished, kIOError. A transaction commits once.
  virtual Status commit() = 0;
  // The version this transaction committed at (valid after a successful commit).
  virtual uint64_t commitVersion() const = 0;
};

// Counter values: 8 bytes, little-endian two's complement. decodeCounter
// zero-extends shorter values and ignores bytes past the eighth.
std::string encodeCounter(int64_t v);
int64_t decodeCounter(std::string_view bytes);

struct EngineOptions {
  // Largest key accepted. Default: 10 KiB.
  uint32_t key_bytes_max = 10 * 1024;
  // Largest value accepted. Default: 1 MiB.
  uint32_t value_bytes_max = 1024 * 1024;
  // Largest sum of buffered writes in one transaction. Default: 16 MiB.
  uint64_t txn_bytes_max = 16ull << 20;
  // Committed transactions remembered for conflict checks. Past this, the
  // oldest are forgotten and transactions that began before them fail with
  // kTxnTooOld. Bounds the engine's memory. Default: 200,000.
  uint32_t conflict_history_max = 200'000;
  // Transactions older than this fail at commit with kTxnTooOld. Default: 10 s.
  uint32_t txn_lifetime_ms_max = 10'000;
  // fsync each commit (group-committed) before acknowledging. Default: true.
  bool sync_commits = true;
  // Who applies a logged batch while later transactions wait to be logged
  // (synced commits, a store with its own log): kAuto chooses per
  // batch from the measured times of an apply and of a hand-off
  // (docs/kv.md); kWriter: always the log writer; kHandoff: always a thread
  // of the batch's own transactions. Default: kAuto.
  enum class BatchApplier { kAuto, kWriter, kHandoff };
  BatchApplier batch_applier = BatchApplier::kAuto;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::unique_ptr<Transaction> begin() = 0;
  virtual std::unique_ptr<ReadTransaction> beginRead() = 0;
  // "mem" or "rocksdb".
  virtual std::string_view name() const = 0;
  // Makes every commit that returned before this call durable (kLazy ones
  // included). Errors: kIOError (the engine then fails every commit).
  virtual Status sync() { return Status::OK(); }
};

// The in-memory engine, for unit tests. Nothing survives its destruction.
std::unique_ptr<Engine> openMemEngine(const EngineOptions& options = {});

struct RocksEngineOptions {
  EngineOptions engine;
  // Directory of the RocksDB database; created if missing.
  std::string path;
  // RocksDB block cache. Default: 256 MiB.
  uint64_t block_cache_bytes = 256ull << 20;
  // One memtable; up to 3 exist at once. Default: 64 MiB.
  uint64_t write_buffer_bytes = 64ull << 20;
  // Commits go to cistern's own redo log (kv/commit_log.h: pre-zeroed
  // segments, O_DSYNC overwrites) instead of RocksDB's WAL. Default: true.
  bool commit_log = true;
  // Size of one log segment; at most log_segments_max exist, each reused once
  // a RocksDB flush covers it. Defaults: 16 MiB, 16.
  uint64_t log_segment_bytes = 16ull << 20;
  uint32_t log_segments_max = 16;
  // Synced commits write the log with O_DIRECT (CommitLogOptions::direct_io).
  // Default: true.
  bool log_direct_io = true;
  // kLazy commits are durable this long after the first unsynced one at the
  // latest (CommitLogOptions::lazy_sync_ms). Without the commit log (RocksDB's
  // WAL) every commit is synced. Default: 1,000 ms.
  uint32_t lazy_sync_ms = 1000;
};
// The embedded engine. Fails with kIOError naming the path if RocksDB cannot open it.
Result<std::unique_ptr<Engine>> openRocksEngine(const RocksEngineOptions& options);

struct RetryOptions {
  // Attempts before kTxnRetriesExhausted. Default: 100.
  uint32_t attempts_max = 100;
  // First backoff; doubles per retry up to backoff_ms_max, with jitter. Default: 1 ms.
  uint32_t backoff_ms_initial = 1;
  // Default: 100 ms.
  uint32_t backoff_ms_max = 100;
};

// Runs `body` in a fresh transaction and commits it, retrying on kTxnConflict
// and kTxnTooOld with backoff. Any other error from `body` or commit is
// returned as is. `body` may run several times: it must not have side
// effects outside the transaction that matter if it is repeated.
Status runTransaction(Engine& engine, const std::function<Status(Transaction&)>& body,
                      const RetryOptions& retry = {});
// Read-only variant: no commit, no retry needed.
Status runReadTransaction(Engine& engine, const std::function<Status(ReadTransaction&)>& body);

}  // namespace cistern::kv
