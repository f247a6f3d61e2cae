// mkdir: a new empty directory. Needs w+x on the parent; the new directory
// inherits the parent's layout for files created in it.
#include "meta/meta_store.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {

Result<Inode> MetaStore::mkdir(const Caller& c, uint64_t parent, std::string_view name,
                               uint32_t mode, const RequestId& rid) {
  RETURN_ON_ERROR(checkName(name));
  if (isDotOrDotDot(name)) return Status(ErrorCode::kAlreadyExists, name);
  // Taken outside the transaction, so that retries reuse it.
  ASSIGN_OR_RETURN(uint64_t ino, allocator_.next());
  ASSIGN_OR_RETURN(std::string bytes, mutate(rid, [&](kv::Transaction& t) -> Result<std::string> {
                     ASSIGN_OR_RETURN(Inode dir, dirForNewName(t, c, parent, name));
                     Inode n = newInode(ino, DIRECTORY, mode, c, dir, nowNs());
                     n.set_parent(parent);
                     if (dir.has_dir_layout()) *n.mutable_dir_layout() = dir.dir_layout();
                     RETURN_ON_ERROR(insertNewInode(t, parent, name, n));
                     return n.SerializeAsString();
                   }));
  return parseInode(bytes);
}

}  // namespace cistern::meta
