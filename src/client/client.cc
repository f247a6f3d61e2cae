// libcistern: connection, routing, path resolution and the namespace calls.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "client/client_impl.h"
#include "client/file_impl.h"
#include "common/host.h"
#include "common/log.h"
#include "common/metrics.h"
#include "mgmt.pb.h"
#include "proto/file_type.h"
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
constexpr uint64_t kRootIno = 1;
constexpr size_t kCacheEntriesMax = 65536;

net::Method metaMethod(const char* name) {
  return net::Method::of(std::string("cistern.meta.MetaService.") + name);
}

const net::Method& kLookup() {
  static const auto m = metaMethod("Lookup");
  return m;
}
const net::Method& kGetattr() {
  static const auto m = metaMethod("Getattr");
  return m;
}
const net::Method& kMkdir() {
  static const auto m = metaMethod("Mkdir");
  return m;
}
const net::Method& kCreate() {
  static const auto m = metaMethod("Create");
  return m;
}
const net::Method& kUnlink() {
  static const auto m = metaMethod("Unlink");
  return m;
}
const net::Method& kRmdir() {
  static const auto m = metaMethod("Rmdir");
  return m;
}
const net::Method& kRename() {
  static const auto m = metaMethod("Rename");
  return m;
}
const net::Method& kSetattr() {
  static const auto m = metaMethod("Setattr");
  return m;
}
const net::Method& kReaddir() {
  static const auto m = metaMethod("Readdir");
  return m;
}
const net::Method& kOpen() {
  static const auto m = metaMethod("Open");
  return m;
}
const net::Method& kClose() {
  static const auto m = metaMethod("Close");
  return m;
}
const net::Method& kUninline() {
  static const auto m = metaMethod("Uninline");
  return m;
}
const net::Method& kRenew() {
  static const auto m = metaMethod("Renew");
  return m;
}
const net::Method& kStatfs() {
  static const auto m = metaMethod("Statfs");
  return m;
}
const net::Method& kGetRouting() {
  static const auto m = net::Method::of("cistern.mgmt.MgmtService.GetRouting");
  return m;
}
const net::Method& kShmDetach() {
  static const auto m = net::Method::of("cistern.storage.StorageService.ShmDetach");
  return m;
}
const net::Method& kSpace() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Space");
  return m;
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

namespace {

FileInfo toInfo(const meta::Inode& n) {
  FileInfo f;
  f.ino = n.ino();
  f.mode = meta::typeBits(n.type()) | (n.mode() & 07777);
  f.nlink = n.nlink();
  f.uid = n.uid();
  f.gid = n.gid();
  f.size = n.type() == meta::SYMLINK ? n.symlink_target().size() : n.size();
  f.mtime_ns = n.mtime_ns();
  f.ctime_ns = n.ctime_ns();
  f.atime_ns = n.atime_ns();
  f.chunk_size = n.layout().chunk_size();
  f.rdev = n.rdev();
  return f;
}

std::string randomId() {
  char host[64] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::random_device rd;
  uint64_t r = (uint64_t{rd()} << 32) | rd();
  return fmt::format("{}-{}-{:016x}", host, ::getpid(), r);
}

struct CacheCounters {
  metrics::Counter& hits;
  metrics::Counter& misses;
};
CacheCounters& cacheCounters() {
  auto& r = metrics::Registry::global();
  static CacheCounters c{
      r.counter("client_dentry_cache_hits_total", {}, "Path lookups answered from the cache"),
      r.counter("client_dentry_cache_misses_total", {}, "Path lookups sent to the meta service")};
  return c;
}

}  // namespace

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
    case ErrorCode::kNotSupported:
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
  ASSIGN_OR_RETURN(cluster_, net::Endpoint::parse(options_.cluster));
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
  net::ClientOptions co;
  co.threads = 1;
  co.connections_per_endpoint = 2;
  co.call_timeout_ms = options_.call_timeout_ms;
  co.connect_timeout_ms = std::min<uint32_t>(3000, std::max<uint32_t>(options_.retry_ms, 100));
  co.local_calls = options_.local_calls;
  rpc_ = std::make_unique<net::RpcClient>(co);
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
    Status s = rpc_->callSync(cluster_, kGetRouting(), req, &routing);
    if (s.ok()) break;
    if (!transient(s) || Clock::now() + backoff > deadline) return s;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  ASSIGN_OR_RETURN(auto meta_ep, net::Endpoint::parse(routing.meta_endpoint()));
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
    if (c.targets_size() == 0) continue;
    auto it = target_ep.find(c.targets(0));
    if (it == target_ep.end()) {
      return Status(ErrorCode::kInternal,
                    fmt::format("routing: chain {} names unknown target {}", c.id(), c.targets(0)));
    }
    ASSIGN_OR_RETURN(auto ep, net::Endpoint::parse(it->second));
    chains[c.id()] = ChainRoute{ep, c.version()};
  }
  std::unique_lock lock(routing_mu_);
  meta_endpoint_ = meta_ep;
  chains_ = std::move(chains);
  targets_ = std::move(targets);
  return Status::OK();
}

