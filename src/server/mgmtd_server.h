// MgmtdServer: the mgmtd role of `cistern serve --role mgmtd`: the mgmt RPC
// service with a cluster manager (mgmtd/cluster_manager.h) on the cluster's
// KV, and a loop that steps the chains every `tick_ms`.
//
// Several mgmtd may run on one etcd: one is primary by an etcd lease
// (mgmtd/primary_lease.h) and serves RegisterNode, Heartbeat and
// CreateChains and steps the chains; the others answer those kNotPrimary
// (naming the primary) and take over within the lease's TTL when it dies.
// GetRouting is served by all. With the rocksdb backend there is one mgmtd.
#pragma once

#include <memory>
#include <string>

#include "common/result.h"
#include "net/endpoint.h"
#include "server/auth_options.h"
#include "server/kv_options.h"

namespace cistern::server {

struct MgmtdServerOptions {
  std::string listen = "127.0.0.1:7420";
  uint32_t heartbeat_timeout_ms = 10000;
  uint32_t tick_ms = 0;            // 0: a quarter of the heartbeat timeout
  uint32_t replace_after_s = 600;  // re-replication's grace period (0: never)
  uint32_t lease_ms = 3000;  // the primary's etcd lease (whole seconds, at least etcd's minimum)
  // etcd keeps every revision until compacted: the primary compacts, each
  // interval, the history older than what the previous pass saw (one
  // interval of history stays for reads in flight). 0: never.
  uint32_t compact_interval_s = 300;
  KvOptions kv;
  // Its calls to storage servers (routing pushes) carry a service token.
  AuthOptions auth;

  void bind(ConfigBinder& b);  // mgmtd.*, kv.* and auth.*
  Status validate() const;
};

class MgmtdServer {
 public:
  static Result<std::unique_ptr<MgmtdServer>> start(const MgmtdServerOptions& options);
  ~MgmtdServer();
  net::Endpoint endpoint() const;
  bool isPrimary() const;

  struct Impl;

 private:
  explicit MgmtdServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cistern::server
