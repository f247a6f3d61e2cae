#include "meta/ops/new_inode.h"

#include <fmt/format.h>

#include "meta/permission.h"
#include "meta/quota.h"
#include "meta/schema.h"

namespace cistern::meta {

Result<Inode> searchableDir(kv::ReadTransaction& t, const Caller& c, uint64_t parent) {
  ASSIGN_OR_RETURN(Inode dir, requireInode(t, parent));
  if (dir.type() != DIRECTORY)
    return Status(ErrorCode::kNotDirectory, fmt::format("inode {}", parent));
  RETURN_ON_ERROR(checkAccess(dir, c, kMayExec));
  return dir;
}

Result<Inode> dirForNewName(kv::ReadTransaction& t, const Caller& c, uint64_t parent,
                            std::string_view name) {
  ASSIGN_OR_RETURN(Inode dir, searchableDir(t, c, parent));
  ASSIGN_OR_RETURN(auto existing, loadDentry(t, parent, name));
  if (existing) return Status(ErrorCode::kAlreadyExists, name);
  RETURN_ON_ERROR(checkAccess(dir, c, kMayWrite));
  return dir;
}

Result<Removal> entryToRemove(kv::ReadTransaction& t, const Caller& c, uint64_t parent,
                              std::string_view name) {
  Removal r;
  ASSIGN_OR_RETURN(r.dir, searchableDir(t, c, parent));
  ASSIGN_OR_RETURN(auto entry, loadDentry(t, parent, name));
  if (!entry) return Status(ErrorCode::kNotFound, name);
  RETURN_ON_ERROR(checkAccess(r.dir, c, kMayWrite));
  ASSIGN_OR_RETURN(r.victim, requireInode(t, entry->ino()));
  return r;
}

Inode newInode(uint64_t ino, FileType type, uint32_t mode, const Caller& c, const Inode& dir,
               int64_t now_ns) {
  Inode n;
  n.set_ino(ino);
  n.set_type(type);
  n.set_mode(mode & 07777);
  n.set_uid(c.uid());
  n.set_gid(c.gid());
  if (dir.mode() & 02000) {
    n.set_gid(dir.gid());
    if (type == DIRECTORY) n.set_mode(n.mode() | 02000);
  }
  // A non-member may not create a set-group-ID file (it is silently dropped, as on Linux).
  if (type == REGULAR && (n.mode() & 02000) && c.uid() != 0 && !inGroup(c, n.gid())) {
    n.set_mode(n.mode() & ~02000u);
  }
  n.set_nlink(1);
  n.set_tenant(dir.tenant());
  n.set_parent(dir.ino());
  n.set_atime_ns(now_ns);
  n.set_mtime_ns(now_ns);
  n.set_ctime_ns(now_ns);
  return n;
}

Status insertNewInode(kv::Transaction& t, uint64_t parent, std::string_view name, const Inode& n) {
  ASSIGN_OR_RETURN(auto chain, quotaChain(t, parent));
  RETURN_ON_ERROR(charge(t, chain, chargedBytes(n), 1, /*force=*/false));
  storeInode(t, n);
  t.atomicAdd(inodeCountKey(n.ino()), 1);
  DirEntry e;
  e.set_ino(n.ino());
  e.set_type(n.type());
  storeDentry(t, parent, name, e);
  return Status::OK();
}

Result<Inode> parseInode(const std::string& bytes) {
  Inode n;
  if (!n.ParseFromString(bytes))
    return Status(ErrorCode::kCorruption, "inode result does not parse");
  return n;
}

}  // namespace cistern::meta
