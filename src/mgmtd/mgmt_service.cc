#include "mgmtd/mgmt_service.h"

#include "mgmtd/cluster_manager.h"
#include "mgmtd/routing_table.h"
#include "net/blocking.h"

namespace cistern::mgmtd {

MgmtService::MgmtService(kv::Engine& kv, net::RpcServer& server, MgmtHooks hooks)
    : kv_(kv), hooks_(std::move(hooks)) {
  server.handle<mgmt::GetRoutingReq, mgmt::Routing>(
      net::Method::of("cistern.mgmt.MgmtService.GetRouting"),
      [this](net::CallContext&, const mgmt::GetRoutingReq&,
             mgmt::Routing& resp) -> asio::awaitable<Status> {
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          ASSIGN_OR_RETURN(resp, loadRouting(kv_));
          if (hooks_.target_failed) {
            for (auto& t : *resp.mutable_targets()) t.set_failed(hooks_.target_failed(t.id()));
          }
          return Status::OK();
        });
      });
  server.handle<mgmt::FsckReq, mgmt::FsckResp>(
      net::Method::of("cistern.mgmt.MgmtService.Fsck"),
      [this](net::CallContext&, const mgmt::FsckReq& req,
             mgmt::FsckResp& resp) -> asio::awaitable<Status> {
        if (!hooks_.fsck) co_return Status(ErrorCode::kNotSupported, "fsck is not served here");
        co_return co_await net::runBlocking(pool_, [&] { return hooks_.fsck(req, &resp); });
      });
  serveCluster(server, "RegisterNode", &ClusterManager::registerNode);
  serveCluster(server, "Heartbeat", &ClusterManager::heartbeat);
  serveCluster(server, "CreateChains", &ClusterManager::createChains);
  serveCluster(server, "Rebalance", &ClusterManager::rebalance);
  serveCluster(server, "ChainHistory", &ClusterManager::chainHistory);
}

template <typename Req, typename Resp>
void MgmtService::serveCluster(net::RpcServer& server, const char* method,
                               Result<Resp> (ClusterManager::*call)(const Req&)) {
  server.handle<Req, Resp>(
      net::Method::of(std::string("cistern.mgmt.MgmtService.") + method),
      [this, call](net::CallContext&, const Req& req, Resp& resp) -> asio::awaitable<Status> {
        if (!hooks_.cluster)
          co_return Status(ErrorCode::kNotSupported, "not a cluster's mgmtd (cistern up)");
        if (hooks_.primary) {
          if (Status p = hooks_.primary(); !p.ok()) co_return p;
        }
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          ASSIGN_OR_RETURN(resp, (hooks_.cluster->*call)(req));
          return Status::OK();
        });
      });
}

MgmtService::~MgmtService() { pool_.join(); }

}  // namespace cistern::mgmtd
