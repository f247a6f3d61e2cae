// `cistern serve --role mgmtd` (mgmtd_server.h).
#include "server/mgmtd_server.h"

#include <fmt/format.h>

#include <condition_variable>
#include <thread>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "mgmtd/cluster_manager.h"
#include "mgmtd/mgmt_service.h"
#include "net/rpc_server.h"

namespace cistern::server {

void MgmtdServerOptions::bind(ConfigBinder& b) {
  b.bind("mgmtd.listen", &listen, "host:port of the mgmt RPC service");
  b.bind("mgmtd.heartbeat_timeout_ms", &heartbeat_timeout_ms,
         "a storage target not in a heartbeat for this long is taken out of its chains");
  b.bind("mgmtd.tick_ms", &tick_ms,
         "how often the chains are stepped (0: a quarter of the heartbeat timeout)");
  kv.bind(b);
}

Status MgmtdServerOptions::validate() const {
  RETURN_ON_ERROR(net::Endpoint::parse(listen).status().withContext("mgmtd.listen"));
  RETURN_ON_ERROR(checkOptionRange("mgmtd.heartbeat_timeout_ms", heartbeat_timeout_ms, 100,
                                   3'600'000));
  RETURN_ON_ERROR(checkOptionRange("mgmtd.tick_ms", tick_ms, 0, heartbeat_timeout_ms));
  return kv.validate();
}

struct MgmtdServer::Impl {
  MgmtdServerOptions options;
  std::unique_ptr<kv::Engine> kv;
  std::unique_ptr<mgmtd::ClusterManager> manager;
  std::unique_ptr<net::RpcServer> server;
  std::unique_ptr<mgmtd::MgmtService> service;
  std::thread ticker;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;

  void tickLoop() {
    const auto every = std::chrono::milliseconds(
        options.tick_ms ? options.tick_ms : std::max<uint32_t>(options.heartbeat_timeout_ms / 4, 1));
    std::unique_lock lock(mu);
    while (!cv.wait_for(lock, every, [this] { return stopping; })) {
      lock.unlock();
      if (auto v = manager->tick(); !v.ok())
        CLOG_WARN("mgmtd", "stepping the chains: {}", v.status().toString());
      lock.lock();
    }
  }
};

MgmtdServer::MgmtdServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MgmtdServer::~MgmtdServer() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->ticker.joinable()) impl_->ticker.join();
  if (impl_->server) impl_->server->stop();
  impl_->service.reset();
}

Result<std::unique_ptr<MgmtdServer>> MgmtdServer::start(const MgmtdServerOptions& options) {
  RETURN_ON_ERROR(options.validate());
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  ASSIGN_OR_RETURN(impl->kv, openKv(options.kv));
  impl->manager = std::make_unique<mgmtd::ClusterManager>(
      *impl->kv, SystemClock::instance(),
      mgmtd::ClusterManagerOptions{options.heartbeat_timeout_ms});
  ASSIGN_OR_RETURN(net::Endpoint ep, net::Endpoint::parse(options.listen));
  net::ServerOptions so;
  so.listen_host = ep.host;
  so.listen_port = ep.port;
  so.threads = 2;
  impl->server = std::make_unique<net::RpcServer>(so);
  impl->service = std::make_unique<mgmtd::MgmtService>(
      *impl->kv, *impl->server, mgmtd::MgmtHooks{.cluster = impl->manager.get()});
  RETURN_ON_ERROR(impl->server->start());
  impl->ticker = std::thread([i = impl.get()] { i->tickLoop(); });
  return std::unique_ptr<MgmtdServer>(new MgmtdServer(std::move(impl)));
}

net::Endpoint MgmtdServer::endpoint() const { return impl_->server->endpoint(); }

}  // namespace cistern::server
