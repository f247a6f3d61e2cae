#include "server/local_cluster.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <condition_variable>
#include <filesystem>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "kv/engine.h"
#include "meta/fsck.h"
#include "meta/gc_worker.h"
#include "meta/meta_service.h"
#include "meta/schema.h"
#include "mgmt.pb.h"
#include "mgmtd/mgmt_guard.h"
#include "mgmtd/mgmt_service.h"
#include "mgmtd/routing_table.h"
#include "net/blocking.h"
#include "net/rpc_server.h"
#include "server/gc_remover.h"
#include "server/kv_options.h"
#include "server/meta_gc_loop.h"
#include "server/metrics_http.h"
#include "storage/capability_guard.h"
#include "storage/scrub_worker.h"
#include "storage/storage_service.h"

namespace cistern::server {

struct TargetRuntime {
  uint32_t id = 0;
  std::string path;
  std::unique_ptr<storage::ChunkEngine> engine;
  std::unique_ptr<net::RpcServer> server;
  std::unique_ptr<storage::StorageService> service;
  std::unique_ptr<storage::ScrubWorker> scrub;
};

struct LocalCluster::Impl {
  LocalClusterOptions options;
  std::unique_ptr<kv::Engine> kv;
  std::unique_ptr<meta::MetaStore> meta;
  std::unique_ptr<net::RpcServer> server;
  std::optional<auth::Keyring> keyring;  // nullopt: no checks
  std::unique_ptr<meta::Authorizer> authorizer;
  std::unique_ptr<storage::CapabilityGuard> guard;
  std::shared_ptr<auth::ServiceCredential> service_credential;
  std::unique_ptr<meta::MetaService> meta_service;
  std::unique_ptr<mgmtd::MgmtService> mgmt_service;
  std::vector<TargetRuntime> targets;
  std::unique_ptr<MetricsHttp> metrics;
  net::RpcClient gc_client;
  std::unique_ptr<GcRemover> remover;
  std::unique_ptr<MetaGcLoop> gc;

  Status startTargets();
  // mgmtd's view of this machine: one chain per target, meta on `server`.
  mgmtd::LocalLayout layout() const;
  Status fsck(const mgmt::FsckReq& req, mgmt::FsckResp* resp);
  Result<std::pair<uint64_t, uint64_t>> capacity();
  void stop();
};

namespace {

// A server of the cluster as `options` configure them (the port is per server).
net::ServerOptions serverOptions(const LocalClusterOptions& options, uint32_t threads) {
  net::ServerOptions so;
  so.listen_host = options.listen_host;
  so.threads = threads;
  so.inflight_per_connection_max = options.rpc_inflight_per_connection_max;
  so.connections_max = options.rpc_connections_max;
  so.payload_crc = options.rpc_payload_crc;
  return so;
}

// The chunks of this process's targets, for fsck.
class EngineLister : public meta::ChunkLister {
 public:
  explicit EngineLister(const std::vector<TargetRuntime>& targets) : targets_(targets) {}
  size_t targets() const override { return targets_.size(); }
  Result<std::vector<std::pair<uint64_t, uint32_t>>> list(size_t target, uint64_t inode,
                                                          uint32_t index, uint32_t limit) override {
    ASSIGN_OR_RETURN(auto chunks, targets_[target].engine->list({inode, index}, limit));
    std::vector<std::pair<uint64_t, uint32_t>> ids;
    ids.reserve(chunks.size());
    for (const auto& [id, m] : chunks) ids.emplace_back(id.inode, id.index);
    return ids;
  }

 private:
  const std::vector<TargetRuntime>& targets_;
};

// Existing target-<i> directories: the count never shrinks across restarts.
uint32_t existingTargets(const std::string& data) {
  uint32_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(data, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("target-", 0) == 0) n = std::max<uint32_t>(n, std::atoi(name.c_str() + 7));
  }
  return n;
}

}  // namespace

