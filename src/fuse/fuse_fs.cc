// The FUSE mount: credentials, replies, the open-inode table, options.
#include <fmt/format.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>

#include "common/metrics.h"
#include "fuse/fuse_fs.h"
#include "fuse/ops.h"

namespace cistern::fuse {

namespace {

constexpr uint32_t kSeenMax = 1 << 16;

// The meta methods open files still call directly (the rest go through the
// inode API of include/cistern/client.h).
const char* const kMetaMethods[] = {"Create", "Open"};

}  // namespace

namespace ops {

struct OpStats {
  std::string op;
  metrics::Counter& requests;
  metrics::Histogram& latency;
};

namespace {
thread_local const OpStats* current_op = nullptr;
}  // namespace

OpStats& opStats(const char* op) {
  auto& r = metrics::Registry::global();
  return *new OpStats{op,  // one per operation, for the life of the process
                      r.counter("fuse_requests_total", {{"op", op}}, "FUSE requests by operation"),
                      r.histogram("fuse_request_latency_us", {{"op", op}},
                                  "Time to answer a FUSE request, microseconds")};
}

OpScope::OpScope(OpStats& stats)
    : stats_(stats), outer_(current_op), start_(std::chrono::steady_clock::now()) {
  current_op = &stats_;
  stats_.requests.inc();
}

OpScope::~OpScope() {
  stats_.latency.observe(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::steady_clock::now() - start_)
                                .count()));
  current_op = outer_;
}

void replyErr(fuse_req_t req, int err) {
  if (err != 0) {
    const char* name = strerrorname_np(err);
    metrics::Registry::global()
        .counter("fuse_errors_total",
                 {{"op", current_op ? current_op->op : "other"}, {"errno", name ? name : "?"}},
                 "FUSE requests answered with an error, by operation and errno")
        .inc();
  }
  fuse_reply_err(req, err);
}

}  // namespace ops

int replyErrno(const Status& s) {
  int e = s.toErrno();
  return e == 0 ? EIO : e;
}

void infoToStat(const FileInfo& n, struct stat* st) {
  std::memset(st, 0, sizeof(*st));
  st->st_ino = n.ino;
  st->st_mode = n.mode;
  st->st_rdev = static_cast<dev_t>(n.rdev);
  st->st_nlink = n.nlink;
  st->st_uid = n.uid;
  st->st_gid = n.gid;
  st->st_size = static_cast<off_t>(n.size);  // a symlink's: its target's length
  st->st_blksize = n.isRegular() && n.chunk_size > 0 ? static_cast<blksize_t>(n.chunk_size) : 4096;
  st->st_blocks = (st->st_size + 511) / 512;
  auto ts = [](int64_t ns) {
    timespec t;
    t.tv_sec = ns / 1'000'000'000;
    t.tv_nsec = ns % 1'000'000'000;
    return t;
  };
  st->st_atim = ts(n.atime_ns);
  st->st_mtim = ts(n.mtime_ns);
  st->st_ctim = ts(n.ctime_ns);
}

FuseFs::FuseFs(client::ClientImpl* client, MountOptions options)
    : client_(client),
      options_(std::move(options)),
      no_xattrs_(std::make_unique<NoXattrs[]>(kNoXattrSlots)),
      dir_attrs_(std::make_unique<DirAttrs[]>(kDirAttrSlots)) {
  for (const char* m : kMetaMethods)
    methods_.emplace(m, net::Method::of(std::string("cistern.meta.MetaService.") + m));
}

FuseFs::~FuseFs() = default;

Credentials FuseFs::who(fuse_req_t req) const {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  Credentials c;
  c.uid = ctx->uid;
  c.gid = ctx->gid;
  if (ctx->uid != 0) {
    gid_t groups[64];
    int n = fuse_req_getgroups(req, 64, groups);
    for (int i = 0; i < std::min(n, 64); ++i) c.groups.push_back(groups[i]);
  }
  return c;
}

meta::Caller FuseFs::caller(fuse_req_t req) const { return client::callerOf(who(req)); }

Status FuseFs::meta(const char* method, const google::protobuf::Message& in,
                    google::protobuf::Message* out) {
  return client_->metaCall(methods_.at(method), in, out);
}

bool FuseFs::call(fuse_req_t req, const char* method, const google::protobuf::Message& in,
                  google::protobuf::Message* out) {
  Status s = meta(method, in, out);
  if (s.ok()) return true;
  ops::replyErr(req, replyErrno(s));
  return false;
}

