// Internal: the storage backend under the transaction layer (occ_engine.h).
//
// A Store offers consistent snapshots and atomic application of write
// batches; it knows nothing of conflicts. occ_engine makes each batch durable
// with log() (calls for successive batches may overlap) and then applies it
// with apply() (one at a time, in commit-version order). Snapshots and
// iterators may be used from any thread while apply runs.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace cistern::kv {

struct WriteOp {
  // kAdd exists only inside the transaction layer and the redo log: it is
  // folded into a kSet before a batch reaches Store::apply().
  enum Kind : uint8_t { kSet, kClear, kClearRange, kAdd };
  Kind kind;
  std::string key;    // begin for kClearRange
  std::string value;  // end for kClearRange; 8-byte delta for kAdd
};
using WriteBatch = std::vector<WriteOp>;

// Iterates visible rows of a snapshot inside [begin, end).
class StoreIterator {
 public:
  virtual ~StoreIterator() = default;
  virtual void seek(std::string_view key) = 0;  // first row >= key
  virtual void seekLast() = 0;                  // last row in the range
  virtual bool valid() const = 0;
  virtual void next() = 0;
  virtual void prev() = 0;
  virtual std::string_view key() const = 0;
  virtual std::string_view value() const = 0;
  virtual Status status() const = 0;
};

class StoreSnapshot {
 public:
  virtual ~StoreSnapshot() = default;
  virtual Result<std::optional<std::string>> get(std::string_view key) = 0;
  virtual std::unique_ptr<StoreIterator> iterate(std::string_view begin, std::string_view end) = 0;
};

class Store {
 public:
  virtual ~Store() = default;
  // A snapshot of everything applied so far.
  virtual std::shared_ptr<StoreSnapshot> snapshot() = 0;
  // The last commit version applied by an earlier process (0 for a new or
  // volatile store); versions continue from it.
  virtual uint64_t recoveredVersion() const { return 0; }
  // Makes the batch of versions [first, last] durable (`sync`) before it is
  // applied, so a crash after it returns replays it. Calls for successive
  // batches may overlap; each is made after the previous batch's call began.
  // Stores without a redo log of their own do nothing here.
  virtual Status log(const WriteBatch& /*batch*/, uint64_t /*first*/, uint64_t /*last*/,
                     bool /*sync*/) {
    return Status::OK();
  }
  // True when log() makes batches durable (then apply() need not). Only
  // such stores log batches unsynced (Durability::kLazy).
  virtual bool hasLog() const { return false; }
  // Makes every batch whose log() returned durable (see Durability).
  virtual Status sync() { return Status::OK(); }
  // Applies the batch atomically and makes it visible; `version` (its last
  // version) increases with every call. Without a redo log, `sync` asks for
  // the write to be durable before it returns.
  virtual Status apply(const WriteBatch& batch, uint64_t version, bool sync) = 0;
  // The engine stopped accepting writes with `s`: log() calls still waiting
  // for their turn return it.
  virtual void fail(const Status& /*s*/) {}
  virtual std::string_view name() const = 0;
};

}  // namespace cistern::kv
