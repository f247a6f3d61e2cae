// lookup: the inode a name in a directory refers to. Needs search (x)
// permission on the directory. "." is the directory, ".." its parent.
#include <fmt/format.h>

#include "meta/meta_store.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {

Result<Inode> MetaStore::lookup(const Caller& c, uint64_t parent, std::string_view name) {
  RETURN_ON_ERROR(checkName(name));
  Inode out;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(Inode dir, requireInode(t, parent));
    if (dir.type() != DIRECTORY)
      return Status(ErrorCode::kNotDirectory, fmt::format("inode {}", parent));
    RETURN_ON_ERROR(checkAccess(dir, c, kMayExec));
    if (name == ".") {
      out = std::move(dir);
      return Status::OK();
    }
    if (name == "..") {
      ASSIGN_OR_RETURN(out, requireInode(t, dir.parent()));
      return Status::OK();
    }
    ASSIGN_OR_RETURN(auto entry, loadDentry(t, parent, name));
    if (!entry) return Status(ErrorCode::kNotFound, name);
    ASSIGN_OR_RETURN(out, requireInode(t, entry->ino()));
    return Status::OK();
  }));
  return out;
}

}  // namespace cistern::meta
