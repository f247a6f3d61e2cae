// rename / renameat2: moves an entry, replacing a file or an empty directory
// at the destination, or with kRenameNoReplace failing if it exists, or with
// kRenameExchange swapping the two entries. A directory may not move into its
// own subtree (kInvalidArgument): the check walks the destination's ancestors
// inside the transaction, so a concurrent rename of an ancestor conflicts
// with it and cycles cannot form.
#include <fmt/format.h>

#include "meta/meta_store.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/quota.h"
#include "meta/schema.h"

namespace cistern::meta {
namespace {

constexpr int kDepthMax = 4096;

// kInvalidArgument when directory `moved` is `dir` or one of its ancestors.
Status checkNotAncestor(kv::ReadTransaction& t, uint64_t moved, uint64_t dir) {
  uint64_t at = dir;
  for (int depth = 0; depth < kDepthMax; ++depth) {
    if (at == moved) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("directory {} cannot move into its own subtree", moved));
    }
    if (at == kRootIno) return Status::OK();
    ASSIGN_OR_RETURN(Inode node, requireInode(t, at));
    at = node.parent();
  }
  return Status(ErrorCode::kCorruption,
                fmt::format("directory {} is deeper than {}", dir, kDepthMax));
}

// An inode moving from directory `from` to `to` leaves the quotas above
// `from` and joins those above `to` (checked). A directory's subtree is not
// summed here: one may not move between different quotas (kCrossQuota,
// EXDEV; mv(1) then copies).
Status moveCharges(kv::Transaction& t, const Inode& moved, uint64_t from, uint64_t to) {
  ASSIGN_OR_RETURN(auto left, quotaChain(t, from));
  ASSIGN_OR_RETURN(auto joined, quotaChain(t, to));
  auto ids = [](const std::vector<QuotaDir>& chain) {
    std::vector<uint64_t> out;
    for (const auto& q : chain) out.push_back(q.ino);
    return out;
  };
  if (ids(left) == ids(joined)) return Status::OK();
  if (moved.type() == DIRECTORY) {
    return Status(ErrorCode::kCrossQuota,
                  fmt::format("directory {} from under a quota to another (or none)", moved.ino()));
  }
  const int64_t bytes = chargedBytes(moved);
  RETURN_ON_ERROR(charge(t, left, -bytes, -1, /*force=*/true));
  return charge(t, joined, bytes, 1, /*force=*/false);
}

}  // namespace

Status MetaStore::rename(const Caller& c, uint64_t src_parent, std::string_view src_name,
                         uint64_t dst_parent, std::string_view dst_name, uint32_t flags,
                         const RequestId& rid) {
  RETURN_ON_ERROR(checkName(src_name));
  RETURN_ON_ERROR(checkName(dst_name));
  if (isDotOrDotDot(src_name) || isDotOrDotDot(dst_name)) {
    return Status(ErrorCode::kInvalidArgument, "rename of . or ..");
  }
  if ((flags & ~(kRenameNoReplace | kRenameExchange)) ||
      (flags == (kRenameNoReplace | kRenameExchange))) {
    return Status(ErrorCode::kInvalidArgument, fmt::format("rename flags {:#x}", flags));
  }
  return mutate(rid,
                [&](kv::Transaction& t) -> Result<std::string> {
                  int64_t now = nowNs();
                  ASSIGN_OR_RETURN(Inode sdir, searchableDir(t, c, src_parent));
                  ASSIGN_OR_RETURN(Inode ddir, searchableDir(t, c, dst_parent));
                  // A tenant's inodes stay in its subtree (Inode.tenant): a
                  // move across is a copy, which mv(1) makes of EXDEV.
                  if (sdir.tenant() != ddir.tenant()) {
                    return Status(ErrorCode::kCrossTenant,
                                  fmt::format("from a directory of tenant {} to one of tenant {}",
                                              sdir.tenant(), ddir.tenant()));
                  }
                  ASSIGN_OR_RETURN(auto se, loadDentry(t, src_parent, src_name));
                  if (!se) return Status(ErrorCode::kNotFound, src_name);
                  ASSIGN_OR_RETURN(auto de, loadDentry(t, dst_parent, dst_name));
                  if ((flags & kRenameExchange) && !de)
                    return Status(ErrorCode::kNotFound, dst_name);
                  if ((flags & kRenameNoReplace) && de)
                    return Status(ErrorCode::kAlreadyExists, dst_name);
                  RETURN_ON_ERROR(checkAccess(sdir, c, kMayWrite));
                  RETURN_ON_ERROR(checkAccess(ddir, c, kMayWrite));
                  ASSIGN_OR_RETURN(Inode src, requireInode(t, se->ino()));
                  RETURN_ON_ERROR(checkSticky(sdir, src, c));
                  // Renaming a name onto itself, or onto another link of the same inode, does
                  // nothing.
                  if (de && de->ino() == se->ino()) return std::string();

                  if (flags & kRenameExchange) {
                    ASSIGN_OR_RETURN(Inode dst, requireInode(t, de->ino()));
                    RETURN_ON_ERROR(checkSticky(ddir, dst, c));
                    if (src_parent != dst_parent) {
                      if (src.type() == DIRECTORY)
                        RETURN_ON_ERROR(checkNotAncestor(t, src.ino(), dst_parent));
                      if (dst.type() == DIRECTORY)
                        RETURN_ON_ERROR(checkNotAncestor(t, dst.ino(), src_parent));
                    }
                    if (src_parent != dst_parent) {
                      RETURN_ON_ERROR(moveCharges(t, src, src_parent, dst_parent));
                      RETURN_ON_ERROR(moveCharges(t, dst, dst_parent, src_parent));
                    }
                    storeDentry(t, src_parent, src_name, *de);
                    storeDentry(t, dst_parent, dst_name, *se);
                    src.set_parent(dst_parent);
                    dst.set_parent(src_parent);
                    src.set_ctime_ns(now);
                    dst.set_ctime_ns(now);
                    storeInode(t, src);
                    storeInode(t, dst);
                    return std::string();
                  }

                  if (src.type() == DIRECTORY && src_parent != dst_parent) {
                    RETURN_ON_ERROR(checkNotAncestor(t, src.ino(), dst_parent));
                  }
                  if (src_parent != dst_parent)
                    RETURN_ON_ERROR(moveCharges(t, src, src_parent, dst_parent));
                  if (de) {
                    ASSIGN_OR_RETURN(Inode dst, requireInode(t, de->ino()));
                    RETURN_ON_ERROR(checkSticky(ddir, dst, c));
                    if (src.type() == DIRECTORY) {
                      if (dst.type() != DIRECTORY)
                        return Status(ErrorCode::kNotDirectory, dst_name);
                      ASSIGN_OR_RETURN(bool busy, hasEntries(t, dst.ino()));
                      if (busy) return Status(ErrorCode::kNotEmpty, dst_name);
                    } else if (dst.type() == DIRECTORY) {
                      return Status(ErrorCode::kIsDirectory, dst_name);
                    }
                    RETURN_ON_ERROR(dropLink(t, std::move(dst), now));
                  }
                  t.clear(dentryKey(src_parent, src_name));
                  storeDentry(t, dst_parent, dst_name, *se);
                  src.set_parent(dst_parent);
                  src.set_ctime_ns(now);
                  storeInode(t, src);
                  return std::string();
                })
      .status();
}

}  // namespace cistern::meta
