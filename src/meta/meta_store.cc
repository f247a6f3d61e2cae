#include "meta/meta_store.h"

#include <algorithm>

#include "meta/ops/inline.h"
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

Result<StatFs> MetaStore::statfs() {
  StatFs out;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(int64_t n, inodeCount(t, /*snapshot=*/true));
    out.inodes_used = n > 0 ? static_cast<uint64_t>(n) : 0;
    return Status::OK();
  }));
  if (capacity_) {
    ASSIGN_OR_RETURN(auto cap, capacity_());
    out.bytes_total = cap.first;
    out.bytes_free = cap.second;
    out.capacity_known = true;
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
