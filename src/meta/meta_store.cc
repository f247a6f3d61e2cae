#include "meta/meta_store.h"

#include <algorithm>

#include "meta/ops/inline.h"
#include "meta/quota.h"
#include "meta/schema.h"

namespace cistern::meta {

MetaStore::MetaStore(kv::Engine& engine, const MetaOptions& options, Clock& clock)
    : engine_(engine),
      options_(options),
      clock_(clock),
      allocator_(engine, options.inode_alloc_block) {
  options_.inline_max_bytes = std::min(options_.inline_max_bytes, kInlineMaxBytesLimit);
}

Status MetaStore::init() {
  return kv::runTransaction(engine_, [&](kv::Transaction& t) -> Status {
    ASSIGN_OR_RETURN(auto root, loadInode(t, kRootIno));
    if (root) return Status::OK();
    Inode r;
    r.set_ino(kRootIno);
    r.set_type(DIRECTORY);
    r.set_mode(0755);
    r.set_nlink(1);
    int64_t now = nowNs();
    r.set_atime_ns(now);
    r.set_mtime_ns(now);
    r.set_ctime_ns(now);
    r.set_parent(kRootIno);
    storeInode(t, r);
    t.atomicAdd(inodeCountKey(kRootIno), 1);
    return Status::OK();
  });
}

Result<StatFs> MetaStore::statfs(uint64_t dir) {
  StatFs out;
  std::optional<QuotaDir> quota;
  int64_t quota_bytes = 0, quota_inodes = 0;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(int64_t n, inodeCount(t, /*snapshot=*/true));
    out.inodes_used = n > 0 ? static_cast<uint64_t>(n) : 0;
    quota.reset();
    ASSIGN_OR_RETURN(auto chain, quotaChain(t, dir == 0 ? kRootIno : dir));
    if (!chain.empty()) {
      quota = chain.front();
      ASSIGN_OR_RETURN(auto use, quotaUse(t, quota->ino, /*snapshot=*/true));
      std::tie(quota_bytes, quota_inodes) = use;
    }
    return Status::OK();
  }));
  if (capacity_) {
    ASSIGN_OR_RETURN(auto cap, capacity_());
    out.bytes_total = cap.first;
    out.bytes_free = cap.second;
    out.capacity_known = true;
  }
  if (quota) {
    // df of a quota directory shows the quota (as JuiceFS does), bounded by
    // the storage's free space when that is known and smaller.
    const uint64_t used = static_cast<uint64_t>(std::max<int64_t>(quota_bytes, 0));
    if (quota->quota.bytes_max() > 0) {
      const uint64_t max = quota->quota.bytes_max();
      uint64_t free = used >= max ? 0 : max - used;
      if (out.capacity_known) free = std::min(free, out.bytes_free);
      out.bytes_total = max;
      out.bytes_free = free;
      out.capacity_known = true;
    }
    out.inodes_used = static_cast<uint64_t>(std::max<int64_t>(quota_inodes, 0));
    out.inodes_total = quota->quota.inodes_max();
  }
  return out;
}

Status MetaStore::sync() { return engine_.sync(); }

Result<std::string> MetaStore::mutate(
    const RequestId& rid, const std::function<Result<std::string>(kv::Transaction&)>& body,
    bool durable) {
  std::string result;
  const kv::Durability durability =
      durable || options_.sync_namespace ? kv::Durability::kSynced : kv::Durability::kLazy;
  Status status = kv::runTransaction(engine_, [&](kv::Transaction& t) -> Status {
    t.setDurability(durability);
    if (!rid.client.empty()) {
      ASSIGN_OR_RETURN(auto raw, t.get(mutationKey(rid.client, rid.seq)));
      if (raw) {
        MutationRecord rec;
        if (!rec.ParseFromString(*raw))
          return Status(ErrorCode::kCorruption, "mutation record does not parse");
        result = rec.result();
        return Status(static_cast<ErrorCode>(rec.code()), "");
      }
    }
    ASSIGN_OR_RETURN(result, body(t));
    if (!rid.client.empty()) {
      MutationRecord rec;
      rec.set_code(0);
      rec.set_result(result);
      rec.set_time_ns(nowNs());
      t.set(mutationKey(rid.client, rid.seq), rec.SerializeAsString());
    }
    return Status::OK();
  });
  RETURN_ON_ERROR(status);
  return result;
}

}  // namespace cistern::meta
