// The FUSE mount: credentials, replies, the open-inode table, options.
#include <fmt/format.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>

#include "common/metrics.h"
#include "fuse/fuse_fs.h"
#include "fuse/ops.h"
#include "fuse/pack_view.h"

namespace cistern::fuse {

namespace {

constexpr uint32_t kSeenMax = 1 << 16;

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

FuseFs::FuseFs(Client* client, MountOptions options)
    : client_(client),
      options_(std::move(options)),
      views_(std::make_unique<PackViews>(*client)),
      no_xattrs_(std::make_unique<NoXattrs[]>(kNoXattrSlots)),
      no_caps_(std::make_unique<NoCaps[]>(kNoCapsSlots)),
      caps_gen_(std::make_unique<uint64_t[]>(kNoCapsSlots)),
      dir_attrs_(std::make_unique<DirAttrs[]>(kDirAttrSlots)),
      listed_(std::make_unique<Listed[]>(kListedSlots)) {}

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

bool FuseFs::answered(fuse_req_t req, const Error& e) {
  if (!e) return true;
  ops::replyErr(req, e.errno_value);
  return false;
}

// (The client's answers carry this mount's own unrecorded lengths.)
void FuseFs::fillStat(const FileInfo& info, struct stat* st) { infoToStat(info, st); }

// Attributes handed to the kernel are remembered as seen: a first open of
// a file the kernel learnt of by lookup or readdirplus keeps them (and its
// empty page cache) when meta's answer to the open matches, instead of
// costing a getattr after every such open. A file changed since is caught
// at that open (the answers differ), and the kernel itself drops cached
// pages when new attributes show another mtime or size
// (FUSE_CAP_AUTO_INVAL_DATA).
fuse_entry_param FuseFs::entryOf(const FileInfo& info) {
  if (!info.isDir()) remember(info);
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
  if (!info.isDir()) remember(info);
  struct stat st;
  fillStat(info, &st);
  fuse_reply_attr(req, &st, options_.attr_timeout_s);
}

bool FuseFs::unchangedSinceLastSeen(const FileInfo& info) {
  std::lock_guard lock(seen_mu_);
  auto it = seen_.find(info.ino);
  return it != seen_.end() && it->second == std::make_pair(info.mtime_ns, info.size);
}

void FuseFs::invalidateAttrs(uint64_t ino) {
  if (session_) (void)fuse_lowlevel_notify_inval_inode(session_, ino, -1, 0);
}

void FuseFs::invalidateData(uint64_t ino) {
  if (session_) (void)fuse_lowlevel_notify_inval_inode(session_, ino, 0, 0);
}

bool FuseFs::storeWhole(uint64_t ino, std::string_view bytes) {
  if (!session_ || bytes.empty()) return false;
  fuse_bufvec buf = FUSE_BUFVEC_INIT(bytes.size());
  buf.buf[0].mem = const_cast<char*>(bytes.data());
  return fuse_lowlevel_notify_store(session_, ino, 0, &buf, FUSE_BUF_SPLICE_NONBLOCK) == 0;
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

uint64_t FuseFs::capsGen(uint64_t ino) {
  std::lock_guard lock(no_caps_mu_);
  return caps_gen_[ino % kNoCapsSlots];
}

void FuseFs::noteNoCaps(uint64_t ino, uint64_t gen) {
  if (options_.attr_timeout_s <= 0) return;
  auto until = attrDeadline(options_);
  std::lock_guard lock(no_caps_mu_);
  const size_t slot = ino % kNoCapsSlots;
  // An odd count: a change is under way; a moved one: a change began since.
  if (gen % 2 != 0 || caps_gen_[slot] != gen) return;
  no_caps_[slot] = {ino, gen, until};
}

bool FuseFs::knownNoCaps(uint64_t ino) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(no_caps_mu_);
  const size_t slot = ino % kNoCapsSlots;
  const NoCaps& e = no_caps_[slot];
  return e.ino == ino && e.gen == caps_gen_[slot] && now < e.until;
}

void FuseFs::xattrChange(uint64_t ino) {
  std::lock_guard lock(no_caps_mu_);
  ++caps_gen_[ino % kNoCapsSlots];
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

void FuseFs::noteListed(uint64_t ino) {
  if (options_.entry_timeout_s <= 0) return;
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(listed_mu_);
  listed_[ino % kListedSlots] = {ino, now};
}

bool FuseFs::listingFresh(uint64_t ino) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(listed_mu_);
  const Listed& e = listed_[ino % kListedSlots];
  return e.ino == ino && now - e.at < std::chrono::duration<double>(options_.entry_timeout_s);
}

void FuseFs::remember(const FileInfo& info) {
  if (info.ino == 0) return;
  std::lock_guard lock(seen_mu_);
  if (seen_.size() >= kSeenMax) seen_.clear();
  seen_[info.ino] = {info.mtime_ns, info.size};
}

}  // namespace cistern::fuse
