// Quotas (docs/quota.md): setting, reading and listing them, and writers'
// reservations.
#include <fmt/format.h>

#include <deque>

#include "kv/key_codec.h"
#include "meta/meta_store.h"
#include "meta/quota.h"
#include "meta/schema.h"

namespace cistern::meta {
namespace {

// What a subtree holds, summed in read transactions of one directory page
// each (a subtree of any size, never one huge transaction).
Status sumSubtree(kv::Engine& engine, uint64_t dir, int64_t* bytes, int64_t* inodes) {
  std::deque<uint64_t> todo{dir};
  while (!todo.empty()) {
    const uint64_t at = todo.front();
    todo.pop_front();
    std::string from = dentryBegin(at);
    for (bool more = true; more;) {
      RETURN_ON_ERROR(kv::runReadTransaction(engine, [&](kv::ReadTransaction& t) -> Status {
        ASSIGN_OR_RETURN(auto rows,
                         t.getRange(from, dentryEnd(at), {.limit = 1000, .snapshot = true}));
        for (const auto& row : rows.kvs) {
          DirEntry e;
          if (!e.ParseFromString(row.value))
            return Status(ErrorCode::kCorruption, "a directory entry does not parse");
          ASSIGN_OR_RETURN(auto n, loadInode(t, e.ino()));
          if (!n) continue;  // removed meanwhile
          *inodes += 1;
          *bytes += chargedBytes(*n);
          if (n->type() == DIRECTORY) todo.push_back(n->ino());
        }
        more = rows.more && !rows.kvs.empty();
        if (more) from = rows.kvs.back().key + '\0';
        return Status::OK();
      }));
    }
  }
  return Status::OK();
}

Result<Quota> parseQuota(std::string_view bytes, uint64_t dir) {
  Quota q;
  if (!q.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return Status(ErrorCode::kCorruption, fmt::format("quota of {} does not parse", dir));
  return q;
}

}  // namespace

Result<MetaStore::QuotaInfo> MetaStore::setQuota(uint64_t dir, uint64_t bytes_max,
                                                 uint64_t inodes_max) {
  ASSIGN_OR_RETURN(Inode d, getattr(dir));
  if (d.type() != DIRECTORY)
    return Status(ErrorCode::kNotDirectory,
                  fmt::format("inode {}: quotas are on directories", dir));
  const bool remove = bytes_max == 0 && inodes_max == 0;
  auto current = getQuota(dir);
  if (!current.ok() && current.code() != ErrorCode::kNotFound) return current.status();
  const bool existing = current.ok();
  int64_t bytes = 0, inodes = 0;
  if (!existing && !remove) RETURN_ON_ERROR(sumSubtree(engine_, dir, &bytes, &inodes));
  Quota q;
  q.set_bytes_max(bytes_max);
  q.set_inodes_max(inodes_max);
  q.set_set_ns(nowNs());
  RETURN_ON_ERROR(mutate({}, [&](kv::Transaction& t) -> Result<std::string> {
                    ASSIGN_OR_RETURN(auto raw, t.get(quotaKey(dir)));
                    if (remove) {
                      if (!raw) return std::string();
                      t.clear(quotaKey(dir));
                      t.clear(quotaUseKey(dir, true));
                      t.clear(quotaUseKey(dir, false));
                      t.atomicAdd(quotaCountKey(), -1);
                      return std::string();
                    }
                    if (!raw) {
                      t.atomicAdd(quotaCountKey(), 1);
                      t.set(quotaUseKey(dir, true), kv::encodeCounter(bytes));
                      t.set(quotaUseKey(dir, false), kv::encodeCounter(inodes));
                    }
                    t.set(quotaKey(dir), q.SerializeAsString());
                    return std::string();
                  }).status());
  if (remove) return QuotaInfo{dir, Quota(), 0, 0};
  return getQuota(dir);
}

Result<MetaStore::QuotaInfo> MetaStore::getQuota(uint64_t dir) {
  QuotaInfo out;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(auto raw, t.get(quotaKey(dir)));
    if (!raw) return Status(ErrorCode::kNotFound, fmt::format("no quota on inode {}", dir));
    ASSIGN_OR_RETURN(out.quota, parseQuota(*raw, dir));
    ASSIGN_OR_RETURN(auto use, quotaUse(t, dir, /*snapshot=*/true));
    out.dir = dir;
    std::tie(out.bytes_used, out.inodes_used) = use;
    return Status::OK();
  }));
  return out;
}

Result<std::vector<MetaStore::QuotaInfo>> MetaStore::listQuotas() {
  std::vector<uint64_t> dirs;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    dirs.clear();
    return scanRange(
        t, quotaBegin(), quotaEnd(),
        [&](const kv::KeyValue& row) -> Status {
          kv::KeyReader r(row.key);
          ASSIGN_OR_RETURN(kv::Prefix p, r.prefix());
          ASSIGN_OR_RETURN(uint64_t dir, r.u64());
          if (p == kv::Prefix::kQuota && r.done()) dirs.push_back(dir);  // not a use counter
          return Status::OK();
        },
        /*snapshot=*/true);
  }));
  std::vector<QuotaInfo> out;
  for (uint64_t dir : dirs) {
    auto q = getQuota(dir);
    if (q.code() == ErrorCode::kNotFound) continue;  // removed meanwhile
    RETURN_ON_ERROR(q);
    out.push_back(std::move(q).value());
  }
  return out;
}

Result<MetaStore::Reservation> MetaStore::reservation(uint64_t ino) {
  Reservation out;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
    ASSIGN_OR_RETURN(auto chain, quotaChain(t, n.parent()));
    out.under_quota = !chain.empty() && n.type() == REGULAR;
    out.reserve_to = static_cast<uint64_t>(chargedBytes(n));
    return Status::OK();
  }));
  return out;
}

Result<MetaStore::Reservation> MetaStore::reserve(uint64_t ino, uint64_t session, uint64_t end) {
  ASSIGN_OR_RETURN(std::string bytes, mutate({}, [&](kv::Transaction& t) -> Result<std::string> {
                     ASSIGN_OR_RETURN(Inode n, requireInode(t, ino));
                     if (session != 0) {
                       ASSIGN_OR_RETURN(auto s, t.get(sessionKey(ino, session)));
                       if (!s) {
                         return Status(
                             ErrorCode::kNotFound,
                             fmt::format("inode {} has no write session {}", ino, session));
                       }
                     } else {
                       ASSIGN_OR_RETURN(bool open, hasSessions(t, ino));
                       if (!open) {
                         return Status(ErrorCode::kInvalidArgument,
                                       fmt::format("inode {} is not open for writing", ino));
                       }
                     }
                     ASSIGN_OR_RETURN(auto chain, quotaChain(t, n.parent()));
                     ReserveResp r;
                     r.set_under_quota(!chain.empty());
                     if (!r.under_quota() || end <= static_cast<uint64_t>(chargedBytes(n))) {
                       r.set_reserve_to(static_cast<uint64_t>(chargedBytes(n)));
                     } else {
                       const Inode before = n;
                       n.set_quota_reserved(end);
                       RETURN_ON_ERROR(recharge(t, before, n, /*force=*/false));
                       storeInode(t, n);
                       r.set_reserve_to(end);
                     }
                     return r.SerializeAsString();
                   }));
  ReserveResp r;
  if (!r.ParseFromString(bytes)) return Status(ErrorCode::kInternal, "reservation result");
  return Reservation{r.under_quota(), r.reserve_to()};
}

}  // namespace cistern::meta