Status LocalCluster::Impl::startTargets() {
  uint32_t k = std::max(options.targets, existingTargets(options.data_dir));
  targets.resize(k);
  for (uint32_t i = 0; i < k; ++i) {
    TargetRuntime& t = targets[i];
    t.id = i + 1;
    t.path = fmt::format("{}/target-{}", options.data_dir, t.id);
    storage::ChunkEngineOptions eo = options.engine;
    eo.path = t.path;
    eo.sync = options.sync;
    ASSIGN_OR_RETURN(t.engine, storage::ChunkEngine::open(eo));
    net::ServerOptions so = serverOptions(options, options.storage_rpc_threads);
    so.listen_port = options.listen_port == 0 ? 0 : options.listen_port + t.id;
    t.server = std::make_unique<net::RpcServer>(so);
    if (guard) {
      t.server->setGuard([g = guard.get()](const net::Method& m, std::string_view cred,
                                           const google::protobuf::Message& req) {
        return g->check(m, cred, req);
      });
    }
    t.service =
        std::make_unique<storage::StorageService>(*t.engine, *t.server, options.storage_service);
    RETURN_ON_ERROR(t.server->start().withContext(fmt::format("storage target {}", t.id)));
    if (options.scrub_bytes_per_second > 0)
      t.scrub = std::make_unique<storage::ScrubWorker>(*t.engine, options.scrub_bytes_per_second);
  }
  return Status::OK();
}

mgmtd::LocalLayout LocalCluster::Impl::layout() const {
  mgmtd::LocalLayout l;
  l.meta_endpoint = server->endpoint().toString();
  for (const auto& t : targets)
    l.targets.push_back({t.id, t.server->endpoint().toString(), t.path});
  return l;
}

Status LocalCluster::Impl::fsck(const mgmt::FsckReq& req, mgmt::FsckResp* resp) {
  ASSIGN_OR_RETURN(meta::FsckReport r, meta::fsck(*kv));
  resp->set_inodes(r.inodes);
  resp->set_dentries(r.dentries);
  resp->set_sessions(r.sessions);
  resp->set_gc_entries(r.gc_entries);
  for (auto& p : r.problems) resp->add_problems(std::move(p));
  EngineLister lister(targets);
  ASSIGN_OR_RETURN(meta::ChunkCheck chunks, meta::checkChunks(*kv, lister));
  resp->set_chunks(chunks.chunks);
  resp->set_chunks_past_end(chunks.past_end);
  resp->set_orphan_chunks(chunks.orphans);
  uint64_t removed = 0;
  if (req.remove_orphan_chunks()) {
    // No new file can own them: inode numbers are never handed out twice.
    for (const auto& at : chunks.orphan_list) {
      RETURN_ON_ERROR(targets[at.target].engine->remove({at.inode, at.index}));
      ++removed;
    }
    resp->set_orphan_chunks_removed(removed);
  }
  // What was removed is no longer a problem.
  if (removed < chunks.orphans) {
    for (auto& p : chunks.problems) resp->add_problems(std::move(p));
  }
  return Status::OK();
}

// Total and free bytes over the distinct filesystems of the targets; free
// includes the targets' kept slots (space they hold for new chunks).
Result<std::pair<uint64_t, uint64_t>> LocalCluster::Impl::capacity() {
  std::set<dev_t> seen;
  uint64_t total = 0, free_bytes = 0;
  for (const auto& t : targets) {
    auto s = t.engine->space();
    free_bytes += s.kept_bytes;
    struct stat st;
    if (::stat(t.path.c_str(), &st) == 0 && !seen.insert(st.st_dev).second) continue;
    total += s.fs_total_bytes;
    free_bytes += s.fs_free_bytes > s.reserved_bytes ? s.fs_free_bytes - s.reserved_bytes : 0;
  }
  return std::pair<uint64_t, uint64_t>{total, free_bytes};
}