bool FuseFs::answered(fuse_req_t req, const Error& e) {
  if (!e) return true;
  ops::replyErr(req, e.errno_value);
  return false;
}

void FuseFs::fillStat(const FileInfo& info, struct stat* st) {
  infoToStat(info, st);
  if (!info.isRegular()) return;
  // This mount's own writes may not have reached meta yet.
  if (auto node = findOpen(info.ino); node && node->file) {
    st->st_size = static_cast<off_t>(node->file->size());
    st->st_blocks = (st->st_size + 511) / 512;
  }
}

fuse_entry_param FuseFs::entryOf(const FileInfo& info) {
  fuse_entry_param e;
  std::memset(&e, 0, sizeof(e));
  e.ino = info.ino;
  e.generation = 1;
  fillStat(info, &e.attr);
  e.attr_timeout = options_.attr_timeout_s;
  e.entry_timeout = options_.entry_timeout_s;
  return e;
}

void FuseFs::replyEntry(fuse_req_t req, const FileInfo& info) {
  fuse_entry_param e = entryOf(info);
  fuse_reply_entry(req, &e);
}

void FuseFs::replyAttr(fuse_req_t req, const FileInfo& info) {
  struct stat st;
  fillStat(info, &st);
  fuse_reply_attr(req, &st, options_.attr_timeout_s);
}

std::shared_ptr<OpenInode> FuseFs::findOpen(uint64_t ino) {
  std::lock_guard lock(open_mu_);
  auto it = open_.find(ino);
  return it == open_.end() ? nullptr : it->second;
}

uint32_t FuseFs::handles(const OpenInode& node) {
  std::lock_guard lock(open_mu_);
  return node.handles;
}

bool FuseFs::anyOpen() {
  std::lock_guard lock(open_mu_);
  return !open_.empty();
}

std::shared_ptr<OpenInode> FuseFs::acquire(const meta::Inode& inode, bool write) {
  std::lock_guard lock(open_mu_);
  auto& node = open_[inode.ino()];
  if (!node) {
    node = std::make_shared<OpenInode>();
    node->ino = inode.ino();
    node->file = std::make_unique<client::FileImpl>(client_, fmt::format("inode {}", inode.ino()),
                                                    inode, 0, true, true, false);
    if (buffered_open_ < options_.buffered_files_max) {
      node->buffered = true;
      ++buffered_open_;
    } else {
      node->file->setUnbuffered();
    }
  }
  ++node->handles;
  if (write) ++node->writers;
  node->mode = inode.mode();
  return node;
}

Status FuseFs::release(Handle* h) {
  auto node = h->node;
  Status result;
  if (uint64_t session = h->session.exchange(0); session != 0) {
    Error e = node->file->syncAndEnd(session);
    if (e) result = Status(ErrorCode::kIOError, e.message);
  }
  std::unique_lock lock(open_mu_);
  if (h->write) --node->writers;
  if (--node->handles > 0) return result;
  open_.erase(node->ino);
  if (node->buffered) --buffered_open_;
  uint64_t hold = node->hold_session;
  lock.unlock();
  Error e = node->file->syncAndEnd(hold);
  if (e && result.ok()) result = Status(ErrorCode::kIOError, e.message);
  remember(node->file->lastInode());
  // The FileImpl goes with the last reference: a concurrent open or setattr
  // may still hold this node from findOpen().
  return result;
}

int FuseFs::flushForTruncate(uint64_t ino, std::shared_ptr<OpenInode>* node, uint64_t* local_size) {
  *node = findOpen(ino);
  *local_size = 0;
  if (!*node) return 0;
  if (Error e = (*node)->file->flushBuffers()) return e.errno_value;
  *local_size = (*node)->file->size();
  return 0;
}

int FuseFs::prepareTruncate(uint64_t ino, const meta::Caller& caller, int mask, uint64_t new_size,
                            std::shared_ptr<OpenInode>* node) {
  uint64_t local_size = 0;
  if (int err = flushForTruncate(ino, node, &local_size)) return err;
  auto cut = client_->cutForTruncate(caller, ino, mask, new_size, local_size);
  return cut.ok() ? 0 : replyErrno(cut.status());
}

