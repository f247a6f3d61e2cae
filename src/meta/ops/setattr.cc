// setattr: chmod, chown, truncate and utimens, with Linux's permission rules:
// only the owner (or root) changes the mode or sets explicit times; only root
// changes the owner; the owner may change the group to one it belongs to;
// truncate needs write permission; a chown drops set-user/group-ID bits.
#include <fmt/format.h>

#include "meta/meta_store.h"
#include "meta/ops/inline.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/quota.h"
#include "meta/schema.h"
#include "proto/file_type.h"

namespace cistern::meta {
namespace {

bool isOwner(const Caller& c, const Inode& n) { return c.uid() == 0 || c.uid() == n.uid(); }

Status notOwner(const Inode& n, std::string_view what) {
  return Status(ErrorCode::kNotPermitted,
                fmt::format("{} of inode {} needs its owner or root", what, n.ino()));
}

}  // namespace

Result<Inode> MetaStore::setattr(const Caller& c, uint64_t ino, const SetAttr& a,
                                 const RequestId& rid) {
  ASSIGN_OR_RETURN(
      std::string bytes, mutate(rid, [&](kv::Transaction& t) -> Result<std::string> {
        ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
        int64_t now = nowNs();
        bool changed = false;
        if (a.uid || a.gid) {
          bool uid_change = a.uid && *a.uid != n.uid();
          bool gid_change = a.gid && *a.gid != n.gid();
          if (uid_change && c.uid() != 0) return notOwner(n, "changing the owner");
          if (gid_change && c.uid() != 0 && (c.uid() != n.uid() || !inGroup(c, *a.gid))) {
            return Status(
                ErrorCode::kNotPermitted,
                fmt::format("uid {} may not give inode {} to group {}", c.uid(), n.ino(), *a.gid));
          }
          if (a.uid) n.set_uid(*a.uid);
          if (a.gid) n.set_gid(*a.gid);
          if (n.type() == REGULAR && (uid_change || gid_change)) n.set_mode(n.mode() & ~06000u);
          changed = true;
        }
        if (a.mode) {
          if (!isOwner(c, n)) return notOwner(n, "chmod");
          uint32_t mode = *a.mode & 07777;
          if (c.uid() != 0 && !inGroup(c, n.gid())) mode &= ~02000u;
          n.set_mode(mode);
          changed = true;
        }
        if (a.size) {
          if (n.type() == DIRECTORY)
            return Status(ErrorCode::kIsDirectory, fmt::format("truncate inode {}", ino));
          if (n.type() != REGULAR)
            return Status(ErrorCode::kInvalidArgument, fmt::format("truncate inode {}", ino));
          RETURN_ON_ERROR(checkAccess(n, c, kMayWrite));
          if (*a.size > kMaxFileBytes) {
            return Status(ErrorCode::kFileTooLarge,
                          fmt::format("truncate inode {} to {} bytes: the limit is {}", ino,
                                      *a.size, kMaxFileBytes));
          }
          n.set_inline_ok(false);
          if (n.data_inline() && *a.size != n.size()) {
            // In place while it fits; past inline_max_bytes the client moves the bytes to
            // chunks first (uninline) and asks again.
            RETURN_ON_ERROR(notConverting(n, now));
            if (*a.size > options_.inline_max_bytes) {
              return Status(ErrorCode::kInlineRefused,
                            fmt::format("inode {} is inline: {} bytes do not fit", ino, *a.size));
            }
            ASSIGN_OR_RETURN(std::string data, loadInline(t, n));
            data.resize(*a.size, '\0');
            t.set(inlineKey(ino), data);
          }
          // A chunked file's bytes past a smaller size left storage before this commit: the
          // client cut them (docs/client.md, "Truncate"). Growing is checked against the
          // quotas above it.
          const Inode grown_from = n;
          n.set_size(*a.size);
          RETURN_ON_ERROR(recharge(t, grown_from, n, /*force=*/*a.size <= grown_from.size()));
          n.set_mtime_ns(now);
          changed = true;
        }
        if (a.atime_ns || a.mtime_ns) {
          if (!isOwner(c, n)) return notOwner(n, "setting explicit times");
        } else if (a.atime_now || a.mtime_now) {
          if (!isOwner(c, n)) RETURN_ON_ERROR(checkAccess(n, c, kMayWrite));
        }
        if (a.atime_ns) n.set_atime_ns(*a.atime_ns);
        if (a.mtime_ns) n.set_mtime_ns(*a.mtime_ns);
        if (a.atime_now) n.set_atime_ns(now);
        if (a.mtime_now) n.set_mtime_ns(now);
        changed |= a.atime_ns || a.mtime_ns || a.atime_now || a.mtime_now;
        if (changed) {
          n.set_ctime_ns(now);
          storeInode(t, n);
        }
        return n.SerializeAsString();
      }));
  return parseInode(bytes);
}

}  // namespace cistern::meta
