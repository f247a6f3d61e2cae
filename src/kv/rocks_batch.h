// Internal: a kv::WriteBatch as a RocksDB WriteBatch. Shared by the RocksDB
// store (rocks_store.cc) and the chunk engine's metadata, which both apply
// commit-log records to a RocksDB with its WAL off.
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
