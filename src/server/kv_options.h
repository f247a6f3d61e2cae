// Which KV a cluster's services keep their state in (`kv.*` config keys):
// an etcd cluster (the default for `cistern serve`) or an embedded RocksDB
// (one process, tests).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "kv/engine.h"

namespace cistern {
class ConfigBinder;
}

namespace cistern::server {

struct KvOptions {
  std::string backend = "etcd";  // "etcd" or "rocksdb"
  std::vector<std::string> etcd_endpoints = {"127.0.0.1:2379"};
  std::string etcd_prefix = "cistern/";
  uint32_t etcd_timeout_ms = 5000;
  std::string rocksdb_path = "./cistern-data/kv";
  uint32_t rocksdb_lazy_sync_ms = 1000;  // kv::RocksEngineOptions::lazy_sync_ms

  void bind(ConfigBinder& b);
  Status validate() const;
};

// Opens the KV the options name (its errors name the backend and address).
Result<std::unique_ptr<kv::Engine>> openKv(const KvOptions& options);

// What `kv.rocksdb.lazy_sync_ms` and `meta.sync_namespace` mean, for every
// server that binds them.
inline constexpr const char* kLazySyncHelp =
    "unsynced namespace changes are durable this long after the first of them at the latest "
    "(1 to 600000)";
inline constexpr const char* kSyncNamespaceHelp =
    "sync every namespace change before acknowledging it (off: durable at the next fsync of a "
    "file or directory, or within kv.rocksdb.lazy_sync_ms)";

}  // namespace cistern::server
