// open and close. A write open records a session (kSession, ino, id) so that
// an unlinked file stays until its last writer closes, and so that the GC
// worker leaves the chunks of a file being written alone. close() reports the
// length the writer reached and ends the session; a close may also hand over
// a small file's bytes to keep inline (ops/inline.cc).
#include <fmt/format.h>

#include "common/log.h"
#include "meta/meta_store.h"
#include "meta/ops/inline.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/quota.h"
#include "meta/schema.h"

namespace cistern::meta {

Result<MetaStore::Opened> MetaStore::open(const Caller& c, uint64_t ino, bool read, bool write,
                                          bool truncate, std::string_view client,
                                          const RequestId& rid, bool hold) {
  if (truncate && !write)
    return Status(ErrorCode::kInvalidArgument, "O_TRUNC without write access");
  if (!write && !hold) {
    // A read open changes nothing: a read-only transaction, no idempotency record, no commit.
    Opened out;
    RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
      ASSIGN_OR_RETURN(out.inode, requireInode(t, ino));
      if (out.inode.type() == SYMLINK)
        return Status(ErrorCode::kInvalidArgument, fmt::format("open of symlink {}", ino));
      RETURN_ON_ERROR(checkAccess(out.inode, c, read ? kMayRead : 0));
      if (read) {
        ASSIGN_OR_RETURN(out.inline_data, loadInline(t, out.inode));
      }
      return Status::OK();
    }));
    return out;
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
                     bool changed = false;
                     const Inode before = n;
                     if (truncate && (n.size() > 0 || n.data_inline())) {
                       // The client removed the chunks before this commit (the old bytes never
                       // show through a hole of the new contents).
                       RETURN_ON_ERROR(notConverting(n, nowNs()));
                       if (n.data_inline() && n.convert_token() != 0) {
                         // A conversion whose lease ran out may have left chunk 0: the file
                         // stays inline, empty, and the writer's conversion removes it.
                         t.set(inlineKey(ino), std::string());
                       } else if (n.data_inline()) {
                         n.set_data_inline(false);
                         t.clear(inlineKey(ino));
                       }
                       n.set_size(0);
                       n.set_mtime_ns(nowNs());
                       n.set_ctime_ns(n.mtime_ns());
                       changed = true;
                     }
                     if (write && n.inline_ok()) {
                       n.set_inline_ok(false);  // a second writer: its bytes go to chunks
                       changed = true;
                     }
                     if (changed) {
                       RETURN_ON_ERROR(recharge(t, before, n, /*force=*/true));
                       storeInode(t, n);
                     }
                     OpenResp r;
                     if (read) {
                       ASSIGN_OR_RETURN(*r.mutable_inline_data(), loadInline(t, n));
                     }
                     *r.mutable_inode() = std::move(n);
                     r.set_session(write || hold ? session : 0);
                     return r.SerializeAsString();
                   }));
  OpenResp r;
  if (!r.ParseFromString(bytes))
    return Status(ErrorCode::kCorruption,
                  fmt::format("open result of inode {} does not parse", ino));
  return Opened{std::move(*r.mutable_inode()), r.session(), std::move(*r.mutable_inline_data())};
}

Result<Inode> MetaStore::close(uint64_t ino, uint64_t session, uint64_t length, bool wrote,
                               const RequestId& rid, const std::optional<std::string>& inline_data,
                               bool durable) {
  ASSIGN_OR_RETURN(
      std::string bytes,
      mutate(
          rid,
          [&](kv::Transaction& t) { return closeIn(t, ino, session, length, wrote, inline_data); },
          durable));
  return parseInode(bytes);
}

Result<std::string> MetaStore::closeIn(kv::Transaction& t, uint64_t ino, uint64_t session,
                                       uint64_t length, bool wrote,
                                       const std::optional<std::string>& inline_data) {
  ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
  const Inode before = n;
  if (session != 0) {
    ASSIGN_OR_RETURN(auto s, t.get(sessionKey(ino, session)));
    if (s) {
      t.clear(sessionKey(ino, session));
    } else {
      // Ended by reapSessions(): its client stopped renewing, yet was only
      // slow. Its bytes are in storage; the length still counts. Nothing
      // stays inline without the creating session.
      CLOG_WARN("meta", "close of inode {}: session {} had ended (its client stopped renewing)",
                ino, session);
      session = 0;
    }
  }
  bool changed = false;
  if (inline_data) {
    RETURN_ON_ERROR(takeInline(t, n, session, length, *inline_data, options_.inline_max_bytes));
    changed = true;
  } else if (wrote && n.data_inline()) {
    return Status(ErrorCode::kInlineRefused,
                  fmt::format("inode {} is inline: chunk writes need a conversion first", ino));
  } else if (wrote && n.inline_ok()) {
    n.set_inline_ok(false);  // its bytes are in chunks now
    changed = true;
  }
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
      // Last close of an unlinked file: queue its chunks and drop the inode
      // (and what it was charged).
      queueGc(t, n);
      RETURN_ON_ERROR(removeInode(t, before));
      return n.SerializeAsString();
    }
  }
  if (n.quota_reserved() != 0) {
    // The last writer gone: the file is charged its size, no more.
    ASSIGN_OR_RETURN(bool others, hasSessions(t, ino));
    if (!others) {
      n.set_quota_reserved(0);
      changed = true;
    }
  }
  if (changed) {
    // Bytes already written count even past a limit (a quota set while the
    // file was open, a writer that did not reserve).
    RETURN_ON_ERROR(recharge(t, before, n, /*force=*/true));
    storeInode(t, n);
  }
  return n.SerializeAsString();
}

}  // namespace cistern::meta
