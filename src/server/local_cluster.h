// LocalCluster: mgmtd, meta and storage for one machine in one process, on
// the embedded RocksDB KV (`cistern up`).
//
// Layout of the data directory:
//   <data>/kv/          the metadata KV (RocksDB)
//   <data>/target-<i>/  storage target i (i = 1..K), one chunk engine each
// Target i serves chain i (replication 1). The meta and mgmt services share
// the main RPC endpoint; each target has its own storage endpoint (the next
// ports after the main one, or free ports when the main port is 0). mgmtd's
// GetRouting tells clients where everything is. A GC thread removes the
// chunks of deleted and truncated files through the storage RPC; a scrub
// worker per target re-verifies chunks at `scrub_bytes_per_second`.
// Everything is stopped and flushed by the destructor; data survives restarts
// (the target count only grows: existing target directories are reopened).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "net/endpoint.h"
#include "server/auth_options.h"
#include "storage/chunk_engine.h"
#include "storage/storage_service_options.h"

namespace cistern::server {

struct LocalClusterOptions {
  std::string data_dir = "./cistern-data";
  uint32_t targets = 1;
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;   // 0: free ports for everything
  uint16_t metrics_port = 0;  // 0: a free port
  uint64_t scrub_bytes_per_second = 32ull << 20;
  bool sync = true;  // fsync metadata and chunk commits
  // How long a client moving an inline file's bytes to chunks holds it
  // (meta::MetaOptions; tests shorten it).
  uint32_t inline_convert_lease_ms = 10000;
  // A client silent this long loses its write sessions (meta::MetaOptions;
  // the GC loop ends them every quarter of it, at most every second).
  uint32_t session_timeout_ms = 300000;
  // Every namespace change synced before it is acknowledged
  // (meta::MetaOptions::sync_namespace). Default: false.
  bool sync_namespace = false;
  // kv::RocksEngineOptions::lazy_sync_ms of the embedded KV. Default: 1,000.
  uint32_t kv_lazy_sync_ms = 1000;
  // Every target's chunk engine (path and sync are set per target) and
  // storage service.
  storage::ChunkEngineOptions engine;
  storage::StorageServiceOptions storage_service;
  // The RPC servers (net::ServerOptions): I/O threads of the meta + mgmt
  // server (0: one per core) and of each target's storage server, requests
  // read from one connection before their responses are written, open
  // connections per server (more are closed on accept), and checksums of
  // response payloads.
  uint32_t meta_rpc_threads = 0;
  uint32_t storage_rpc_threads = 1;
  uint32_t rpc_inflight_per_connection_max = 64;
  uint32_t rpc_connections_max = 4096;
  bool rpc_payload_crc = true;
  // Token and capability checks (auth.*; off without a key file).
  AuthOptions auth;

  // Binds what a config file may set (`cistern up --config`): storage.*,
  // meta.session_timeout_ms, meta.sync_namespace, kv.rocksdb.lazy_sync_ms, rpc.*, auth.*. The data
  // directory, targets and addresses are flags.
  void bind(ConfigBinder& b);
  // kInvalidArgument naming the option when a value cannot work; start()
  // checks it before creating anything.
  Status validate() const;
};

class LocalCluster {
 public:
  static Result<std::unique_ptr<LocalCluster>> start(const LocalClusterOptions& options);
  ~LocalCluster();

  net::Endpoint endpoint() const;  // meta + mgmt
  std::vector<net::Endpoint> storageEndpoints() const;
  uint16_t metricsPort() const;
  // A token of the cluster tenant with every right, for the mount of
  // `cistern up --mount` (empty when the cluster checks no tokens).
  std::string adminToken() const;

  struct Impl;

 private:
  explicit LocalCluster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cistern::server
