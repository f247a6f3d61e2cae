// readdir / readdirplus: a page of a directory's entries in name order, from
// one consistent snapshot. The cookie is the last name returned, so paging
// while others insert and delete never returns an entry twice and returns
// every entry that exists throughout. Needs read permission on the directory.
#include <fmt/format.h>

#include <algorithm>

#include "meta/meta_store.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {

Result<DirListing> MetaStore::readdir(const Caller& c, uint64_t ino, std::string_view cookie,
                                      uint32_t limit, bool plus) {
  uint32_t n =
      std::min(limit == 0 ? options_.readdir_limit_max : limit, options_.readdir_limit_max);
  DirListing out;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(Inode dir, requireInode(t, ino));
    if (dir.type() != DIRECTORY)
      return Status(ErrorCode::kNotDirectory, fmt::format("inode {}", ino));
    RETURN_ON_ERROR(checkAccess(dir, c, kMayRead));
    std::string begin = cookie.empty() ? dentryBegin(ino) : dentryKey(ino, cookie) + '\0';
    ASSIGN_OR_RETURN(auto rows, t.getRange(begin, dentryEnd(ino), {.limit = n}));
    for (const auto& row : rows.kvs) {
      DirListing::Entry e;
      ASSIGN_OR_RETURN(e.name, dentryName(row.key, ino));
      if (!e.entry.ParseFromString(row.value)) {
        return Status(ErrorCode::kCorruption,
                      fmt::format("dentry {}/{} does not parse", ino, e.name));
      }
      if (plus) {
        ASSIGN_OR_RETURN(e.inode, requireInode(t, e.entry.ino()));
      }
      out.entries.push_back(std::move(e));
    }
    if (rows.more && !out.entries.empty()) out.next_cookie = out.entries.back().name;
    return Status::OK();
  }));
  return out;
}

}  // namespace cistern::meta
