// MgmtService: mgmtd's RPC face (cistern.mgmt.MgmtService in
// src/proto/mgmt.proto). GetRouting answers the routing table as the KV
// holds it (routing_table.h), with each target's health from `Hooks`; Fsck
// runs the check that whoever composes the services provides (it needs meta
// and every target's chunk list, which mgmtd does not own); RegisterNode,
// Heartbeat and CreateChains go to the cluster manager of a cluster's mgmtd.
//
// Both run on a small pool of their own, never on the RPC I/O threads.
// Construct before server.start(); destroy after server.stop().
#pragma once

#include <asio/thread_pool.hpp>

#include <functional>

#include "kv/engine.h"
#include "mgmt.pb.h"
#include "net/rpc_server.h"

namespace cistern::mgmtd {

class ClusterManager;

struct MgmtHooks {
  // Whether target `id` has failed (an fsync error, a lost disk). Default: none has.
  std::function<bool(uint32_t id)> target_failed;
  // The namespace and chunk check of `cistern fsck`; unset: kNotSupported.
  std::function<Status(const mgmt::FsckReq&, mgmt::FsckResp*)> fsck;
  // A cluster's primary mgmtd (cluster_manager.h): RegisterNode, Heartbeat
  // and CreateChains; unset (one machine): kNotSupported.
  ClusterManager* cluster = nullptr;
  // Whether this mgmtd may act for the cluster now: OK, or kNotPrimary
  // naming the primary (several mgmtd: primary_lease.h). Unset: always.
  std::function<Status()> primary;
};

class MgmtService {
 public:
  MgmtService(kv::Engine& kv, net::RpcServer& server, MgmtHooks hooks);
  ~MgmtService();

 private:
  // Serves `method` by the cluster manager's `call` (kNotSupported without one).
  template <typename Req, typename Resp>
  void serveCluster(net::RpcServer& server, const char* method,
                    Result<Resp> (ClusterManager::*call)(const Req&));

  kv::Engine& kv_;
  MgmtHooks hooks_;
  asio::thread_pool pool_{2};
};

}  // namespace cistern::mgmtd
