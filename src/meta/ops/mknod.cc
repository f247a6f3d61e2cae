// mknod: a FIFO, a socket or a device node. cistern keeps the node (mode,
// owner, times, rdev); the kernel moves its data. Checks in Linux's order
// (do_mknodat, vfs_mknod): the type, then the name (kAlreadyExists), then
// write permission on the directory, then CAP_MKNOD (root here) for devices.
#include <fmt/format.h>

#include "meta/meta_store.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/schema.h"
#include "proto/file_type.h"

namespace cistern::meta {

Result<Inode> MetaStore::mknod(const Caller& c, uint64_t parent, std::string_view name,
                               FileType type, uint32_t mode, uint64_t rdev, const RequestId& rid) {
  if (!isSpecial(type)) {
    return Status(
        ErrorCode::kInvalidArgument,
        fmt::format("mknod of type {}: only FIFOs, sockets and devices", static_cast<int>(type)));
  }
  RETURN_ON_ERROR(checkName(name));
  if (isDotOrDotDot(name)) return Status(ErrorCode::kAlreadyExists, name);
  const bool device = type == CHAR_DEVICE || type == BLOCK_DEVICE;
  ASSIGN_OR_RETURN(uint64_t ino, allocator_.next());
  ASSIGN_OR_RETURN(std::string bytes, mutate(rid, [&](kv::Transaction& t) -> Result<std::string> {
                     ASSIGN_OR_RETURN(Inode dir, dirForNewName(t, c, parent, name));
                     if (device && c.uid() != 0) {
                       return Status(ErrorCode::kNotPermitted,
                                     fmt::format("device node {}: uid {} is not root (CAP_MKNOD)",
                                                 name, c.uid()));
                     }
                     Inode n = newInode(ino, type, mode, c, dir, nowNs());
                     if (device) n.set_rdev(rdev);
                     RETURN_ON_ERROR(insertNewInode(t, parent, name, n));
                     return n.SerializeAsString();
                   }));
  return parseInode(bytes);
}

}  // namespace cistern::meta
