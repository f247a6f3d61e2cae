// symlink and readlink. The target is stored in the inode, at most 4095 bytes.
#include <fmt/format.h>

#include "meta/meta_store.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {

inline constexpr size_t kSymlinkTargetMax = 4095;

Result<Inode> MetaStore::symlink(const Caller& c, uint64_t parent, std::string_view name,
                                 std::string_view target, const RequestId& rid) {
  RETURN_ON_ERROR(checkName(name));
  if (isDotOrDotDot(name)) return Status(ErrorCode::kAlreadyExists, name);
  if (target.empty()) return Status(ErrorCode::kNotFound, "empty symlink target");
  if (target.size() > kSymlinkTargetMax) {
    return Status(ErrorCode::kNameTooLong,
                  fmt::format("symlink target of {} bytes", target.size()));
  }
  if (target.find('\0') != std::string_view::npos)
    return Status(ErrorCode::kInvalidArgument, "NUL in target");
  ASSIGN_OR_RETURN(uint64_t ino, allocator_.next());
  ASSIGN_OR_RETURN(std::string bytes, mutate(rid, [&](kv::Transaction& t) -> Result<std::string> {
                     ASSIGN_OR_RETURN(Inode dir, dirForNewName(t, c, parent, name));
                     Inode n = newInode(ino, SYMLINK, 0777, c, dir, nowNs());
                     n.set_symlink_target(std::string(target));
                     n.set_size(target.size());
                     RETURN_ON_ERROR(insertNewInode(t, parent, name, n));
                     return n.SerializeAsString();
                   }));
  return parseInode(bytes);
}

Result<std::string> MetaStore::readlink(uint64_t ino) {
  ASSIGN_OR_RETURN(Inode n, getattr(ino));
  if (n.type() != SYMLINK)
    return Status(ErrorCode::kInvalidArgument, fmt::format("inode {} is not a symlink", ino));
  return n.symlink_target();
}

}  // namespace cistern::meta