Result<ClientImpl::ChainRoute> ClientImpl::route(uint32_t chain) {
  std::shared_lock lock(routing_mu_);
  auto it = chains_.find(chain);
  if (it == chains_.end())
    return Status(ErrorCode::kIOError, fmt::format("chain {} is not in the routing table", chain));
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
    if (s.ok() || !transient(s) || Clock::now() + backoff > deadline) return s;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

// --- paths and the dentry/attribute cache ---

Result<std::vector<std::string>> ClientImpl::split(const std::string& path) const {
  if (path.empty() || path[0] != '/')
    return Status(ErrorCode::kInvalidArgument, "path must be absolute (start with '/')");
  if (path.find('\0') != std::string::npos)
    return Status(ErrorCode::kInvalidArgument, "path contains a NUL byte");
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string part = path.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(std::move(part));
    }
    i = j + 1;
  }
  return parts;
}

void ClientImpl::remember(uint64_t parent, const std::string& name, const meta::Inode& inode) {
  if (options_.attr_cache_ms == 0) return;
  auto expires = Clock::now() + std::chrono::milliseconds(options_.attr_cache_ms);
  std::lock_guard lock(cache_mu_);
  if (dentries_.size() >= kCacheEntriesMax) dentries_.clear();
  if (inodes_.size() >= kCacheEntriesMax) inodes_.clear();
  dentries_[{parent, name}] = Dentry{inode.ino(), expires};
  inodes_[inode.ino()] = CachedInode{inode, expires};
}

void ClientImpl::forget(uint64_t parent, const std::string& name) {
  std::lock_guard lock(cache_mu_);
  auto it = dentries_.find({parent, name});
  if (it != dentries_.end()) {
    inodes_.erase(it->second.ino);
    dentries_.erase(it);
  }
  inodes_.erase(parent);
}

void ClientImpl::forgetAttrs(uint64_t ino) {
  std::lock_guard lock(cache_mu_);
  inodes_.erase(ino);
}

Result<meta::Inode> ClientImpl::lookup(uint64_t parent, const std::string& name) {
  {
    std::lock_guard lock(cache_mu_);
    auto now = Clock::now();
    auto d = dentries_.find({parent, name});
    if (d != dentries_.end() && d->second.expires > now) {
      auto n = inodes_.find(d->second.ino);
      if (n != inodes_.end() && n->second.expires > now) {
        cacheCounters().hits.inc();
        return n->second.inode;
      }
    }
  }
  cacheCounters().misses.inc();
  meta::LookupReq req;
  *req.mutable_caller() = caller();
  req.set_parent(parent);
  req.set_name(name);
  meta::InodeResp resp;
  RETURN_ON_ERROR(metaCall(kLookup(), req, &resp));
  remember(parent, name, resp.inode());
  return resp.inode();
}

