// `cistern serve --role storage` (storage_server.h).
#include "server/storage_server.h"

#include "storage/capability_guard.h"

#include <fmt/format.h>

#include <condition_variable>
#include <map>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "mgmt.pb.h"
#include "net/rpc_client.h"
#include "net/rpc_server.h"
#include "server/listen.h"
#include "storage/chain_table.h"
#include "storage/scrub_worker.h"
#include "storage/storage_service.h"

namespace cistern::server {
namespace {

const net::Method& kRegisterNode() {
  static const auto m = net::Method::of("cistern.mgmt.MgmtService.RegisterNode");
  return m;
}
const net::Method& kHeartbeat() {
  static const auto m = net::Method::of("cistern.mgmt.MgmtService.Heartbeat");
  return m;
}

}  // namespace

void StorageServerOptions::bind(ConfigBinder& b) {
  b.bind("storage.listen", &listen, "host:port of the storage RPC service");
  b.bind("storage.advertise", &advertise,
         "host:port others reach this server at (empty: the address it listens on)");
  b.bind("storage.node", &node, "this node's name in the cluster (unique; required)");
  b.bind("storage.rack", &rack, "the node's rack: chains put replicas on different racks");
  b.bind("storage.target", &target, "the target's directory (one disk)");
  b.bind("storage.mgmtd", &mgmtd, "mgmtd endpoints (host:port), tried in turn");
  b.bind("storage.heartbeat_ms", &heartbeat_ms,
         "how often the node beats to mgmtd (0: a fifth of mgmtd's heartbeat timeout)");
  b.bind("storage.scrub_bytes_per_second", &scrub_bytes_per_second,
         "the scrub re-reads every chunk at this rate, a bad copy repaired from a peer's "
         "(0: no scrub)");
  engine.bind(b, "storage.engine");
  service.bind(b, "storage.service");
  auth.bind(b);
}

Status StorageServerOptions::validate() const {
  RETURN_ON_ERROR(net::Endpoint::parse(listen).status().withContext("storage.listen"));
  if (!advertise.empty())
    RETURN_ON_ERROR(net::Endpoint::parse(advertise).status().withContext("storage.advertise"));
  if (node.empty()) return Status(ErrorCode::kConfigInvalid, "storage.node: no node name given");
  if (target.empty()) return Status(ErrorCode::kConfigInvalid, "storage.target: no directory");
  if (mgmtd.empty()) return Status(ErrorCode::kConfigInvalid, "storage.mgmtd: no endpoint given");
  for (const auto& m : mgmtd)
    RETURN_ON_ERROR(net::Endpoint::parse(m).status().withContext("storage.mgmtd"));
  RETURN_ON_ERROR(service.validate());
  RETURN_ON_ERROR(auth.validate());
  storage::ChunkEngineOptions e = engine;
  e.path = target;
  return e.validate();
}

struct StorageServer::Impl {
  StorageServerOptions options;
  std::vector<net::Endpoint> mgmtd;
  size_t mgmtd_at = 0;  // the endpoint beats go to
  std::unique_ptr<storage::ChunkEngine> engine;
  std::unique_ptr<net::RpcServer> server;
  net::RpcClient peers;  // forwards to successors, resyncs
  net::RpcClient mgmt;
  storage::ChainTable table;
  std::unique_ptr<storage::StorageService> service;
  std::unique_ptr<storage::CapabilityGuard> guard;  // null: no checks
  std::unique_ptr<storage::ScrubWorker> scrub;
  std::string endpoint;  // advertised
  std::atomic<uint32_t> target{0};
  uint32_t timeout_ms = 0;
  // (chain, target) whose resync finished, until a beat reports them.
  std::vector<std::pair<uint32_t, uint32_t>> synced;
  std::thread beater, syncer;
  // Resyncs by (chain, chain version): streamed already, and running.
  std::mutex syncs_mu;
  std::set<std::pair<uint32_t, uint64_t>> syncs_done, syncs_running;
  // The syncer's resync threads, each with its "finished" flag; finished
  // ones are joined before new ones start, the rest at the end.
  std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> sync_threads;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  bool beat_now = false;       // a resync into this target finished: report it
  bool routing_moved = false;  // mgmtd pushed a routing table: look for syncs
  std::atomic<bool> stop_flag{false};