void FuseFs::holdIfOpen(fuse_req_t req, uint64_t ino) {
  auto node = findOpen(ino);
  if (!node) return;
  {
    std::lock_guard lock(open_mu_);
    if (node->hold_session != 0) return;
  }
  meta::OpenReq in;
  *in.mutable_caller() = caller(req);
  in.mutable_caller()->set_uid(0);  // the mount keeps what its users opened
  in.set_ino(ino);
  in.set_read(true);
  in.set_hold(true);
  client_->stamp(&in);
  meta::OpenResp out;
  if (!meta("Open", in, &out).ok()) return;
  std::unique_lock lock(open_mu_);
  if (node->hold_session == 0 && open_.count(ino)) {
    node->hold_session = out.session();
    return;
  }
  lock.unlock();
  (void)client_->metaClose(ino, out.session(), 0, false);  // raced with the last release
}

bool FuseFs::unchangedSinceLastSeen(const meta::Inode& inode) {
  std::lock_guard lock(seen_mu_);
  auto it = seen_.find(inode.ino());
  return it != seen_.end() && it->second == std::make_pair(inode.mtime_ns(), inode.size());
}

void FuseFs::invalidateAttrs(uint64_t ino) {
  if (session_) (void)fuse_lowlevel_notify_inval_inode(session_, ino, -1, 0);
}

namespace {
// Now plus attr_timeout.
std::chrono::steady_clock::time_point attrDeadline(const MountOptions& o) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(o.attr_timeout_s));
}
}  // namespace

void FuseFs::noteNoXattrs(uint64_t ino) {
  auto until = attrDeadline(options_);
  std::lock_guard lock(no_xattrs_mu_);
  no_xattrs_[ino % kNoXattrSlots] = {ino, until};
}

bool FuseFs::knownNoXattrs(uint64_t ino) {
  std::lock_guard lock(no_xattrs_mu_);
  const NoXattrs& e = no_xattrs_[ino % kNoXattrSlots];
  return e.ino == ino && std::chrono::steady_clock::now() < e.until;
}

void FuseFs::noteNoCaps(OpenInode& node, uint64_t gen) {
  if (options_.attr_timeout_s <= 0) return;
  node.no_caps_until_ns = attrDeadline(options_).time_since_epoch() / std::chrono::nanoseconds(1);
  node.no_caps_at = gen + 1;
}

bool FuseFs::knownNoCaps(const OpenInode& node) const {
  const int64_t now =
      std::chrono::steady_clock::now().time_since_epoch() / std::chrono::nanoseconds(1);
  return node.no_caps_at.load() == node.xattr_gen.load() + 1 && now < node.no_caps_until_ns.load();
}

void FuseFs::forgetNoXattrs(uint64_t ino) {
  std::lock_guard lock(no_xattrs_mu_);
  NoXattrs& e = no_xattrs_[ino % kNoXattrSlots];
  if (e.ino == ino) e = {};
}

void FuseFs::keepDirAttrs(const FileInfo& info, uint64_t ticket) {
  if (!info.isDir() || options_.attr_timeout_s <= 0) return;
  auto until = attrDeadline(options_);
  std::lock_guard lock(dir_attrs_mu_);
  DirAttrs& e = dir_attrs_[info.ino % kDirAttrSlots];
  if (ticket <= e.dropped) return;  // asked before a change that this mount made
  e.ino = info.ino;
  e.until = until;
  e.info = info;
}

bool FuseFs::cachedDirAttrs(uint64_t ino, FileInfo* out, double* valid_s) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(dir_attrs_mu_);
  const DirAttrs& e = dir_attrs_[ino % kDirAttrSlots];
  if (e.ino != ino || now >= e.until) return false;
  *out = e.info;
  *valid_s = std::chrono::duration<double>(e.until - now).count();
  return true;
}

void FuseFs::dropDirAttrs(uint64_t ino) {
  std::lock_guard lock(dir_attrs_mu_);
  DirAttrs& e = dir_attrs_[ino % kDirAttrSlots];
  e.dropped = dir_attrs_seq_.load();
  if (e.ino == ino) e.ino = 0;
}

void FuseFs::dropAllDirAttrs() {
  std::lock_guard lock(dir_attrs_mu_);
  uint64_t now = dir_attrs_seq_.load();
  for (size_t i = 0; i < kDirAttrSlots; ++i) dir_attrs_[i] = DirAttrs{.dropped = now};
}

void FuseFs::remember(const meta::Inode& inode) {
  if (inode.ino() == 0) return;
  std::lock_guard lock(seen_mu_);
  if (seen_.size() >= kSeenMax) seen_.clear();
  seen_[inode.ino()] = {inode.mtime_ns(), inode.size()};
}

}  // namespace cistern::fuse