void LocalCluster::Impl::stop() {
  gc.reset();
  metrics.reset();
  if (server) server->stop();
  mgmt_service.reset();
  for (auto& t : targets) {
    t.scrub.reset();
    if (t.server) t.server->stop();
  }
  meta_service.reset();
  authorizer.reset();  // its thread reads the KV
  for (auto& t : targets) {
    t.service.reset();
    t.server.reset();
    t.engine.reset();
  }
  server.reset();
  meta.reset();
  kv.reset();
}

LocalCluster::LocalCluster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalCluster::~LocalCluster() { impl_->stop(); }

void LocalClusterOptions::bind(ConfigBinder& b) {
  engine.bind(b, "storage");
  storage_service.bind(b, "storage");
  b.bind("storage.scrub_bytes_per_second", &scrub_bytes_per_second,
         "bytes per second each target's scrub re-reads and verifies (0: no scrub)");
  b.bind("meta.session_timeout_ms", &session_timeout_ms,
         "a client silent this long loses its write sessions; keep it well above the "
         "clients' renewal period (20 s)");
  b.bind("meta.sync_namespace", &sync_namespace, kSyncNamespaceHelp);
  b.bind("kv.rocksdb.lazy_sync_ms", &kv_lazy_sync_ms, kLazySyncHelp);
  b.bind("rpc.meta_threads", &meta_rpc_threads,
         "I/O threads of the meta + mgmt RPC server (0: one per core; at most 256)");
  b.bind("rpc.storage_threads", &storage_rpc_threads,
         "I/O threads of each storage target's RPC server (1 to 256)");
  b.bind("rpc.inflight_per_connection_max", &rpc_inflight_per_connection_max,
         "requests a server reads from one connection before their responses are written "
         "(1 to 65536; backpressure on a client that sends faster)");
  b.bind("rpc.connections_max", &rpc_connections_max,
         "open connections per server; more are closed when accepted (16 to 16384: every "
         "connection holds a file descriptor)");
  b.bind("rpc.payload_crc", &rpc_payload_crc,
         "CRC32C over response payloads (chunk bytes); message bodies always carry one");
  auth.bind(b);
}

Status LocalClusterOptions::validate() const {
  if (targets == 0) return Status(ErrorCode::kInvalidArgument, "--targets must be >= 1");
  RETURN_ON_ERROR(engine.validate());
  RETURN_ON_ERROR(storage_service.validate());
  RETURN_ON_ERROR(auth.validate());
  if (session_timeout_ms < 1000) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("meta session_timeout_ms {} is below 1000", session_timeout_ms));
  }
  RETURN_ON_ERROR(checkOptionRange("kv.rocksdb.lazy_sync_ms", kv_lazy_sync_ms, 1, 600000));
  RETURN_ON_ERROR(checkOptionRange("rpc.meta_threads", meta_rpc_threads, 0, 256));
  RETURN_ON_ERROR(checkOptionRange("rpc.storage_threads", storage_rpc_threads, 1, 256));
  RETURN_ON_ERROR(checkOptionRange("rpc.inflight_per_connection_max",
                                   rpc_inflight_per_connection_max, 1, 65536));
  return checkOptionRange("rpc.connections_max", rpc_connections_max, 16, 16384);
}