  // Sleeps `d` until stopping (false) or a beat is due early (true).
  bool pauseBeat(std::chrono::milliseconds d) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, d, [this] { return stopping || beat_now; });
    beat_now = false;
    return !stopping;
  }
  // Sleeps `d` unless stopping; false once stopping.
  bool pause(std::chrono::milliseconds d) {
    std::unique_lock lock(mu);
    return !cv.wait_for(lock, d, [this] { return stopping; });
  }

  // A call to mgmtd, moving on to the next endpoint when this one is not
  // the primary or does not answer.
  Status callMgmtd(const net::Method& method, const google::protobuf::Message& req,
                   google::protobuf::Message* resp) {
    net::CallOptions co;
    co.timeout_ms = std::max<uint32_t>(timeout_ms / 4, 500);
    Status s = mgmt.callSync(mgmtd[mgmtd_at], method, req, resp, co);
    if (!s.ok()) mgmtd_at = (mgmtd_at + 1) % mgmtd.size();
    return s;
  }

  Status registerNode() {
    mgmt::RegisterNodeReq req;
    req.set_name(options.node);
    req.set_rack(options.rack);
    req.set_endpoint(endpoint);
    req.add_target_paths(engine->path());
    mgmt::RegisterNodeResp resp;
    RETURN_ON_ERROR(callMgmtd(kRegisterNode(), req, &resp));
    if (resp.target_ids_size() != 1)
      return Status(ErrorCode::kInternal, "mgmtd answered a registration without a target id");
    timeout_ms = resp.heartbeat_timeout_ms();
    table.registered(resp.target_ids(0), resp.routing_version());
    target = resp.target_ids(0);
    CLOG_INFO("storage", "node {} registered: target {} ({}), heartbeat timeout {} ms",
              options.node, target.load(), engine->path(), timeout_ms);
    return Status::OK();
  }

  void beatLoop() {
    // Registered first (mgmtd may come up after us).
    while (!stopping) {
      Status s = registerNode();
      if (s.ok()) break;
      CLOG_WARN("storage", "registering node {}: {}", options.node, s.toString());
      if (!pause(std::chrono::milliseconds(500))) return;
    }
    const auto every = std::chrono::milliseconds(
        options.heartbeat_ms ? options.heartbeat_ms : std::max<uint32_t>(timeout_ms / 5, 10));
    bool warned = false;
    do {
      for (auto& s : service->takeSynced()) synced.push_back(s);
      mgmt::HeartbeatReq req;
      req.set_name(options.node);
      // A failed target (an fsync error: read-only for good) is left out:
      // mgmtd takes it out of its chains as if it were silent.
      if (!engine->failed()) req.add_alive_targets(target);
      for (auto [chain, t] : synced) {
        auto* st = req.add_synced();
        st->set_chain(chain);
        st->set_target(t);
      }
      req.set_routing_version(table.routingVersion());
      mgmt::HeartbeatResp resp;
      const SteadyTime sent = SystemClock::instance().now();
      Status s = callMgmtd(kHeartbeat(), req, &resp);
      if (s.code() == ErrorCode::kNotFound) {  // mgmtd lost the node (a new KV): again
        s = registerNode();
      } else if (s.ok()) {
        synced.clear();
        // The routing first: a server back from a pause must not serve
        // under its old routing with a fresh lease.
        if (resp.has_routing()) {
          if (Status u = table.update(resp.routing()); !u.ok())
            CLOG_WARN("storage", "routing from mgmtd: {}", u.toString());
          std::lock_guard lock(mu);
          routing_moved = true;
          cv.notify_all();
        }
        table.renewLease(sent, timeout_ms);
      }
      if (!s.ok() && !warned) CLOG_WARN("storage", "heartbeat to mgmtd: {}", s.toString());
      warned = !s.ok();  // once per run of failures
    } while (pauseBeat(every));
  }

  void syncLoop() {
    SteadyTime next_settle = SystemClock::instance().now();
    for (;;) {
      {
        std::unique_lock lock(mu);
        cv.wait_for(lock, std::chrono::milliseconds(100),
                    [this] { return stopping || routing_moved; });
        if (stopping) return;
        routing_moved = false;
      }
      // Dirty chunks whose changes nobody retries, about twice a second.
      if (SystemClock::instance().now() >= next_settle) {
        next_settle = SystemClock::instance().now() + std::chrono::milliseconds(500);
        if (Status s = service->settleDirty(); !s.ok())
          CLOG_WARN("storage", "settling dirty chunks: {}", s.toString());
      }
      // Each chain's resync on a thread of its own: a target is the
      // predecessor in several chains, and their successors differ.
      std::erase_if(sync_threads, [](auto& t) {
        if (!t.second->load()) return false;
        t.first.join();
        return true;
      });
      for (const auto& p : table.syncsToRun()) {
        const std::pair<uint32_t, uint64_t> key{p.chain, p.version};
        {
          std::lock_guard lock(syncs_mu);
          if (syncs_done.count(key) || syncs_running.count(key)) continue;
          syncs_running.insert(key);
        }
        CLOG_INFO("storage", "chain {}: resyncing target {} from target {}", p.chain, p.successor,
                  target.load());
        auto finished = std::make_shared<std::atomic<bool>>(false);
        std::thread t([this, p, key, finished] {
          Status s = service->resync(p, &stop_flag);
          if (!s.ok()) {
            CLOG_WARN("storage", "chain {}: resync of target {}: {}", p.chain, p.successor,
                      s.toString());
          }
          std::lock_guard lock(syncs_mu);
          syncs_running.erase(key);
          if (s.ok()) {
            // Older versions of the chain are past.
            std::erase_if(syncs_done, [&](const auto& d) {
              return d.first == key.first && d.second < key.second;
            });
            syncs_done.insert(key);
          }
          *finished = true;
        });
        sync_threads.emplace_back(std::move(t), std::move(finished));
      }
    }
  }
};

