#include "meta/quota.h"

#include <fmt/format.h>

#include "meta/schema.h"

namespace cistern::meta {
namespace {

// More than any real tree is deep: a parent loop (corruption) ends here.
constexpr int kDepthMax = 4096;

}  // namespace

Result<std::vector<QuotaDir>> quotaChain(kv::ReadTransaction& t, uint64_t dir) {
  std::vector<QuotaDir> out;
  ASSIGN_OR_RETURN(auto count, t.get(quotaCountKey(), /*snapshot=*/true));
  if (!count || kv::decodeCounter(*count) <= 0 || dir == 0) return out;
  uint64_t at = dir;
  for (int depth = 0; depth < kDepthMax; ++depth) {
    ASSIGN_OR_RETURN(auto raw, t.get(quotaKey(at), /*snapshot=*/true));
    if (raw) {
      QuotaDir q;
      q.ino = at;
      if (!q.quota.ParseFromString(*raw))
        return Status(ErrorCode::kCorruption, fmt::format("quota of {} does not parse", at));
      out.push_back(std::move(q));
    }
    if (at == kRootIno) return out;
    ASSIGN_OR_RETURN(auto inode_raw, t.get(inodeKey(at), /*snapshot=*/true));
    Inode n;
    if (!inode_raw || !n.ParseFromString(*inode_raw) || n.parent() == 0) return out;
    at = n.parent();
  }
  return Status(ErrorCode::kCorruption,
                fmt::format("directory {} does not reach the root within {} parents", dir,
                            kDepthMax));
}

int64_t chargedBytes(const Inode& n) {
  if (n.type() != REGULAR) return 0;
  return static_cast<int64_t>(std::max(n.size(), n.quota_reserved()));
}

Result<std::pair<int64_t, int64_t>> quotaUse(kv::ReadTransaction& t, uint64_t dir,
                                             bool snapshot) {
  ASSIGN_OR_RETURN(auto b, t.get(quotaUseKey(dir, true), snapshot));
  ASSIGN_OR_RETURN(auto i, t.get(quotaUseKey(dir, false), snapshot));
  return std::pair<int64_t, int64_t>(b ? kv::decodeCounter(*b) : 0,
                                     i ? kv::decodeCounter(*i) : 0);
}

Status charge(kv::Transaction& t, const std::vector<QuotaDir>& chain, int64_t bytes,
              int64_t inodes, bool force) {
  if (bytes == 0 && inodes == 0) return Status::OK();
  for (const QuotaDir& q : chain) {
    if (!force && (bytes > 0 || inodes > 0)) {
      // A read of the counters: a concurrent charge of the same quota that
      // commits first makes this transaction retry, so two cannot both fit
      // into the last bytes.
      ASSIGN_OR_RETURN(auto use, quotaUse(t, q.ino, /*snapshot=*/false));
      const auto& [used_bytes, used_inodes] = use;
      if (bytes > 0 && q.quota.bytes_max() > 0 &&
          used_bytes + bytes > static_cast<int64_t>(q.quota.bytes_max())) {
        return Status(ErrorCode::kQuotaExceeded,
                      fmt::format("directory {} holds {} of its {} bytes; {} more do not fit",
                                  q.ino, used_bytes, q.quota.bytes_max(), bytes));
      }
      if (inodes > 0 && q.quota.inodes_max() > 0 &&
          used_inodes + inodes > static_cast<int64_t>(q.quota.inodes_max())) {
        return Status(ErrorCode::kQuotaExceeded,
                      fmt::format("directory {} holds {} of its {} inodes", q.ino, used_inodes,
                                  q.quota.inodes_max()));
      }
    }
    if (bytes != 0) t.atomicAdd(quotaUseKey(q.ino, true), bytes);
    if (inodes != 0) t.atomicAdd(quotaUseKey(q.ino, false), inodes);
  }
  return Status::OK();
}

Status recharge(kv::Transaction& t, const Inode& before, const Inode& after, bool force) {
  const int64_t delta = chargedBytes(after) - chargedBytes(before);
  if (delta == 0) return Status::OK();
  ASSIGN_OR_RETURN(auto chain, quotaChain(t, after.parent()));
  return charge(t, chain, delta, 0, force);
}

}  // namespace cistern::meta
