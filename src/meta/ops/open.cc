// open and close. A write open records a session (kSession, ino, id) so that
// an unlinked file stays until its last writer closes, and so that the GC
// worker leaves the chunks of a file being written alone. close() reports the
// length the writer reached and ends the session.
#include <fmt/format.h>

#include "meta/meta_store.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {

Result<MetaStore::Opened> MetaStore::open(const Caller& c, uint64_t ino, bool read, bool write,
                                          bool truncate, std::string_view client,
                                          const RequestId& rid, bool hold) {
  if (truncate && !write)
    return Status(ErrorCode::kInvalidArgument, "O_TRUNC without write access");
  if (!write && !hold) {
    // A read open changes nothing: a read-only transaction, no idempotency record, no commit.
    Inode out;
    RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
      ASSIGN_OR_RETURN(out, requireInode(t, ino));
      if (out.type() == SYMLINK)
        return Status(ErrorCode::kInvalidArgument, fmt::format("open of symlink {}", ino));
      return checkAccess(out, c, read ? kMayRead : 0);
    }));
    return Opened{std::move(out), 0};
  }
  uint64_t session = 0;
  ASSIGN_OR_RETURN(session, allocator_.next());
  ASSIGN_OR_RETURN(std::string bytes, mutate(rid, [&](kv::Transaction& t) -> Result<std::string> {
                     ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
                     if (n.type() == DIRECTORY && (write || hold))
                       return Status(ErrorCode::kIsDirectory, fmt::format("inode {}", ino));
                     if (n.type() == SYMLINK)
                       return Status(ErrorCode::kInvalidArgument,
                                     fmt::format("open of symlink {}", ino));
                     int mask = (read ? kMayRead : 0) | (write ? kMayWrite : 0);
                     RETURN_ON_ERROR(checkAccess(n, c, mask));
                     if (write || hold) {
                       Session s;
                       s.set_client(std::string(client));
                       s.set_opened_ns(nowNs());
                       t.set(sessionKey(ino, session), s.SerializeAsString());
                     }
                     if (truncate && n.size() > 0) {
                       queueGc(t, n, 0, /*whole_file=*/false);
                       n.set_size(0);
                       n.set_mtime_ns(nowNs());
                       n.set_ctime_ns(n.mtime_ns());
                       storeInode(t, n);
                     }
                     return n.SerializeAsString();
                   }));
  ASSIGN_OR_RETURN(Inode inode, parseInode(bytes));
  return Opened{std::move(inode), session};
}

Result<Inode> MetaStore::close(uint64_t ino, uint64_t session, uint64_t length, bool wrote,
                               const RequestId& rid) {
  ASSIGN_OR_RETURN(std::string bytes, mutate(rid, [&](kv::Transaction& t) -> Result<std::string> {
                     ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
                     if (session != 0) {
                       ASSIGN_OR_RETURN(auto s, t.get(sessionKey(ino, session)));
                       if (!s)
                         return Status(ErrorCode::kNotFound,
                                       fmt::format("session {} of inode {}", session, ino));
                       t.clear(sessionKey(ino, session));
                     }
                     bool changed = false;
                     if (length > n.size()) {
                       n.set_size(length);
                       changed = true;
                     }
                     if (wrote) {
                       n.set_mtime_ns(nowNs());
                       n.set_ctime_ns(n.mtime_ns());
                       changed = true;
                     }
                     if (n.nlink() == 0 && n.type() == REGULAR) {
                       ASSIGN_OR_RETURN(bool others, hasSessions(t, ino));
                       if (!others) {
                         // Last close of an unlinked file: queue the chunks at the final length and
                         // drop the inode.
                         queueGc(t, n, 0, /*whole_file=*/true);
                         t.clear(inodeKey(ino));
                         t.atomicAdd(inodeCountKey(), -1);
                         RETURN_ON_ERROR(clearXattrs(t, ino));
                         return n.SerializeAsString();
                       }
                     }
                     if (changed) storeInode(t, n);
                     return n.SerializeAsString();
                   }));
  return parseInode(bytes);
}

}  // namespace cistern::meta
