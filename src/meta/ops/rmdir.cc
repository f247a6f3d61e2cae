// rmdir: removes an empty directory. "." is kInvalidArgument and ".." is
// kNotEmpty, as on Linux.
#include "meta/meta_store.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {

Status MetaStore::rmdir(const Caller& c, uint64_t parent, std::string_view name,
                        const RequestId& rid) {
  RETURN_ON_ERROR(checkName(name));
  if (name == ".") return Status(ErrorCode::kInvalidArgument, "rmdir of .");
  if (name == "..") return Status(ErrorCode::kNotEmpty, "rmdir of ..");
  return mutate(rid,
                [&](kv::Transaction& t) -> Result<std::string> {
                  ASSIGN_OR_RETURN(Removal r, entryToRemove(t, c, parent, name));
                  Inode& victim = r.victim;
                  if (victim.type() != DIRECTORY) return Status(ErrorCode::kNotDirectory, name);
                  RETURN_ON_ERROR(checkSticky(r.dir, victim, c));
                  ASSIGN_OR_RETURN(bool busy, hasEntries(t, victim.ino()));
                  if (busy) return Status(ErrorCode::kNotEmpty, name);
                  t.clear(dentryKey(parent, name));
                  RETURN_ON_ERROR(dropLink(t, std::move(victim), nowNs()));
                  return std::string();
                })
      .status();
}

}  // namespace cistern::meta