Result<meta::Inode> ClientImpl::getattr(uint64_t ino) {
  meta::GetattrReq req;
  req.set_ino(ino);
  meta::InodeResp resp;
  RETURN_ON_ERROR(metaCall(kGetattr(), req, &resp));
  return resp.inode();
}

Result<meta::Inode> ClientImpl::cutForTruncate(const meta::Caller& who, uint64_t ino, int mask,
                                               uint64_t new_size, uint64_t local_size) {
  meta::GetattrReq req;
  req.set_ino(ino);
  req.set_access_mask(static_cast<uint32_t>(mask));
  *req.mutable_caller() = who;
  meta::InodeResp resp;
  RETURN_ON_ERROR(metaCall(kGetattr(), req, &resp));
  if (new_size <= std::max(resp.inode().size(), local_size))
    RETURN_ON_ERROR(cutData(resp.inode(), new_size));
  return resp.inode();
}

// The inode named by the first `count` components; every directory on the
// way must be searchable by the caller (the meta service checks).
Result<meta::Inode> ClientImpl::resolve(const std::vector<std::string>& parts, size_t count) {
  if (count == 0) return getattr(kRootIno);
  meta::Inode cur;
  uint64_t parent = kRootIno;
  for (size_t i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(cur, lookup(parent, parts[i]));
    if (i + 1 < count && cur.type() != meta::DIRECTORY)
      return Status(ErrorCode::kNotDirectory, parts[i]);
    parent = cur.ino();
  }
  return cur;
}

Result<meta::Inode> ClientImpl::resolvePath(const std::string& path) {
  ASSIGN_OR_RETURN(auto parts, split(path));
  return resolve(parts, parts.size());
}

Result<meta::Inode> ClientImpl::resolveParent(const std::vector<std::string>& parts) {
  ASSIGN_OR_RETURN(meta::Inode p, resolve(parts, parts.size() - 1));
  if (p.type() != meta::DIRECTORY) return Status(ErrorCode::kNotDirectory, parts.back());
  return p;
}

// --- namespace calls ---

Error ClientImpl::stat(const std::string& path, FileInfo* out) {
  auto n = resolvePath(path);
  if (!n.ok()) return toError(n.status(), path);
  *out = toInfo(*n);
  return {};
}

Error ClientImpl::list(const std::string& path, std::vector<DirEntry>* out) {
  out->clear();
  auto dir = resolvePath(path);
  if (!dir.ok()) return toError(dir.status(), path);
  if (dir->type() != meta::DIRECTORY) return toError(Status(ErrorCode::kNotDirectory), path);
  meta::ReaddirReq req;
  *req.mutable_caller() = caller();
  req.set_ino(dir->ino());
  req.set_limit(1000);
  req.set_plus(true);
  for (;;) {
    meta::ReaddirResp resp;
    Status s = metaCall(kReaddir(), req, &resp);
    if (!s.ok()) return toError(s, path);
    for (int i = 0; i < resp.names_size(); ++i) {
      DirEntry e;
      e.name = resp.names(i);
      if (i < resp.inodes_size()) e.info = toInfo(resp.inodes(i));
      out->push_back(std::move(e));
    }
    if (resp.next_cookie().empty() || resp.names_size() == 0) break;
    req.set_cookie(resp.next_cookie());
  }
  return {};
}

