// `cistern serve --role meta` (meta_server.h).
#include "server/meta_server.h"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <shared_mutex>
#include <thread>

#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "meta/meta_service.h"
#include "meta/meta_store.h"
#include "mgmtd/routing_table.h"
#include "net/rpc_client.h"
#include "net/rpc_server.h"
#include "server/gc_remover.h"
#include "server/listen.h"
#include "server/meta_gc_loop.h"
#include "storage.pb.h"

namespace cistern::server {

void MetaServerOptions::bind(ConfigBinder& b) {
  b.bind("meta.listen", &listen, "host:port of the meta RPC service");
  b.bind("meta.advertise", &advertise,
         "host:port clients reach this server at (empty: the address it listens on)");
  b.bind("meta.session_timeout_ms", &session_timeout_ms,
         "a client silent this long loses its write sessions");
  b.bind("meta.sync_namespace", &sync_namespace, kSyncNamespaceHelp);
  b.bind("meta.rpc_threads", &rpc_threads, "I/O threads of the meta RPC server");
  b.bind("meta.kv_lease_ms", &kv_lease_ms,
         "serve only while a KV read succeeded within this long (0: always serve)");
  kv.bind(b);
  auth.bind(b);
}

Status MetaServerOptions::validate() const {
  RETURN_ON_ERROR(auth.validate());
  RETURN_ON_ERROR(net::Endpoint::parse(listen).status().withContext("meta.listen"));
  if (!advertise.empty())
    RETURN_ON_ERROR(net::Endpoint::parse(advertise).status().withContext("meta.advertise"));
  RETURN_ON_ERROR(
      checkOptionRange("meta.session_timeout_ms", session_timeout_ms, 1000, 86'400'000));
  RETURN_ON_ERROR(checkOptionRange("meta.rpc_threads", rpc_threads, 1, 256));
  if (kv_lease_ms != 0)
    RETURN_ON_ERROR(checkOptionRange("meta.kv_lease_ms", kv_lease_ms, 100, 600'000));
  return kv.validate();
}

struct MetaServer::Impl {
  MetaServerOptions options;
  std::unique_ptr<kv::Engine> kv;
  std::unique_ptr<meta::MetaStore> meta;
  std::unique_ptr<net::RpcServer> server;
  std::unique_ptr<meta::Authorizer> authorizer;  // null: no checks
  std::unique_ptr<meta::MetaService> service;
  std::string endpoint;  // advertised
  net::RpcClient gc_client;
  std::unique_ptr<GcRemover> remover;
  std::unique_ptr<MetaGcLoop> gc;

  // The KV lease (meta_server.h): when the last KV read that succeeded was
  // sent, and the thread that reads.
  std::atomic<int64_t> kv_ok_sent_ns{0};
  std::mutex probe_mu;
  std::condition_variable probe_cv;
  bool probe_stop = false;
  std::thread prober;

  static int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               SystemClock::instance().now().time_since_epoch())
        .count();
  }
  void probeLoop() {
    const auto every = std::chrono::milliseconds(std::max<uint32_t>(options.kv_lease_ms / 4, 25));
    std::unique_lock lock(probe_mu);
    while (!probe_stop) {
      lock.unlock();
      const int64_t sent = nowNs();
      auto t = kv->beginRead();
      if (t->get("meta/lease-probe", /*snapshot=*/true).ok()) kv_ok_sent_ns.store(sent);
      t.reset();
      lock.lock();
      probe_cv.wait_for(lock, every, [&] { return probe_stop; });
    }
  }
  Status gate() const {
    const int64_t age_ms = (nowNs() - kv_ok_sent_ns.load()) / 1'000'000;
    if (age_ms < options.kv_lease_ms) return Status::OK();
    static auto& refused = metrics::Registry::global().counter(
        "meta_kv_lease_refusals_total", {},
        "calls answered kNotServing because the KV was not reached within meta.kv_lease_ms");
    refused.inc();
    return Status(ErrorCode::kNotServing,
                  fmt::format("meta server {} has not reached the KV for {} ms (meta.kv_lease_ms "
                              "{}): ask another",
                              endpoint, age_ms, options.kv_lease_ms));
  }
  // The routing the GC reaches chains' heads by, reloaded from the KV when
  // a call finds it moved.
  std::shared_mutex routing_mu;
  mgmt::Routing routing;

  void reloadRouting() {
    auto r = mgmtd::loadRouting(*kv);
    if (!r.ok()) {
      CLOG_WARN("meta", "loading the routing table: {}", r.status().toString());
      return;
    }
    std::unique_lock lock(routing_mu);
    routing = std::move(*r);
  }
  // statfs's (total, free) bytes: every target's file system (Space) over
  // the replication — what files can still take — asked at most every 2 s.
  std::mutex capacity_mu;
  SteadyTime capacity_at{};
  std::pair<uint64_t, uint64_t> capacity_cached{0, 0};
  Result<std::pair<uint64_t, uint64_t>> capacity() {
    std::lock_guard lock(capacity_mu);
    const SteadyTime now = SystemClock::instance().now();
    if (capacity_at != SteadyTime{} && now - capacity_at < std::chrono::seconds(2))
      return capacity_cached;
    reloadRouting();
    mgmt::Routing r;
    {
      std::shared_lock routing_lock(routing_mu);
      r = routing;
    }
    uint64_t total = 0, free_bytes = 0, replication = 1;
    for (const auto& c : r.chains())
      replication = std::max<uint64_t>(replication, std::max(c.members_size(), c.targets_size()));
    static const auto kSpace = net::Method::of("cistern.storage.StorageService.Space");
    for (const auto& t : r.targets()) {
      auto ep = net::Endpoint::parse(t.endpoint());
      if (!ep.ok()) continue;
      storage::SpaceResp s;
      if (!gc_client.callSync(*ep, kSpace, storage::SpaceReq(), &s, {.timeout_ms = 1000}).ok())
        continue;  // a target away counts for nothing until it is back
      total += s.fs_total_bytes();
      free_bytes +=
          s.kept_bytes() +
          (s.fs_free_bytes() > s.reserved_bytes() ? s.fs_free_bytes() - s.reserved_bytes() : 0);
    }
    capacity_cached = {total / replication, free_bytes / replication};
    capacity_at = now;
    return capacity_cached;
  }
  // The head of `chain` and the chain's version.
  Result<std::pair<net::Endpoint, uint64_t>> head(uint32_t chain) {
    std::shared_lock lock(routing_mu);
    for (const auto& c : routing.chains()) {
      if (c.id() != chain) continue;
      if (c.targets_size() == 0)
        return Status(ErrorCode::kNotServing, fmt::format("chain {} has no serving target", chain));
      for (const auto& t : routing.targets()) {
        if (t.id() != c.targets(0)) continue;
        ASSIGN_OR_RETURN(auto ep, net::Endpoint::parse(t.endpoint()));
        return std::make_pair(ep, c.version());
      }
    }
    return Status(ErrorCode::kNotFound, fmt::format("chain {} is not in the routing table", chain));
  }
};

MetaServer::MetaServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetaServer::~MetaServer() {
  if (impl_->prober.joinable()) {
    {
      std::lock_guard lock(impl_->probe_mu);
      impl_->probe_stop = true;
    }
    impl_->probe_cv.notify_all();
    impl_->prober.join();
  }
  impl_->gc.reset();
  if (impl_->kv && !impl_->endpoint.empty()) {
    if (auto s = mgmtd::setMetaServer(*impl_->kv, impl_->endpoint, false); !s.ok())
      CLOG_WARN("meta", "leaving the routing table: {}", s.status().toString());
  }
  if (impl_->server) impl_->server->stop();
  impl_->service.reset();
  impl_->server.reset();
  impl_->meta.reset();
  impl_->kv.reset();
}

Result<std::unique_ptr<MetaServer>> MetaServer::start(const MetaServerOptions& options) {
  RETURN_ON_ERROR(options.validate());
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  ASSIGN_OR_RETURN(impl->kv, openKv(options.kv));
  meta::MetaOptions mo;
  mo.session_timeout_ms = options.session_timeout_ms;
  mo.sync_namespace = options.sync_namespace;
  impl->meta = std::make_unique<meta::MetaStore>(*impl->kv, mo);
  RETURN_ON_ERROR(impl->meta->init());
  impl->meta->setCapacitySource([i = impl.get()] { return i->capacity(); });
  ASSIGN_OR_RETURN(net::ServerOptions so, listenOn(options.listen, options.rpc_threads));
  impl->server = std::make_unique<net::RpcServer>(so);
  impl->service =
      std::make_unique<meta::MetaService>(*impl->meta, *impl->server, /*blocking_threads=*/16,
                                          /*inline_reads=*/options.kv.backend != "etcd");
  ASSIGN_OR_RETURN(auto keyring, options.auth.keyring());
  if (keyring) {
    impl->authorizer = std::make_unique<meta::Authorizer>(
        *impl->meta, *keyring,
        meta::AuthOptions{.capability_ttl_s = options.auth.capability_ttl_s});
    impl->service->setAuthorizer(impl->authorizer.get());
    auto service = std::make_shared<auth::ServiceCredential>(*keyring);
    impl->gc_client.setCredential([service] { return service->get(); });
  }
  if (options.kv_lease_ms != 0) {
    impl->kv_ok_sent_ns.store(Impl::nowNs());  // init() just read the KV
    impl->prober = std::thread([i = impl.get()] { i->probeLoop(); });
    impl->service->setGate([i = impl.get()] { return i->gate(); });
  }
  RETURN_ON_ERROR(impl->server->start());
  impl->endpoint =
      options.advertise.empty() ? impl->server->endpoint().toString() : options.advertise;
  RETURN_ON_ERROR(mgmtd::setMetaServer(*impl->kv, impl->endpoint, true)
                      .status()
                      .withContext("listing the meta server in the routing table"));
  impl->reloadRouting();
  Impl* i = impl.get();
  impl->remover = std::make_unique<GcRemover>(
      client::RemoteChunkRemover(impl->gc_client,
                                 [i](uint32_t chain) -> Result<net::Endpoint> {
                                   ASSIGN_OR_RETURN(auto h, i->head(chain));
                                   return h.first;
                                 },
                                 {.chain_version = [i](uint32_t chain) -> uint64_t {
                                    auto h = i->head(chain);
                                    return h.ok() ? h->second : 0;
                                  },
                                  .refresh = [i] { i->reloadRouting(); }}));
  impl->gc = std::make_unique<MetaGcLoop>(*impl->kv, *impl->meta, *impl->remover);
  return std::unique_ptr<MetaServer>(new MetaServer(std::move(impl)));
}

net::Endpoint MetaServer::endpoint() const { return impl_->server->endpoint(); }

}  // namespace cistern::server
