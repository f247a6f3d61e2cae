// `cistern serve --role mgmtd` (mgmtd_server.h).
#include "server/mgmtd_server.h"

#include "mgmtd/mgmt_guard.h"

#include <fmt/format.h>

#include <condition_variable>
#include <thread>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "kv/etcd_client.h"
#include "mgmtd/cluster_manager.h"
#include "mgmtd/mgmt_service.h"
#include "mgmtd/primary_lease.h"
#include "mgmtd/routing_table.h"
#include "net/rpc_client.h"
#include "net/rpc_server.h"
#include "server/listen.h"
#include "storage.pb.h"

namespace cistern::server {

void MgmtdServerOptions::bind(ConfigBinder& b) {
  b.bind("mgmtd.listen", &listen, "host:port of the mgmt RPC service");
  b.bind("mgmtd.heartbeat_timeout_ms", &heartbeat_timeout_ms,
         "a storage target not in a heartbeat for this long is taken out of its chains");
  b.bind("mgmtd.replace_after_s", &replace_after_s,
         "a chain member silent this long is replaced by another target, which syncs "
         "(re-replication; 0: never)");
  b.bind("mgmtd.tick_ms", &tick_ms,
         "how often the chains are stepped (0: a quarter of the heartbeat timeout)");
  b.bind("mgmtd.lease_ms", &lease_ms,
         "the primary mgmtd's etcd lease: a standby takes over within it and a third");
  b.bind("mgmtd.compact_interval_s", &compact_interval_s,
         "the primary compacts etcd's history older than one interval this often (0: never)");
  kv.bind(b);
  auth.bind(b);
}

Status MgmtdServerOptions::validate() const {
  RETURN_ON_ERROR(net::Endpoint::parse(listen).status().withContext("mgmtd.listen"));
  RETURN_ON_ERROR(
      checkOptionRange("mgmtd.heartbeat_timeout_ms", heartbeat_timeout_ms, 100, 3'600'000));
  RETURN_ON_ERROR(checkOptionRange("mgmtd.tick_ms", tick_ms, 0, heartbeat_timeout_ms));
  RETURN_ON_ERROR(checkOptionRange("mgmtd.replace_after_s", replace_after_s, 0, 30 * 86400));
  if (replace_after_s != 0 && uint64_t{replace_after_s} * 1000 < heartbeat_timeout_ms)
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("mgmtd.replace_after_s {} is shorter than the heartbeat timeout "
                              "({} ms)",
                              replace_after_s, heartbeat_timeout_ms));
  RETURN_ON_ERROR(checkOptionRange("mgmtd.lease_ms", lease_ms, 1000, 600000));
  RETURN_ON_ERROR(auth.validate());
  return kv.validate();
}

struct MgmtdServer::Impl {
  MgmtdServerOptions options;
  std::unique_ptr<kv::Engine> kv;
  std::unique_ptr<mgmtd::ClusterManager> manager;
  std::unique_ptr<kv::etcd::Client> etcd;      // the etcd backend's: the primary lease
  std::unique_ptr<mgmtd::PrimaryLease> lease;  // null: the only mgmtd (rocksdb)
  bool elected = false;                        // several mgmtd: the lease decides
  std::atomic<mgmtd::PrimaryLease*> lease_ptr{
      nullptr};  // `lease`, once made (the RPC hook reads it)

  bool primary() const {
    if (!elected) return true;
    mgmtd::PrimaryLease* l = lease_ptr.load();
    return l && l->isPrimary();
  }
  std::unique_ptr<net::RpcServer> server;
  std::unique_ptr<mgmtd::MgmtService> service;
  std::thread ticker;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  bool poked = false;  // news for a step before the next tick

  // etcd's history: compacted up to the revision the previous pass saw.
  SteadyTime next_compaction{};
  int64_t seen_revision = 0;
  void compactIfDue() {
    if (!etcd || options.compact_interval_s == 0) return;
    const SteadyTime now = SystemClock::instance().now();
    if (now < next_compaction) return;
    next_compaction = now + std::chrono::seconds(options.compact_interval_s);
    kv::etcd::RangeRequest probe;
    probe.key = options.kv.etcd_prefix + "\xff\xff/mgmtd/primary";
    auto r = etcd->range(probe);
    if (!r.ok()) {
      CLOG_WARN("mgmtd", "etcd revision for compaction: {}", r.status().toString());
      return;
    }
    if (seen_revision > 0) {
      if (Status s = etcd->compact(seen_revision); !s.ok()) {
        CLOG_WARN("mgmtd", "compacting etcd to revision {}: {}", seen_revision, s.toString());
      } else {
        CLOG_INFO("mgmtd", "compacted etcd's history before revision {}", seen_revision);
      }
    }
    seen_revision = r->revision;
  }