Error ClientImpl::mkdir(const std::string& path, uint32_t mode, bool parents) {
  auto parts = split(path);
  if (!parts.ok()) return toError(parts.status(), path);
  if (parts->empty()) {
    if (parents) return {};
    return toError(Status(ErrorCode::kAlreadyExists), path);
  }
  uint64_t parent = kRootIno;
  size_t first = parents ? 0 : parts->size() - 1;
  if (!parents) {
    auto p = resolveParent(*parts);
    if (!p.ok()) return toError(p.status(), path);
    parent = p->ino();
  }
  for (size_t i = first; i < parts->size(); ++i) {
    const std::string& name = (*parts)[i];
    if (parents) {
      auto existing = lookup(parent, name);
      if (existing.ok()) {
        if (existing->type() != meta::DIRECTORY)
          return toError(Status(ErrorCode::kNotDirectory), path);
        parent = existing->ino();
        continue;
      }
      if (existing.status().code() != ErrorCode::kNotFound) return toError(existing.status(), path);
    }
    meta::MkdirReq req;
    *req.mutable_caller() = caller();
    req.set_parent(parent);
    req.set_name(name);
    req.set_mode(mode & 07777);
    req.set_client(client_id_);
    req.set_seq(nextSeq());
    meta::InodeResp resp;
    Status s = metaCall(kMkdir(), req, &resp);
    if (!s.ok() && parents && s.code() == ErrorCode::kAlreadyExists) {
      forget(parent, name);
      auto again = lookup(parent, name);  // made by someone else meanwhile
      if (!again.ok()) return toError(again.status(), path);
      if (again->type() != meta::DIRECTORY) return toError(Status(ErrorCode::kNotDirectory), path);
      parent = again->ino();
      continue;
    }
    if (!s.ok()) return toError(s, path);
    forget(parent, name);
    remember(parent, name, resp.inode());
    parent = resp.inode().ino();
  }
  return {};
}

Error ClientImpl::rename(const std::string& from, const std::string& to) {
  auto a = split(from);
  if (!a.ok()) return toError(a.status(), from);
  auto b = split(to);
  if (!b.ok()) return toError(b.status(), to);
  if (a->empty() || b->empty()) return toError(Status(ErrorCode::kNotPermitted), from);
  auto pa = resolve(*a, a->size() - 1);
  if (!pa.ok()) return toError(pa.status(), from);
  auto pb = resolve(*b, b->size() - 1);
  if (!pb.ok()) return toError(pb.status(), to);
  meta::RenameReq req;
  *req.mutable_caller() = caller();
  req.set_src_parent(pa->ino());
  req.set_src_name(a->back());
  req.set_dst_parent(pb->ino());
  req.set_dst_name(b->back());
  req.set_client(client_id_);
  req.set_seq(nextSeq());
  meta::Empty resp;
  Status s = metaCall(kRename(), req, &resp);
  forget(pa->ino(), a->back());
  forget(pb->ino(), b->back());
  if (!s.ok()) {
    // Name the side the error is about.
    bool dst = s.code() == ErrorCode::kNotEmpty || s.code() == ErrorCode::kIsDirectory ||
               s.code() == ErrorCode::kAlreadyExists;
    return toError(s, dst ? to : from);
  }
  return {};
}

// unlink and rmdir: the meta service checks the type and permissions.
Error ClientImpl::removeName(const std::string& path, bool dir) {
  auto parts = split(path);
  if (!parts.ok()) return toError(parts.status(), path);
  if (parts->empty()) {
    return toError(
        dir ? Status(ErrorCode::kNotPermitted, "the root") : Status(ErrorCode::kIsDirectory), path);
  }
  auto p = resolve(*parts, parts->size() - 1);
  if (!p.ok()) return toError(p.status(), path);
  meta::RemoveReq req;
  *req.mutable_caller() = caller();
  req.set_parent(p->ino());
  req.set_name(parts->back());
  req.set_client(client_id_);
  req.set_seq(nextSeq());
  meta::Empty resp;
  Status s = metaCall(dir ? kRmdir() : kUnlink(), req, &resp);
  forget(p->ino(), parts->back());
  return toError(s, path);
}

Error ClientImpl::unlink(const std::string& path) { return removeName(path, false); }
Error ClientImpl::rmdir(const std::string& path) { return removeName(path, true); }