Result<std::unique_ptr<LocalCluster>> LocalCluster::start(const LocalClusterOptions& options) {
  RETURN_ON_ERROR(options.validate());  // before anything is created
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) {
    return Status(ErrorCode::kIOError,
                  fmt::format("cannot create {}: {}", options.data_dir, ec.message()));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  std::unique_ptr<LocalCluster> cluster(new LocalCluster(std::move(impl)));
  Impl& c = *cluster->impl_;
  kv::RocksEngineOptions ko;
  ko.path = options.data_dir + "/kv";
  ko.engine.sync_commits = options.sync;
  ko.lazy_sync_ms = options.kv_lazy_sync_ms;
  ASSIGN_OR_RETURN(c.kv, kv::openRocksEngine(ko));
  ASSIGN_OR_RETURN(c.keyring, options.auth.keyring());
  if (c.keyring) {
    c.guard = std::make_unique<storage::CapabilityGuard>(*c.keyring);
    c.service_credential = std::make_shared<auth::ServiceCredential>(*c.keyring);
    c.gc_client.setCredential([s = c.service_credential] { return s->get(); });
  }
  RETURN_ON_ERROR(c.startTargets());
  meta::MetaOptions meta_options;
  meta_options.inline_convert_lease_ms = options.inline_convert_lease_ms;
  meta_options.session_timeout_ms = options.session_timeout_ms;
  meta_options.sync_namespace = options.sync_namespace;
  c.meta = std::make_unique<meta::MetaStore>(*c.kv, meta_options);
  RETURN_ON_ERROR(c.meta->init());
  c.meta->setCapacitySource([&c] { return c.capacity(); });
  net::ServerOptions so = serverOptions(options, options.meta_rpc_threads);
  so.listen_port = options.listen_port;
  c.server = std::make_unique<net::RpcServer>(so);
  c.meta_service = std::make_unique<meta::MetaService>(*c.meta, *c.server);
  if (c.keyring) {
    c.authorizer = std::make_unique<meta::Authorizer>(
        *c.meta, *c.keyring, meta::AuthOptions{.capability_ttl_s = options.auth.capability_ttl_s});
    c.meta_service->setAuthorizer(c.authorizer.get());
  }
  mgmtd::MgmtHooks hooks;
  hooks.target_failed = [&c](uint32_t id) {
    return id >= 1 && id <= c.targets.size() && c.targets[id - 1].engine->failed();
  };
  hooks.fsck = [&c](const mgmt::FsckReq& req, mgmt::FsckResp* resp) { return c.fsck(req, resp); };
  c.mgmt_service = std::make_unique<mgmtd::MgmtService>(*c.kv, *c.server, std::move(hooks));
  if (c.keyring) {
    auto guard = std::make_shared<mgmtd::MgmtGuard>(*c.keyring);
    c.server->setGuard([guard](const net::Method& m, std::string_view cred,
                               const google::protobuf::Message&) { return guard->check(m, cred); });
  }
  RETURN_ON_ERROR(c.server->start().withContext("meta/mgmt endpoint"));
  // mgmtd's routing table (its chain table is what meta lays new files over).
  // Published once the endpoints are bound; start() returns only after it.
  RETURN_ON_ERROR(mgmtd::publish(*c.kv, c.layout()).status().withContext("routing table"));
  uint16_t mport = options.metrics_port;
  ASSIGN_OR_RETURN(c.metrics, MetricsHttp::start(options.listen_host, mport));
  c.remover = std::make_unique<GcRemover>(
      client::RemoteChunkRemover(c.gc_client, [&c](uint32_t chain) -> Result<net::Endpoint> {
        if (chain == 0 || chain > c.targets.size())
          return Status(ErrorCode::kNotFound, fmt::format("no chain {}", chain));
        return c.targets[chain - 1].server->endpoint();
      }));
  c.gc = std::make_unique<MetaGcLoop>(*c.kv, *c.meta, *c.remover);
  return cluster;
}

net::Endpoint LocalCluster::endpoint() const { return impl_->server->endpoint(); }

std::string LocalCluster::adminToken() const {
  return impl_->service_credential ? impl_->service_credential->get() : std::string();
}

std::vector<net::Endpoint> LocalCluster::storageEndpoints() const {
  std::vector<net::Endpoint> out;
  for (const auto& t : impl_->targets) out.push_back(t.server->endpoint());
  return out;
}

uint16_t LocalCluster::metricsPort() const { return impl_->metrics->port(); }

}  // namespace cistern::server
