// Internal to the KV: a kv::WriteBatch as a RocksDB WriteBatch, for the
// RocksDB store (rocks_store.cc) and LoggedRocks (logged_rocks.h).
#pragma once

#include <string_view>

#include "common/status.h"
#include "kv/store.h"

namespace rocksdb {
class Status;
class WriteBatch;
}  // namespace rocksdb

namespace cistern::kv {

// A RocksDB status as ours: kNoSpace, kCorruption or kIOError, naming `what`.
Status fromRocks(const rocksdb::Status& s, std::string_view what);

// Appends the operations of `batch` to `out`. A kAdd (never folded) is
// kInternal.
Status appendToRocksBatch(const WriteBatch& batch, rocksdb::WriteBatch* out);

}  // namespace cistern::kv