Error ClientImpl::truncate(const std::string& path, uint64_t size) {
  auto n = resolvePath(path);
  if (!n.ok()) return toError(n.status(), path);
  // Cut first, commit second: a truncate that stops between them leaves no
  // old byte past the new end (cutForTruncate).
  auto fresh = cutForTruncate(caller(), n->ino(), W_OK, size);
  if (!fresh.ok()) return toError(fresh.status(), path);
  meta::SetattrReq req;
  *req.mutable_caller() = caller();
  req.set_ino(fresh->ino());
  req.set_size(size);
  req.set_client(client_id_);
  req.set_seq(nextSeq());
  meta::InodeResp resp;
  Status s = setattrSize(&req, &resp);
  forgetAttrs(fresh->ino());
  return toError(s, path);
}

Error ClientImpl::open(const std::string& path, int flags, uint32_t mode,
                       std::unique_ptr<File>* out) {
  out->reset();
  int acc = flags & O_ACCMODE;
  bool read = acc == O_RDONLY || acc == O_RDWR;
  bool write = acc == O_WRONLY || acc == O_RDWR;
  if (acc == O_ACCMODE) return toError(Status(ErrorCode::kInvalidArgument, "bad flags"), path);
  auto parts = split(path);
  if (!parts.ok()) return toError(parts.status(), path);
  meta::Inode inode;
  if (flags & O_CREAT) {
    if (parts->empty()) return toError(Status(ErrorCode::kIsDirectory), path);
    auto p = resolveParent(*parts);
    if (!p.ok()) return toError(p.status(), path);
    meta::CreateReq req;
    *req.mutable_caller() = caller();
    req.set_parent(p->ino());
    req.set_name(parts->back());
    req.set_mode(mode & 07777);
    req.set_exclusive((flags & O_EXCL) != 0);
    req.set_client(client_id_);
    req.set_seq(nextSeq());
    req.set_open_write(write);
    meta::InodeResp resp;
    Status s = metaCall(kCreate(), req, &resp);
    forget(p->ino(), parts->back());
    if (!s.ok()) return toError(s, path);
    if (resp.session() != 0) {
      // A new file, already open for writing: no separate Open.
      auto file = std::make_unique<FileImpl>(this, path, resp.inode(), resp.session(), read, write,
                                             (flags & O_APPEND) != 0);
      file->setFresh();
      *out = std::move(file);
      return {};
    }
    inode = resp.inode();
  } else {
    auto n = resolve(*parts, parts->size());
    if (!n.ok()) return toError(n.status(), path);
    inode = *n;
  }
  if (inode.type() == meta::DIRECTORY) return toError(Status(ErrorCode::kIsDirectory), path);
  if (meta::isSpecial(inode.type())) {
    return Error{ENXIO, path + ": a FIFO, socket or device moves its data through the kernel: "
                               "open it through a mount"};
  }
  if (inode.type() != meta::REGULAR)
    return toError(Status(ErrorCode::kInvalidArgument, "not a regular file"), path);
  bool trunc = write && (flags & O_TRUNC);
  if (trunc) {
    // The old bytes leave storage before the open commits the empty file, so
    // that none shows through a hole of the new contents.
    auto fresh = cutForTruncate(caller(), inode.ino(), W_OK | (read ? R_OK : 0), 0);
    if (!fresh.ok()) return toError(fresh.status(), path);
  }
  meta::OpenReq req;
  *req.mutable_caller() = caller();
  req.set_ino(inode.ino());
  req.set_read(read);
  req.set_write(write);
  req.set_truncate(trunc);
  req.set_client(client_id_);
  req.set_seq(nextSeq());
  meta::OpenResp resp;
  Status s = metaCall(kOpen(), req, &resp);
  forgetAttrs(inode.ino());
  if (!s.ok()) return toError(s, path);
  if (write) {
    // Writes go to chunks: an inline file's bytes move there first.
    if (Status c = prepareWrites(&resp); !c.ok()) return toError(c, path);
  }
  *out =
      std::make_unique<FileImpl>(this, path, resp.inode(), resp.session(), read, write,
                                 (flags & O_APPEND) != 0, std::move(*resp.mutable_inline_data()));
  return {};
}

