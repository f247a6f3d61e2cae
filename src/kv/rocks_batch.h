// Internal to the KV: a kv::WriteBatch as a RocksDB WriteBatch, for the
// RocksDB store (rocks_store.cc) and LoggedRocks (logged_rocks.h).
#pragma once

#include "common/status.h"
#include "kv/store.h"

namespace rocksdb {
class WriteBatch;
}

namespace cistern::kv {

// Appends the operations of `batch` to `out`. A kAdd (never folded) is
// kInternal.
Status appendToRocksBatch(const WriteBatch& batch, rocksdb::WriteBatch* out);

}  // namespace cistern::kv
