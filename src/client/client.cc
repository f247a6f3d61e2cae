// libcistern: connecting, routing, metadata calls with retries, and the
// cluster-wide calls (statfs, targets, fsck). Paths: paths.cc; namespace
// calls: namespace_calls.cc; sessions and inline files: sessions.cc.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "client/client_impl.h"
#include "client/methods.h"
#include "client/open_files.h"
#include "common/host.h"
#include "common/log.h"
#include "common/metrics.h"
#include "mgmt.pb.h"
#include "storage.pb.h"

namespace cistern {

std::pair<std::unique_ptr<Client>, Error> Client::connect(const Options& options) {
  auto c = std::make_unique<client::ClientImpl>();
  Options o = options;
  if (o.cluster.empty()) {
    const char* env = std::getenv("CISTERN_CLUSTER");
    o.cluster = env && *env ? env : "127.0.0.1:7420";
  }
  Status s = c->init(o);
  if (!s.ok()) return {nullptr, client::toError(s, "cluster " + o.cluster)};
  return {std::move(c), Error{}};
}

namespace client {

namespace {

using Clock = std::chrono::steady_clock;

std::string randomId() {
  char host[64] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::random_device rd;
  uint64_t r = (uint64_t{rd()} << 32) | rd();
  return fmt::format("{}-{}-{:016x}", host, ::getpid(), r);
}

}  // namespace

// Errors worth another try: the peer was unreachable or busy, or a
// transaction lost a race. Mutations are idempotent by (client, seq).
bool transient(const Status& s) {
  switch (s.code()) {
    case ErrorCode::kConnectionFailed:
    case ErrorCode::kConnectionClosed:
    case ErrorCode::kDeadlineExceeded:
    case ErrorCode::kTargetBusy:
    case ErrorCode::kResourceExhausted:
    case ErrorCode::kTxnConflict:
    case ErrorCode::kTxnTooOld:
    case ErrorCode::kTxnRetriesExhausted:
    case ErrorCode::kShuttingDown:
    case ErrorCode::kInodeBusy:
      return true;
    default:
      return false;
  }
}

Error toError(const Status& s, const std::string& path) {
  Error e;
  if (s.ok()) return e;
  e.errno_value = s.toErrno();
  if (e.errno_value == 0) e.errno_value = EIO;
  e.message = fmt::format("{}: {}", path, std::strerror(e.errno_value));
  switch (s.code()) {
    case ErrorCode::kInternal:
    case ErrorCode::kIOError:
    case ErrorCode::kCorruption:
    case ErrorCode::kConnectionFailed:
    case ErrorCode::kConnectionClosed:
    case ErrorCode::kDeadlineExceeded:
    case ErrorCode::kBadFrame:
    case ErrorCode::kBadMessage:
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kTargetBusy:
    case ErrorCode::kNotServing:
    case ErrorCode::kResourceExhausted:
    case ErrorCode::kChunkNotCommitted:
    case ErrorCode::kNotSupported:
    // A refused credential: which refusal, and why (docs/security.md).
    case ErrorCode::kTokenMissing:
    case ErrorCode::kTokenInvalid:
    case ErrorCode::kTokenExpired:
    case ErrorCode::kTokenRevoked:
    case ErrorCode::kWrongTenant:
    case ErrorCode::kTokenReadOnly:
    case ErrorCode::kTokenNotAdmin:
    case ErrorCode::kCapabilityRefused:
    case ErrorCode::kCrossTenant:
      if (!s.message().empty()) e.message += fmt::format(" ({})", s.message());
      break;
    default:
      break;
  }
  return e;
}

ClientImpl::~ClientImpl() {
  if (renewer_.joinable()) {
    {
      std::lock_guard lock(renew_mu_);
      stopping_ = true;
    }
    renew_cancel_->cancel();
    renew_cv_.notify_all();
    renewer_.join();
  }
  if (driver_) driver_->join();
  if (local_pool_) local_pool_->join();
  if (shm_ && rpc_) {
    // Let the servers unmap our memory now rather than when they need room.
    for (const auto& [server, handle] : shm_->attached()) {
      storage::ShmDetachReq req;
      req.set_handle(handle);
      storage::ShmDetachResp resp;
      (void)rpc_->callSync(server, kShmDetach(), req, &resp, {.timeout_ms = 1000});
    }
  }
  rpc_.reset();
}

Status ClientImpl::init(const Options& options) {
  options_ = options;
  if (options_.io_parallel_max == 0) options_.io_parallel_max = 1;
  open_files_ = std::make_unique<OpenFiles>(options_.buffered_files_max);
  // One mgmtd, or a cluster's several ("host:port,host:port"): any of
  // them answers GetRouting; the next is tried when one does not.
  for (size_t at = 0; at <= options_.cluster.size();) {
    size_t comma = std::min(options_.cluster.find(',', at), options_.cluster.size());
    ASSIGN_OR_RETURN(auto ep, net::Endpoint::parse(options_.cluster.substr(at, comma - at)));
    mgmtds_.push_back(ep);
    at = comma + 1;
  }
  cluster_ = mgmtds_[0];
  caller_.set_uid(options_.uid == ~0u ? ::getuid() : options_.uid);
  caller_.set_gid(options_.gid == ~0u ? ::getgid() : options_.gid);
  if (options_.groups.empty() && options_.uid == ~0u) {
    gid_t groups[256];
    int n = ::getgroups(256, groups);
    for (int i = 0; i < n; ++i) caller_.add_groups(groups[i]);
  } else {
    for (uint32_t g : options_.groups) caller_.add_groups(g);
  }
  client_id_ = randomId();
  {
    std::random_device rd;
    update_client_ = (uint64_t{rd()} << 32 | rd()) | 1;  // never 0 (no update id)
  }
  net::ClientOptions co;
  co.threads = 1;
  co.connections_per_endpoint = 2;
  co.call_timeout_ms = options_.call_timeout_ms;
  co.connect_timeout_ms = std::min<uint32_t>(3000, std::max<uint32_t>(options_.retry_ms, 100));
  co.local_calls = options_.local_calls;
  rpc_ = std::make_unique<net::RpcClient>(co);
  token_ = options_.token;
  if (token_.empty()) {
    if (const char* env = std::getenv("CISTERN_TOKEN")) token_ = env;
  }
  if (!token_.empty()) rpc_->setCredential([this] { return token_; });
  driver_ = std::make_unique<asio::thread_pool>(1);
  shm_ = ShmSlots::create(options_.shm_bytes, options_.shm_readahead_windows,
                          options_.readahead_max_bytes);
  if (options_.short_circuit_reads && !hostBootId().empty())
    short_circuit_ = std::make_unique<ShortCircuit>();
  RETURN_ON_ERROR(refreshRouting());
  if (options_.session_renew_ms > 0) renewer_ = std::thread([this] { renewLoop(); });
  return Status::OK();
}

void ClientImpl::renewLoop() {
  const auto every = std::chrono::milliseconds(options_.session_renew_ms);
  meta::RenewReq req;
  req.set_client(client_id_);
  std::unique_lock lock(renew_mu_);
  while (!renew_cv_.wait_for(lock, every, [this] { return stopping_; })) {
    lock.unlock();
    net::Endpoint to;
    {
      std::shared_lock routing(routing_mu_);
      to = meta_endpoint_;
    }
    meta::Empty resp;
    // One try per period: the next period tries again, well within the
    // service's timeout (fifteen periods by default).
    net::CallOptions co;
    co.timeout_ms = std::min(options_.call_timeout_ms, options_.session_renew_ms);
    co.cancel = renew_cancel_;
    Status s = rpc_->callSync(to, kRenew(), req, &resp, co);
    if (!s.ok() && !renew_cancel_->cancelled())
      CLOG_WARN("client", "renewing client {}: {}", client_id_, s.toString());
    lock.lock();
  }
}

Status ClientImpl::refreshRouting() {
  mgmt::GetRoutingReq req;
  mgmt::Routing routing;
  auto deadline = Clock::now() + std::chrono::milliseconds(options_.retry_ms);
  auto backoff = std::chrono::milliseconds(20);
  for (;;) {
    routing.Clear();
    net::Endpoint to;
    {
      std::lock_guard lock(mgmtd_mu_);
      to = cluster_;
    }
    Status s = rpc_->callSync(to, kGetRouting(), req, &routing);
    if (s.ok()) break;
    if (!transient(s) || Clock::now() + backoff > deadline) return s;
    {
      std::lock_guard lock(mgmtd_mu_);
      if (cluster_ == to) {
        mgmtd_at_ = (mgmtd_at_ + 1) % mgmtds_.size();
        cluster_ = mgmtds_[mgmtd_at_];
      }
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  ASSIGN_OR_RETURN(auto meta_ep, net::Endpoint::parse(routing.meta_endpoint()));
  std::vector<net::Endpoint> meta_eps;
  for (const auto& m : routing.meta_endpoints()) {
    ASSIGN_OR_RETURN(auto ep, net::Endpoint::parse(m));
    meta_eps.push_back(ep);
  }
  if (meta_eps.empty()) meta_eps.push_back(meta_ep);
  std::map<uint32_t, std::string> target_ep;
  std::vector<TargetInfo> targets;
  for (const auto& t : routing.targets()) {
    target_ep[t.id()] = t.endpoint();
    TargetInfo ti;
    ti.id = t.id();
    ti.chain = t.chain();
    ti.endpoint = t.endpoint();
    ti.path = t.path();
    ti.failed = t.failed();
    targets.push_back(ti);
  }
  std::map<uint32_t, ChainRoute> chains;
  for (const auto& c : routing.chains()) {
    ChainRoute route;
    route.version = c.version();
    if (c.targets_size() == 0) {
      route.down = true;
      chains[c.id()] = std::move(route);
      continue;
    }
    for (uint32_t t : c.targets()) {  // serving, head first
      auto it = target_ep.find(t);
      if (it == target_ep.end()) {
        return Status(ErrorCode::kInternal,
                      fmt::format("routing: chain {} names unknown target {}", c.id(), t));
      }
      ASSIGN_OR_RETURN(auto ep, net::Endpoint::parse(it->second));
      route.replicas.push_back(ep);
    }
    route.endpoint = route.replicas[0];
    if (route.replicas.size() == 1) route.replicas.clear();
    chains[c.id()] = std::move(route);
  }
  std::unique_lock lock(routing_mu_);
  if (meta_endpoints_ != meta_eps) {
    meta_endpoints_ = std::move(meta_eps);
    meta_at_ = 0;
    meta_endpoint_ = meta_endpoints_[0];
  }
  chains_ = std::move(chains);
  targets_ = std::move(targets);
  return Status::OK();
}

Result<ClientImpl::ChainRoute> ClientImpl::route(uint32_t chain) {
  std::shared_lock lock(routing_mu_);
  auto it = chains_.find(chain);
  if (it == chains_.end())
    return Status(ErrorCode::kIOError, fmt::format("chain {} is not in the routing table", chain));
  if (it->second.down) {
    return Status(ErrorCode::kNotServing,
                  fmt::format("chain {} has no serving replica (waiting for its last one)", chain));
  }
  return it->second;
}

Status ClientImpl::metaCall(const net::Method& method, const google::protobuf::Message& req,
                            google::protobuf::Message* resp) {
  auto deadline = Clock::now() + std::chrono::milliseconds(options_.retry_ms);
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    net::Endpoint to;
    {
      std::shared_lock lock(routing_mu_);
      to = meta_endpoint_;
    }
    resp->Clear();
    Status s = rpc_->callSync(to, method, req, resp);
    // kNotServing: that meta server has lost the KV (its lease, meta_server.h)
    // and ran nothing.
    const bool away = s.code() == ErrorCode::kNotServing;
    if (s.ok() || (!transient(s) && !away) || Clock::now() + backoff > deadline) return s;
    if (away || s.code() == ErrorCode::kConnectionFailed ||
        s.code() == ErrorCode::kConnectionClosed || s.code() == ErrorCode::kDeadlineExceeded) {
      // That meta server is gone or stuck: the next one (a cluster's are
      // all alike), and the routing again (one may have joined or left).
      (void)refreshRouting();
      std::unique_lock lock(routing_mu_);
      if (meta_endpoints_.size() > 1 && meta_endpoint_ == to) {
        meta_at_ = (meta_at_ + 1) % meta_endpoints_.size();
        meta_endpoint_ = meta_endpoints_[meta_at_];
      }
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

Status ClientImpl::metaSync() {
  meta::Empty req, resp;
  return metaCall(kMetaSync(), req, &resp);
}

Error ClientImpl::syncNamespace() { return toError(metaSync(), "cluster " + options_.cluster); }

Error ClientImpl::statfs(SpaceInfo* out, uint64_t dir) {
  meta::StatfsReq req;
  req.set_ino(dir);
  meta::StatfsResp resp;
  Status s = metaCall(kStatfs(), req, &resp);
  if (!s.ok()) return toError(s, "cluster " + options_.cluster);
  out->bytes_total = resp.bytes_total();
  out->bytes_free = resp.bytes_free();
  out->inodes_used = resp.inodes_used();
  out->inodes_total = resp.inodes_total();
  out->capacity_known = resp.capacity_known();
  if (resp.block_size() != 0) out->block_size = resp.block_size();
  if (resp.name_max() != 0) out->name_max = resp.name_max();
  return {};
}

Error ClientImpl::targets(std::vector<TargetInfo>* out) {
  Status s = refreshRouting();
  if (!s.ok()) return toError(s, "cluster " + options_.cluster);
  {
    std::shared_lock lock(routing_mu_);
    *out = targets_;
  }
  for (auto& t : *out) {
    auto ep = net::Endpoint::parse(t.endpoint);
    if (!ep.ok()) continue;
    storage::SpaceReq req;
    storage::SpaceResp resp;
    net::CallOptions co;
    co.timeout_ms = 3000;
    if (!rpc_->callSync(*ep, kSpace(), req, &resp, co).ok()) continue;
    t.reachable = true;
    t.failed = t.failed || resp.failed();
    t.fs_total_bytes = resp.fs_total_bytes();
    t.fs_free_bytes = resp.fs_free_bytes();
    t.chunks = resp.chunks();
    t.data_bytes = resp.data_bytes();
    t.kept_bytes = resp.kept_bytes();
  }
  return {};
}

Error ClientImpl::fsck(CheckReport* out, bool remove_orphan_chunks) {
  static const auto kFsck = net::Method::of("cistern.mgmt.MgmtService.Fsck");
  mgmt::FsckReq req;
  req.set_remove_orphan_chunks(remove_orphan_chunks);
  mgmt::FsckResp resp;
  net::CallOptions co;
  co.timeout_ms = 600'000;
  net::Endpoint to;
  {
    std::lock_guard lock(mgmtd_mu_);
    to = cluster_;
  }
  Status s = rpc_->callSync(to, kFsck, req, &resp, co);
  if (!s.ok()) return toError(s, "cluster " + options_.cluster);
  out->inodes = resp.inodes();
  out->dentries = resp.dentries();
  out->sessions = resp.sessions();
  out->gc_entries = resp.gc_entries();
  out->chunks = resp.chunks();
  out->chunks_past_end = resp.chunks_past_end();
  out->orphan_chunks = resp.orphan_chunks();
  out->orphan_chunks_removed = resp.orphan_chunks_removed();
  out->problems.assign(resp.problems().begin(), resp.problems().end());
  return {};
}

}  // namespace client
}  // namespace cistern