StorageServer::StorageServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StorageServer::~StorageServer() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->stop_flag = true;
  impl_->cv.notify_all();
  if (impl_->beater.joinable()) impl_->beater.join();
  if (impl_->syncer.joinable()) impl_->syncer.join();
  for (auto& t : impl_->sync_threads) t.first.join();
  impl_->scrub.reset();
  if (impl_->server) impl_->server->stop();
  impl_->service.reset();
  impl_->server.reset();
  impl_->engine.reset();
}

Result<std::unique_ptr<StorageServer>> StorageServer::start(const StorageServerOptions& options) {
  RETURN_ON_ERROR(options.validate());
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  for (const auto& m : options.mgmtd) impl->mgmtd.push_back(*net::Endpoint::parse(m));
  storage::ChunkEngineOptions eo = options.engine;
  eo.path = options.target;
  ASSIGN_OR_RETURN(impl->engine, storage::ChunkEngine::open(eo));
  ASSIGN_OR_RETURN(net::ServerOptions so, listenOn(options.listen, 2));
  impl->server = std::make_unique<net::RpcServer>(so);
  ASSIGN_OR_RETURN(auto keyring, options.auth.keyring());
  if (keyring) {
    impl->guard = std::make_unique<storage::CapabilityGuard>(*keyring);
    impl->server->setGuard([g = impl->guard.get()](const net::Method& m, std::string_view cred,
                                                   const google::protobuf::Message& req) {
      return g->check(m, cred, req);
    });
    auto service = std::make_shared<auth::ServiceCredential>(*keyring);
    impl->peers.setCredential([service] { return service->get(); });
    impl->mgmt.setCredential([service] { return service->get(); });
  }
  impl->service = std::make_unique<storage::StorageService>(
      *impl->engine, *impl->server, options.service, &impl->table, &impl->peers);
  impl->service->onRouting([i = impl.get()] {
    std::lock_guard lock(i->mu);
    i->routing_moved = true;
    i->cv.notify_all();
  });
  impl->service->onSynced([i = impl.get()] {
    std::lock_guard lock(i->mu);
    i->beat_now = true;
    i->cv.notify_all();
  });
  if (options.scrub_bytes_per_second > 0) {
    impl->scrub = std::make_unique<storage::ScrubWorker>(
        *impl->engine, options.scrub_bytes_per_second, std::chrono::hours(24),
        [i = impl.get()](storage::ChunkId id) {
          auto m = i->engine->query(id);
          if (m.ok() && *m && (*m)->chain != 0) i->service->repairLater(id, (*m)->chain);
        });
  }
  RETURN_ON_ERROR(impl->server->start());
  impl->endpoint =
      options.advertise.empty() ? impl->server->endpoint().toString() : options.advertise;
  Impl* i = impl.get();
  impl->beater = std::thread([i] { i->beatLoop(); });
  impl->syncer = std::thread([i] { i->syncLoop(); });
  return std::unique_ptr<StorageServer>(new StorageServer(std::move(impl)));
}

net::Endpoint StorageServer::endpoint() const { return impl_->server->endpoint(); }

uint32_t StorageServer::target() const { return impl_->target.load(); }

}  // namespace cistern::server
