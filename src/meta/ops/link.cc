// link: another name for a file or symlink; directories cannot be linked.
#include <fmt/format.h>

#include "meta/meta_store.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {

inline constexpr uint32_t kLinksMax = 65000;

Result<Inode> MetaStore::link(const Caller& c, uint64_t ino, uint64_t new_parent,
                              std::string_view new_name, const RequestId& rid) {
  RETURN_ON_ERROR(checkName(new_name));
  if (isDotOrDotDot(new_name)) return Status(ErrorCode::kAlreadyExists, new_name);
  ASSIGN_OR_RETURN(
      std::string bytes, mutate(rid, [&](kv::Transaction& t) -> Result<std::string> {
        ASSIGN_OR_RETURN(Inode dir, searchableDir(t, c, new_parent));
        ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
        if (n.type() == DIRECTORY)
          return Status(ErrorCode::kNotPermitted, fmt::format("hard link to directory {}", ino));
        if (n.tenant() != dir.tenant()) {
          return Status(ErrorCode::kCrossTenant,
                        fmt::format("inode {} of tenant {} into a directory of tenant {}", ino,
                                    n.tenant(), dir.tenant()));
        }
        ASSIGN_OR_RETURN(auto existing, loadDentry(t, new_parent, new_name));
        if (existing) return Status(ErrorCode::kAlreadyExists, new_name);
        RETURN_ON_ERROR(checkAccess(dir, c, kMayWrite));
        if (n.nlink() >= kLinksMax)
          return Status(ErrorCode::kTooManyLinks, fmt::format("inode {}", ino));
        n.set_nlink(n.nlink() + 1);
        n.set_ctime_ns(nowNs());
        storeInode(t, n);
        DirEntry e;
        e.set_ino(ino);
        e.set_type(n.type());
        storeDentry(t, new_parent, new_name, e);
        return n.SerializeAsString();
      }));
  return parseInode(bytes);
}

}  // namespace cistern::meta
