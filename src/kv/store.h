// Internal: the storage backend under the transaction layer (occ_engine.h).
//
// A Store offers consistent snapshots and atomic application of write
// batches; it knows nothing of conflicts. occ_engine serializes apply() calls
// (one at a time, in commit-version order), so a Store needs no ordering logic
// of its own. Snapshots and iterators may be used from any thread while apply
// runs.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace cistern::kv {

struct WriteOp {
  // kAdd exists only inside the transaction layer: it is folded into a kSet
  // before a batch reaches Store::apply().
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
  virtual void seek(std::string_view key) = 0;         // first row >= key
  virtual void seekLast() = 0;                         // last row in the range
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
  // Applies the batch atomically; `version` increases with every call.
  virtual Status apply(const WriteBatch& batch, uint64_t version, bool sync) = 0;
  virtual std::string_view name() const = 0;
};

}  // namespace cistern::kv
