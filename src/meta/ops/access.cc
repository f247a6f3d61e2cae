// access(2) and batch getattr: read-only checks on inodes.
#include "meta/meta_store.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {

Status MetaStore::access(const Caller& c, uint64_t ino, int mask) {
  ASSIGN_OR_RETURN(Inode n, getattr(ino));
  if (mask == 0) return Status::OK();
  return checkAccess(n, c, mask);
}

std::vector<Result<Inode>> MetaStore::batchGetattr(const std::vector<uint64_t>& inos) {
  std::vector<Result<Inode>> out;
  out.reserve(inos.size());
  Status s = kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    for (uint64_t ino : inos) out.push_back(requireInode(t, ino));
    return Status::OK();
  });
  if (!s.ok()) {
    out.clear();
    for (size_t i = 0; i < inos.size(); ++i) out.push_back(s);
  }
  return out;
}

}  // namespace cistern::meta