  // The routing table, pushed to every storage server when a step moved it
  // (servers pull it with their beats too, so a push that is lost costs
  // only time), by a thread of its own so that a server that does not
  // answer never holds up a step: one call per server at once, each
  // bounded.
  std::mutex push_mu;
  std::condition_variable push_cv;
  uint64_t push_version = 0;  // guarded by push_mu; the newest to push
  std::thread push_thread;
  net::RpcClient pusher{net::ClientOptions{}};
  void pushLoop() {
    uint64_t pushed = 0;
    std::unique_lock lock(push_mu);
    for (;;) {
      push_cv.wait(lock, [&] { return push_stopping || push_version > pushed; });
      if (push_stopping) return;
      pushed = push_version;
      lock.unlock();
      pushRouting();
      lock.lock();
    }
  }
  bool push_stopping = false;  // guarded by push_mu
  void pushRouting() {
    auto routing = mgmtd::loadRouting(*kv);
    if (!routing.ok()) return;
    storage::PushRoutingReq req;
    req.set_routing(routing->SerializeAsString());
    std::vector<std::thread> calls;
    for (const auto& t : routing->targets()) {
      auto ep = net::Endpoint::parse(t.endpoint());
      if (!ep.ok()) continue;
      calls.emplace_back([this, ep = *ep, &req] {
        static const auto kPush = net::Method::of("cistern.storage.StorageService.PushRouting");
        storage::PushRoutingResp resp;
        (void)pusher.callSync(ep, kPush, req, &resp, {.timeout_ms = 500});
      });
    }
    for (auto& c : calls) c.join();
  }

  void tickLoop() {
    const auto every = std::chrono::milliseconds(
        options.tick_ms ? options.tick_ms
                        : std::max<uint32_t>(options.heartbeat_timeout_ms / 4, 1));
    bool was_primary = false;
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait_for(lock, every, [this] { return stopping || poked; });
      if (stopping) break;
      poked = false;
      lock.unlock();
      const bool is_primary = primary();
      // Taking over: what a standby heard is nothing; every target gets the
      // grace of a timeout before it counts as silent.
      if (is_primary && !was_primary && elected) manager->restart();
      was_primary = is_primary;
      if (is_primary) {
        auto v = manager->tick();
        if (!v.ok()) {
          CLOG_WARN("mgmtd", "stepping the chains: {}", v.status().toString());
        } else {
          std::lock_guard push_lock(push_mu);
          if (*v > push_version) {
            push_version = *v;
            push_cv.notify_all();
          }
        }
        compactIfDue();
      }
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
  {
    std::lock_guard lock(impl_->push_mu);
    impl_->push_stopping = true;
  }
  impl_->push_cv.notify_all();
  if (impl_->push_thread.joinable()) impl_->push_thread.join();
  if (impl_->server) impl_->server->stop();
  impl_->service.reset();
  impl_->lease_ptr = nullptr;
  impl_->lease.reset();  // revoked: a standby takes over at once
}

Result<std::unique_ptr<MgmtdServer>> MgmtdServer::start(const MgmtdServerOptions& options) {
  RETURN_ON_ERROR(options.validate());
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  ASSIGN_OR_RETURN(impl->kv, openKv(options.kv));
  mgmtd::ClusterManagerOptions mo;
  mo.heartbeat_timeout_ms = options.heartbeat_timeout_ms;
  mo.replace_after_ms = options.replace_after_s * 1000;
  mo.wake = [i = impl.get()] {
    std::lock_guard lock(i->mu);
    i->poked = true;
    i->cv.notify_all();
  };
  impl->manager = std::make_unique<mgmtd::ClusterManager>(*impl->kv, SystemClock::instance(), mo);
  ASSIGN_OR_RETURN(net::ServerOptions so, listenOn(options.listen, 2));
  impl->server = std::make_unique<net::RpcServer>(so);
  ASSIGN_OR_RETURN(auto keyring, options.auth.keyring());
  if (keyring) {
    auto service = std::make_shared<auth::ServiceCredential>(*keyring);
    impl->pusher.setCredential([service] { return service->get(); });
    auto guard = std::make_shared<mgmtd::MgmtGuard>(*keyring);
    impl->server->setGuard(
        [guard](const net::Method& m, std::string_view cred, const google::protobuf::Message&) {
          return guard->check(m, cred);
        });
  }
  mgmtd::MgmtHooks hooks{.cluster = impl->manager.get()};
  Impl* i = impl.get();
  impl->elected = options.kv.backend == "etcd";
  hooks.primary = [i]() -> Status {
    if (i->primary()) return Status::OK();
    mgmtd::PrimaryLease* l = i->lease_ptr.load();
    std::string p = l ? l->primary() : std::string();
    return Status(ErrorCode::kNotPrimary,
                  p.empty() ? std::string("no primary mgmtd yet") : "the primary mgmtd is " + p);
  };
  impl->service = std::make_unique<mgmtd::MgmtService>(*impl->kv, *impl->server, std::move(hooks));
  RETURN_ON_ERROR(impl->server->start());
  if (options.kv.backend == "etcd") {
    kv::etcd::Client::Options co;
    co.endpoints = options.kv.etcd_endpoints;
    co.timeout_ms = std::min(options.kv.etcd_timeout_ms, options.lease_ms / 3);
    ASSIGN_OR_RETURN(impl->etcd, kv::etcd::Client::create(co));
    impl->lease = std::make_unique<mgmtd::PrimaryLease>(
        impl->etcd.get(), options.kv.etcd_prefix + "\xff\xff/mgmtd/primary",
        impl->server->endpoint().toString(), options.lease_ms);
    impl->lease_ptr = impl->lease.get();
  }
  impl->push_thread = std::thread([i = impl.get()] { i->pushLoop(); });
  impl->ticker = std::thread([i = impl.get()] { i->tickLoop(); });
  return std::unique_ptr<MgmtdServer>(new MgmtdServer(std::move(impl)));
}

net::Endpoint MgmtdServer::endpoint() const { return impl_->server->endpoint(); }

bool MgmtdServer::isPrimary() const { return impl_->primary(); }

}  // namespace cistern::server
