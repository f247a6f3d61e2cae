// The metadata tables in the KV (docs/meta_kv_schema.md) and typed accessors.
//
//   inode      (kInode, ino)                 -> Inode
//   dentry     (kDentry, parent ino, name)   -> DirEntry
//   allocator  (kInodeAlloc)                 -> next unleased inode number (decimal)
//   mutation   (kIdempotency, client, seq)   -> MutationRecord
//   gc         (kGcQueue, ino, first, end)   -> GcEntry: chunks [first, end) to delete
//   xattr      (kXattr, ino, name)           -> value
//   session    (kSession, ino, session id)   -> Session (an open-for-write handle)
//   inode count (kStats, "inodes")           -> counter (kv::encodeCounter) of inodes in use
//   inline     (kInlineData, ino)            -> the bytes of a data_inline file
//   chains     (kChain, chain id)            -> (chain record; mgmtd owns it)
//   tenant     (kTenant, name)               -> Tenant
//   tenant ids (kStats, "tenant-ids")        -> the last tenant id given out (counter)
//   revoked    (kRevoked, token id)          -> Revoked (until the token expires)
//   quota      (kQuota, dir ino)             -> Quota (docs/quota.md)
//   quota use  (kQuota, dir ino, "bytes"|"inodes") -> counter of the subtree's use
//   quotas     (kStats, "quotas")            -> counter: how many quotas are set
//
// Functions here only read and write keys inside a caller's transaction; they
// never commit. Thread-safe as the transaction they are given.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "kv/cluster_keys.h"
#include "kv/engine.h"
#include "meta.pb.h"

namespace cistern::meta {

inline constexpr uint64_t kRootIno = 1;
// Inode numbers below this are reserved; the allocator starts here.
inline constexpr uint64_t kFirstAllocatedIno = 16;

std::string inodeKey(uint64_t ino);
std::string dentryKey(uint64_t parent, std::string_view name);
// [dentryBegin(p), dentryEnd(p)) holds exactly the entries of directory p.
std::string dentryBegin(uint64_t parent);
std::string dentryEnd(uint64_t parent);
// The name stored in a dentry key of directory `parent`.
Result<std::string> dentryName(std::string_view key, uint64_t parent);
std::string allocatorKey();
std::string mutationKey(std::string_view client, uint64_t seq);
std::string gcKey(uint64_t ino, uint64_t first_chunk, uint64_t end_chunk);
// Queues every chunk of `inode`, a regular file that is gone (or goes with
// its last writer), for deletion; the GC removes them all, those past its
// length and an inline file's leftover chunk 0 included.
void queueGc(kv::Transaction& txn, const Inode& inode);
std::string xattrKey(uint64_t ino, std::string_view name);
std::string clientLeaseKey(std::string_view client);
std::string inlineKey(uint64_t ino);
std::string tenantKey(std::string_view name);
std::string tenantBegin();
std::string tenantEnd();
std::string tenantIdCounterKey();
std::string quotaKey(uint64_t dir);
std::string quotaUseKey(uint64_t dir, bool bytes);
std::string quotaBegin();
std::string quotaEnd();
std::string quotaCountKey();
std::string revokedKey(uint64_t token_id);
std::string revokedBegin();
std::string revokedEnd();
std::string sessionKey(uint64_t ino, uint64_t session);
std::string sessionBegin(uint64_t ino);
std::string sessionEnd(uint64_t ino);
// True when `ino` has an open write session.
Result<bool> hasSessions(kv::ReadTransaction& txn, uint64_t ino);
std::string xattrBegin(uint64_t ino);
std::string xattrEnd(uint64_t ino);
std::string gcBegin();
std::string gcEnd();
// The count of inodes (statfs) is kept in kInodeCountShards counters, an
// inode counting in the one its number picks, so that creates on the etcd
// engine, where adds to one counter serialize, spread over several
// (docs/kv.md, "etcd"). A store from before the shards also has the
// unsharded counter (inodeCountKey() with no inode), which counts too.
inline constexpr uint32_t kInodeCountShards = 16;
std::string inodeCountKey(uint64_t ino);
std::string legacyInodeCountKey();
// The sum of every shard (and the unsharded counter); `snapshot`: no read
// conflict.
Result<int64_t> inodeCount(kv::ReadTransaction& t, bool snapshot);
// The chain table is mgmtd's (kv/cluster_keys.h); meta reads its ids.
using kv::chainBegin;
using kv::chainEnd;
using kv::chainKey;

// Calls `fn` on every row of [begin, end) in key order, reading pages of
// at most 10,000 rows; `snapshot`: without read conflicts.
Status scanRange(kv::ReadTransaction& t, const std::string& begin, const std::string& end,
                 const std::function<Status(const kv::KeyValue&)>& fn, bool snapshot = false);

Result<std::optional<Inode>> loadInode(kv::ReadTransaction& txn, uint64_t ino);
// kNotFound naming the inode when absent.
Result<Inode> requireInode(kv::ReadTransaction& txn, uint64_t ino);
void storeInode(kv::Transaction& txn, const Inode& inode);
Result<std::optional<DirEntry>> loadDentry(kv::ReadTransaction& txn, uint64_t parent,
                                           std::string_view name);
void storeDentry(kv::Transaction& txn, uint64_t parent, std::string_view name, const DirEntry& e);
// Drops one link of `inode` at time `now_ns`: stores it with nlink - 1, or
// when that reaches 0 queues a regular file's chunks for deletion and removes
// the inode, unless the file is open for writing: then the inode stays with
// nlink 0 (open-unlinked) until the last session closes.
Status dropLink(kv::Transaction& txn, Inode inode, int64_t now_ns);
// Removes the inode record of `inode` with its xattrs and inline bytes,
// counts it out (of the store and of the quotas above its parent), and
// drops a quota set on it.
Status removeInode(kv::Transaction& txn, const Inode& inode);
// Removes every extended attribute of `ino`.
Status clearXattrs(kv::Transaction& txn, uint64_t ino);
// True when directory `ino` has at least one entry.
Result<bool> hasEntries(kv::ReadTransaction& txn, uint64_t ino);
// Chain ids in the chain table, ascending.
Result<std::vector<uint32_t>> loadChainIds(kv::ReadTransaction& txn);

}  // namespace cistern::meta
