// unlink: removes a non-directory entry. Needs w+x on the directory and, in a
// sticky directory, ownership of the file or the directory. The last link
// removes the inode and queues the file's chunks for garbage collection.
#include "meta/meta_store.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {

Status MetaStore::unlink(const Caller& c, uint64_t parent, std::string_view name,
                         const RequestId& rid) {
  RETURN_ON_ERROR(checkName(name));
  if (isDotOrDotDot(name)) return Status(ErrorCode::kIsDirectory, name);
  return mutate(rid,
                [&](kv::Transaction& t) -> Result<std::string> {
                  ASSIGN_OR_RETURN(Removal r, entryToRemove(t, c, parent, name));
                  Inode& victim = r.victim;
                  if (victim.type() == DIRECTORY) return Status(ErrorCode::kIsDirectory, name);
                  RETURN_ON_ERROR(checkSticky(r.dir, victim, c));
                  t.clear(dentryKey(parent, name));
                  RETURN_ON_ERROR(dropLink(t, std::move(victim), nowNs()));
                  return std::string();
                })
      .status();
}

}  // namespace cistern::meta
