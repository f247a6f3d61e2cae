// getattr: an inode's attributes. No permission is needed (as stat(2) needs
// only search permission on the path, checked by lookup).
#include "meta/meta_store.h"
#include "meta/schema.h"

namespace cistern::meta {

Result<Inode> MetaStore::getattr(uint64_t ino) {
  Inode out;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(out, requireInode(t, ino));
    return Status::OK();
  }));
  return out;
}

}  // namespace cistern::meta