Result<meta::Inode> ClientImpl::metaClose(uint64_t ino, uint64_t session, uint64_t length,
                                          bool wrote, const std::string* inline_data) {
  meta::CloseReq req;
  req.set_ino(ino);
  req.set_session(session);
  req.set_length(length);
  req.set_wrote(wrote);
  if (inline_data) req.set_inline_data(*inline_data);
  req.set_client(client_id_);
  req.set_seq(nextSeq());
  meta::InodeResp resp;
  Status s = metaCall(kClose(), req, &resp);
  forgetAttrs(ino);
  RETURN_ON_ERROR(s);
  return resp.inode();
}

Status ClientImpl::convertInline(uint64_t ino) {
  // Another client's conversion holds the inode for at most the service's
  // lease (10 s): wait that long beyond the usual retries.
  auto deadline =
      Clock::now() + std::chrono::milliseconds(options_.retry_ms) + std::chrono::seconds(10);
  auto backoff = std::chrono::milliseconds(1);
  const std::string what = fmt::format("moving inline inode {} to chunks", ino);
  for (;;) {
    meta::UninlineReq begin;
    *begin.mutable_caller() = caller_;
    begin.set_ino(ino);
    begin.set_client(client_id_);
    begin.set_seq(nextSeq());
    meta::UninlineResp held;
    Status s = metaCall(kUninline(), begin, &held);
    if (s.code() == ErrorCode::kInodeBusy && Clock::now() + backoff < deadline) {
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
      continue;
    }
    RETURN_ON_ERROR(s.withContext(what));
    if (!held.was_inline()) break;
    // Chunk 0 becomes exactly the bytes. The lease fences the storage calls:
    // each is refused once the chunk is locked past the lease's end, less a
    // margin for the clocks of this service and the storage servers to
    // differ by, so a call of ours delayed past the lease cannot land after
    // those of the next client to take the inode (which begins only once
    // the lease has run out). Then the lease is lost: begin again.
    const int64_t not_after = held.inode().convert_until_ns() - kClockSkewNs;
    s = moveInlineBytes(held.inode(), held.data(), not_after);
    if (s.code() == ErrorCode::kLeaseExpired && Clock::now() < deadline) continue;
    RETURN_ON_ERROR(s.withContext(what));
    meta::UninlineReq finish = begin;
    finish.set_token(held.token());
    finish.set_seq(nextSeq());
    meta::UninlineResp done;
    s = metaCall(kUninline(), finish, &done);
    // The lease ran out and another client took over: once more (it finds the
    // bytes moved, or takes the inode again).
    if (s.code() == ErrorCode::kInlineRefused && Clock::now() < deadline) continue;
    RETURN_ON_ERROR(s.withContext(what));
    break;
  }
  forgetAttrs(ino);
  return Status::OK();
}

Status ClientImpl::prepareWrites(meta::OpenResp* resp) {
  if (!resp->inode().data_inline()) return Status::OK();
  Status s = convertInline(resp->inode().ino());
  if (!s.ok()) {
    (void)metaClose(resp->inode().ino(), resp->session(), 0, false);
    return s;
  }
  resp->mutable_inode()->set_data_inline(false);
  return Status::OK();
}

Status ClientImpl::setattrSize(meta::SetattrReq* req, meta::InodeResp* resp) {
  Status s = metaCall(kSetattr(), *req, resp);
  if (s.code() != ErrorCode::kInlineRefused) return s;
  RETURN_ON_ERROR(convertInline(req->ino()));
  req->set_seq(nextSeq());
  return metaCall(kSetattr(), *req, resp);
}

Error ClientImpl::statfs(SpaceInfo* out) {
  meta::Empty req;
  meta::StatfsResp resp;
  Status s = metaCall(kStatfs(), req, &resp);
  if (!s.ok()) return toError(s, "cluster " + options_.cluster);
  out->bytes_total = resp.bytes_total();
  out->bytes_free = resp.bytes_free();
  out->inodes_used = resp.inodes_used();
  out->capacity_known = resp.capacity_known();
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
  Status s = rpc_->callSync(cluster_, kFsck, req, &resp, co);
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
