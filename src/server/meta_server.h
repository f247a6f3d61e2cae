// MetaServer: the meta role of `cistern serve --role meta`: the meta RPC
// service over the cluster's KV (etcd), and the GC loop that removes the
// chunks of deleted and cut files through the chains' heads.
//
// Several meta servers serve one namespace side by side: every operation
// is a KV transaction, so they need no leader and hold nothing another
// lacks. `statfs` sums the targets' file systems (their Space, at most
// every 2 s) over the replication. Each lists itself in the routing table
// (ClusterConfig.meta_endpoints) when it starts and unlists itself on a
// clean stop;
// clients go to the next one when one does not answer (a SIGKILLed one
// stays listed and costs a client one failed connect). Unlike a storage
// server it needs no lease from mgmtd: it has no state of its own that
// could go stale.
//
// KV lease: a meta server cut off from the KV (a partition) could only
// answer after each call's KV timeout, holding its clients that long. So it
// reads the KV every quarter of `kv_lease_ms` and serves only while the
// last read that succeeded was sent less than `kv_lease_ms` ago; past it,
// every call is answered kNotServing at once, and clients move to another
// meta server (docs/chain_protocol.md, "Partitions").
#pragma once

#include <memory>
#include <string>

#include "common/result.h"
#include "net/endpoint.h"
#include "server/auth_options.h"
#include "server/kv_options.h"

namespace cistern::server {

struct MetaServerOptions {
  std::string listen = "127.0.0.1:7410";
  std::string advertise;  // as StorageServerOptions::advertise
  uint32_t session_timeout_ms = 300000;
  bool sync_namespace = false;  // meta::MetaOptions::sync_namespace
  uint32_t rpc_threads = 2;
  // 0: no lease (always serve). Default: half mgmtd's default heartbeat timeout.
  uint32_t kv_lease_ms = 5000;
  KvOptions kv;
  AuthOptions auth;

  void bind(ConfigBinder& b);  // meta.*, kv.* and auth.*
  Status validate() const;
};

class MetaServer {
 public:
  static Result<std::unique_ptr<MetaServer>> start(const MetaServerOptions& options);
  ~MetaServer();
  net::Endpoint endpoint() const;

  struct Impl;

 private:
  explicit MetaServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cistern::server
