#include "meta/schema.h"

#include <fmt/format.h>

#include "kv/key_codec.h"
#include "meta/quota.h"

namespace cistern::meta {

using kv::KeyReader;
using kv::KeyWriter;
using kv::Prefix;

std::string inodeKey(uint64_t ino) { return KeyWriter(Prefix::kInode).u64(ino).key(); }
std::string dentryKey(uint64_t parent, std::string_view name) {
  return KeyWriter(Prefix::kDentry).u64(parent).bytes(name).key();
}
std::string dentryBegin(uint64_t parent) { return KeyWriter(Prefix::kDentry).u64(parent).key(); }
std::string dentryEnd(uint64_t parent) { return kv::strinc(dentryBegin(parent)); }
std::string allocatorKey() { return KeyWriter(Prefix::kInodeAlloc).key(); }
std::string mutationKey(std::string_view client, uint64_t seq) {
  return KeyWriter(Prefix::kIdempotency).bytes(client).u64(seq).key();
}
std::string gcKey(uint64_t ino, uint64_t first_chunk, uint64_t end_chunk) {
  return KeyWriter(Prefix::kGcQueue).u64(ino).u64(first_chunk).u64(end_chunk).key();
}

void queueGc(kv::Transaction& txn, const Inode& inode) {
  uint64_t chunk = inode.layout().chunk_size();
  if (inode.type() != REGULAR || chunk == 0) return;
  GcEntry e;
  *e.mutable_layout() = inode.layout();
  e.set_first_chunk(0);
  e.set_end_chunk((inode.size() + chunk - 1) / chunk);
  e.set_whole_file(true);
  e.set_no_chunks(inode.data_inline() && inode.convert_token() == 0);
  txn.set(gcKey(inode.ino(), 0, e.end_chunk()), e.SerializeAsString());
}
std::string clientLeaseKey(std::string_view client) {
  return KeyWriter(Prefix::kClientLease).bytes(client).key();
}
std::string xattrKey(uint64_t ino, std::string_view name) {
  return KeyWriter(Prefix::kXattr).u64(ino).bytes(name).key();
}
std::string inlineKey(uint64_t ino) { return KeyWriter(Prefix::kInlineData).u64(ino).key(); }
std::string sessionKey(uint64_t ino, uint64_t session) {
  return KeyWriter(Prefix::kSession).u64(ino).u64(session).key();
}
std::string sessionBegin(uint64_t ino) { return KeyWriter(Prefix::kSession).u64(ino).key(); }
std::string sessionEnd(uint64_t ino) { return kv::strinc(sessionBegin(ino)); }

Result<bool> hasSessions(kv::ReadTransaction& txn, uint64_t ino) {
  ASSIGN_OR_RETURN(auto rows, txn.getRange(sessionBegin(ino), sessionEnd(ino), {.limit = 1}));
  return !rows.kvs.empty();
}

std::string xattrBegin(uint64_t ino) { return KeyWriter(Prefix::kXattr).u64(ino).key(); }
std::string xattrEnd(uint64_t ino) { return kv::strinc(xattrBegin(ino)); }
std::string gcBegin() { return KeyWriter(Prefix::kGcQueue).key(); }
std::string gcEnd() { return kv::strinc(gcBegin()); }
std::string tenantKey(std::string_view name) {
  return KeyWriter(Prefix::kTenant).bytes(name).key();
}
std::string tenantBegin() { return KeyWriter(Prefix::kTenant).key(); }
std::string tenantEnd() { return kv::strinc(tenantBegin()); }
std::string tenantIdCounterKey() { return KeyWriter(Prefix::kStats).bytes("tenant-ids").key(); }
std::string quotaKey(uint64_t dir) { return KeyWriter(Prefix::kQuota).u64(dir).key(); }
std::string quotaUseKey(uint64_t dir, bool bytes) {
  return KeyWriter(Prefix::kQuota).u64(dir).bytes(bytes ? "bytes" : "inodes").key();
}
std::string quotaBegin() { return KeyWriter(Prefix::kQuota).key(); }
std::string quotaEnd() { return kv::strinc(quotaBegin()); }
std::string quotaCountKey() { return KeyWriter(Prefix::kStats).bytes("quotas").key(); }
std::string revokedKey(uint64_t token_id) {
  return KeyWriter(Prefix::kRevoked).u64(token_id).key();
}
std::string revokedBegin() { return KeyWriter(Prefix::kRevoked).key(); }
std::string revokedEnd() { return kv::strinc(revokedBegin()); }
std::string legacyInodeCountKey() { return KeyWriter(Prefix::kStats).bytes("inodes").key(); }
std::string inodeCountKey(uint64_t ino) {
  return KeyWriter(Prefix::kStats).bytes("inodes").u64(ino % kInodeCountShards).key();
}

Result<int64_t> inodeCount(kv::ReadTransaction& t, bool snapshot) {
  // The shards' keys extend the unsharded one: one range holds them all.
  const std::string begin = legacyInodeCountKey();
  ASSIGN_OR_RETURN(auto rows, t.getRange(begin, kv::strinc(begin), {.snapshot = snapshot}));
  int64_t n = 0;
  for (const auto& row : rows.kvs) n += kv::decodeCounter(row.value);
  return n;
}

Result<std::string> dentryName(std::string_view key, uint64_t parent) {
  KeyReader r(key);
  ASSIGN_OR_RETURN(Prefix p, r.prefix());
  ASSIGN_OR_RETURN(uint64_t got_parent, r.u64());
  ASSIGN_OR_RETURN(std::string name, r.bytes());
  if (p != Prefix::kDentry || got_parent != parent || !r.done()) {
    return Status(ErrorCode::kCorruption, "dentry key does not belong to the directory");
  }
  return name;
}

Status scanRange(kv::ReadTransaction& t, const std::string& begin, const std::string& end,
                 const std::function<Status(const kv::KeyValue&)>& fn, bool snapshot) {
  std::string from = begin;
  while (true) {
    ASSIGN_OR_RETURN(auto rows, t.getRange(from, end, {.limit = 10000, .snapshot = snapshot}));
    for (const auto& row : rows.kvs) RETURN_ON_ERROR(fn(row));
    if (!rows.more || rows.kvs.empty()) return Status::OK();
    from = rows.kvs.back().key + '\0';
  }
}

Result<std::optional<Inode>> loadInode(kv::ReadTransaction& txn, uint64_t ino) {
  ASSIGN_OR_RETURN(auto raw, txn.get(inodeKey(ino)));
  if (!raw) return std::optional<Inode>();
  Inode inode;
  if (!inode.ParseFromString(*raw) || inode.ino() != ino) {
    return Status(ErrorCode::kCorruption, fmt::format("inode {} record does not parse", ino));
  }
  return std::optional<Inode>(std::move(inode));
}

Result<Inode> requireInode(kv::ReadTransaction& txn, uint64_t ino) {
  ASSIGN_OR_RETURN(auto inode, loadInode(txn, ino));
  if (!inode) return Status(ErrorCode::kNotFound, fmt::format("inode {}", ino));
  return std::move(*inode);
}

void storeInode(kv::Transaction& txn, const Inode& inode) {
  txn.set(inodeKey(inode.ino()), inode.SerializeAsString());
}

Result<std::optional<DirEntry>> loadDentry(kv::ReadTransaction& txn, uint64_t parent,
                                           std::string_view name) {
  ASSIGN_OR_RETURN(auto raw, txn.get(dentryKey(parent, name)));
  if (!raw) return std::optional<DirEntry>();
  DirEntry e;
  if (!e.ParseFromString(*raw)) {
    return Status(ErrorCode::kCorruption, fmt::format("dentry {}/{} does not parse", parent, name));
  }
  return std::optional<DirEntry>(std::move(e));
}

void storeDentry(kv::Transaction& txn, uint64_t parent, std::string_view name, const DirEntry& e) {
  txn.set(dentryKey(parent, name), e.SerializeAsString());
}

Status clearXattrs(kv::Transaction& txn, uint64_t ino) {
  // Point deletes, not a range tombstone per unlink: RocksDB reads slow down
  // as range tombstones pile up. An inode has few attributes.
  ASSIGN_OR_RETURN(auto rows, txn.getRange(xattrBegin(ino), xattrEnd(ino)));
  for (const auto& row : rows.kvs) txn.clear(row.key);
  return Status::OK();
}

Status dropLink(kv::Transaction& txn, Inode inode, int64_t now_ns) {
  inode.set_ctime_ns(now_ns);
  if (inode.type() != DIRECTORY && inode.nlink() > 1) {
    inode.set_nlink(inode.nlink() - 1);
    storeInode(txn, inode);
    return Status::OK();
  }
  inode.set_nlink(0);
  if (inode.type() == REGULAR) {
    queueGc(txn, inode);
    ASSIGN_OR_RETURN(bool open, hasSessions(txn, inode.ino()));
    if (open) {
      storeInode(txn, inode);  // open-unlinked: the last close removes it
      return Status::OK();
    }
  }
  return removeInode(txn, inode);
}

Status removeInode(kv::Transaction& txn, const Inode& inode) {
  const uint64_t ino = inode.ino();
  ASSIGN_OR_RETURN(auto chain, quotaChain(txn, inode.parent()));
  RETURN_ON_ERROR(charge(txn, chain, -chargedBytes(inode), -1, /*force=*/true));
  if (inode.type() == DIRECTORY) {
    ASSIGN_OR_RETURN(auto quota, txn.get(quotaKey(ino)));
    if (quota) {
      txn.clear(quotaKey(ino));
      txn.clear(quotaUseKey(ino, true));
      txn.clear(quotaUseKey(ino, false));
      txn.atomicAdd(quotaCountKey(), -1);
    }
  }
  txn.clear(inodeKey(ino));
  txn.clear(inlineKey(ino));
  txn.atomicAdd(inodeCountKey(ino), -1);
  return clearXattrs(txn, ino);
}

Result<bool> hasEntries(kv::ReadTransaction& txn, uint64_t ino) {
  ASSIGN_OR_RETURN(auto rows, txn.getRange(dentryBegin(ino), dentryEnd(ino), {.limit = 1}));
  return !rows.kvs.empty();
}

Result<std::vector<uint32_t>> loadChainIds(kv::ReadTransaction& txn) {
  ASSIGN_OR_RETURN(auto rows, txn.getRange(chainBegin(), chainEnd(), {.snapshot = true}));
  std::vector<uint32_t> ids;
  for (const auto& kv : rows.kvs) {
    KeyReader r(kv.key);
    ASSIGN_OR_RETURN(Prefix p, r.prefix());
    (void)p;
    ASSIGN_OR_RETURN(uint64_t id, r.u64());
    ids.push_back(static_cast<uint32_t>(id));
  }
  return ids;
}

}  // namespace cistern::meta
