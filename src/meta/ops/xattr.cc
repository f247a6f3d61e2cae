// Extended attributes: setxattr, getxattr, listxattr, removexattr.
// user.* follows the file's read/write permission; trusted.* is root's only;
// security.* is writable by the owner or root. Other namespaces: kNotSupported.
#include <fmt/format.h>

#include "kv/key_codec.h"
#include "meta/meta_store.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {
namespace {

inline constexpr size_t kXattrValueMax = 64 * 1024;

Status checkXattrName(std::string_view name) {
  if (name.empty()) return Status(ErrorCode::kInvalidArgument, "empty xattr name");
  if (name.size() > 255) return Status(ErrorCode::kRangeError, "xattr name over 255 bytes");
  for (std::string_view ns : {"user.", "trusted.", "security."}) {
    if (name.size() > ns.size() && name.substr(0, ns.size()) == ns) return Status::OK();
  }
  return Status(ErrorCode::kNotSupported, fmt::format("xattr namespace of '{}'", name));
}

Status checkXattrAccess(const Caller& c, const Inode& n, std::string_view name, bool write) {
  if (name.substr(0, 8) == "trusted.") {
    if (c.uid() != 0) return Status(ErrorCode::kNotPermitted, "trusted.* xattrs are root's");
    return Status::OK();
  }
  if (name.substr(0, 9) == "security." && write) {
    if (c.uid() != 0 && c.uid() != n.uid())
      return Status(ErrorCode::kNotPermitted, "security.* needs the owner");
    return Status::OK();
  }
  if (name.substr(0, 5) == "user." && n.type() != REGULAR && n.type() != DIRECTORY) {
    return Status(ErrorCode::kNotPermitted, "user.* xattrs only on files and directories");
  }
  return checkAccess(n, c, write ? kMayWrite : kMayRead);
}

}  // namespace

Status MetaStore::setxattr(const Caller& c, uint64_t ino, std::string_view name,
                           std::string_view value, uint32_t flags, const RequestId& rid) {
  RETURN_ON_ERROR(checkXattrName(name));
  if (value.size() > kXattrValueMax) {
    return Status(ErrorCode::kValueTooLarge, fmt::format("xattr value of {} bytes", value.size()));
  }
  if ((flags & ~(kXattrCreate | kXattrReplace)) || flags == (kXattrCreate | kXattrReplace)) {
    return Status(ErrorCode::kInvalidArgument, fmt::format("xattr flags {:#x}", flags));
  }
  return mutate(rid,
                [&](kv::Transaction& t) -> Result<std::string> {
                  ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
                  RETURN_ON_ERROR(checkXattrAccess(c, n, name, true));
                  ASSIGN_OR_RETURN(auto old, t.get(xattrKey(ino, name)));
                  if ((flags & kXattrCreate) && old) return Status(ErrorCode::kAlreadyExists, name);
                  if ((flags & kXattrReplace) && !old) return Status(ErrorCode::kNoAttribute, name);
                  t.set(xattrKey(ino, name), value);
                  n.set_ctime_ns(nowNs());
                  storeInode(t, n);
                  return std::string();
                })
      .status();
}

Result<std::string> MetaStore::getxattr(const Caller& c, uint64_t ino, std::string_view name) {
  RETURN_ON_ERROR(checkXattrName(name));
  std::string out;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
    RETURN_ON_ERROR(checkXattrAccess(c, n, name, false));
    ASSIGN_OR_RETURN(auto v, t.get(xattrKey(ino, name)));
    if (!v) return Status(ErrorCode::kNoAttribute, name);
    out = std::move(*v);
    return Status::OK();
  }));
  return out;
}

Result<std::vector<std::string>> MetaStore::listxattr(const Caller& c, uint64_t ino) {
  std::vector<std::string> out;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
    ASSIGN_OR_RETURN(auto rows, t.getRange(xattrBegin(ino), xattrEnd(ino)));
    for (const auto& row : rows.kvs) {
      kv::KeyReader r(row.key);
      ASSIGN_OR_RETURN(auto p, r.prefix());
      (void)p;
      ASSIGN_OR_RETURN(uint64_t got, r.u64());
      (void)got;
      ASSIGN_OR_RETURN(std::string name, r.bytes());
      // Like Linux, trusted.* names are listed to root only.
      if (name.substr(0, 8) == "trusted." && c.uid() != 0) continue;
      out.push_back(std::move(name));
    }
    (void)n;
    return Status::OK();
  }));
  return out;
}

Status MetaStore::removexattr(const Caller& c, uint64_t ino, std::string_view name,
                              const RequestId& rid) {
  RETURN_ON_ERROR(checkXattrName(name));
  return mutate(rid,
                [&](kv::Transaction& t) -> Result<std::string> {
                  ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
                  RETURN_ON_ERROR(checkXattrAccess(c, n, name, true));
                  ASSIGN_OR_RETURN(auto old, t.get(xattrKey(ino, name)));
                  if (!old) return Status(ErrorCode::kNoAttribute, name);
                  t.clear(xattrKey(ino, name));
                  n.set_ctime_ns(nowNs());
                  storeInode(t, n);
                  return std::string();
                })
      .status();
}

}  // namespace cistern::meta
