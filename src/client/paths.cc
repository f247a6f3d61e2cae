// libcistern: paths, resolved one component at a time through a bounded
// dentry and attribute cache.
#include <fmt/format.h>

#include "client/client_impl.h"
#include "client/methods.h"
#include "common/metrics.h"

namespace cistern::client {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kCacheEntriesMax = 65536;

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

}  // namespace cistern::client
