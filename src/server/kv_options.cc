#include "server/kv_options.h"

#include <fmt/format.h>

#include "common/config.h"
#include "kv/etcd_engine.h"

namespace cistern::server {

void KvOptions::bind(ConfigBinder& b) {
  b.bind("kv.backend", &backend,
         "where cluster state and metadata live: etcd (a cluster) or rocksdb (one process)");
  b.bind("kv.etcd.endpoints", &etcd_endpoints, "host:port of the etcd cluster's client URLs");
  b.bind("kv.etcd.prefix", &etcd_prefix,
         "every key of this cluster lives under it in etcd (several clusters may share one)");
  b.bind("kv.etcd.timeout_ms", &etcd_timeout_ms, "per etcd request");
  b.bind("kv.rocksdb.path", &rocksdb_path, "directory of the embedded KV (backend rocksdb)");
  b.bind("kv.rocksdb.lazy_sync_ms", &rocksdb_lazy_sync_ms, kLazySyncHelp);
}

Status KvOptions::validate() const {
  if (backend != "etcd" && backend != "rocksdb")
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("kv.backend {:?}: etcd or rocksdb", backend));
  if (backend == "etcd" && etcd_endpoints.empty())
    return Status(ErrorCode::kInvalidArgument, "kv.etcd.endpoints is empty");
  if (backend == "etcd" && etcd_prefix.empty())
    return Status(ErrorCode::kInvalidArgument, "kv.etcd.prefix is empty");
  RETURN_ON_ERROR(checkOptionRange("kv.rocksdb.lazy_sync_ms", rocksdb_lazy_sync_ms, 1, 600000));
  return checkOptionRange("kv.etcd.timeout_ms", etcd_timeout_ms, 100, 600000);
}

Result<std::unique_ptr<kv::Engine>> openKv(const KvOptions& options) {
  RETURN_ON_ERROR(options.validate());
  if (options.backend == "rocksdb") {
    kv::RocksEngineOptions ro;
    ro.path = options.rocksdb_path;
    ro.lazy_sync_ms = options.rocksdb_lazy_sync_ms;
    return kv::openRocksEngine(ro);
  }
  kv::EtcdEngineOptions eo;
  eo.endpoints = options.etcd_endpoints;
  eo.prefix = options.etcd_prefix;
  eo.timeout_ms = options.etcd_timeout_ms;
  auto engine = kv::openEtcdEngine(eo);
  if (!engine.ok())
    return engine.status().withContext(
        fmt::format("etcd at {}", fmt::join(options.etcd_endpoints, ",")));
  return engine;
}

}  // namespace cistern::server
