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

  void bind(ConfigBinder& b);
  Status validate() const;
};

// Opens the KV the options name (its errors name the backend and address).
Result<std::unique_ptr<kv::Engine>> openKv(const KvOptions& options);

}  // namespace cistern::server
