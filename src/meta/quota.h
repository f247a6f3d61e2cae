// Quotas (docs/quota.md): limits on the bytes and inodes of a directory's
// subtree, kept as atomically added counters per quota directory and
// checked in the transaction that would exceed them.
//
// An inode is counted in every quota directory on the way from its parent
// (Inode.parent: every inode has one; a hard-linked file counts where it
// was created or last renamed to) up to the root. A regular file is
// charged max(size, quota_reserved) bytes: its writers reserve before they
// write past what is charged (MetaStore::reserve), so what is written
// never exceeds a limit; other inodes are charged no bytes.
//
// Functions here only read and write keys inside a caller's transaction.
#pragma once

#include <vector>

#include "common/result.h"
#include "kv/engine.h"
#include "meta.pb.h"

namespace cistern::meta {

// The quota directories from `dir` up to the root, nearest first, with
// their limits. One snapshot read when the store has no quota at all.
struct QuotaDir {
  uint64_t ino = 0;
  Quota quota;
};
Result<std::vector<QuotaDir>> quotaChain(kv::ReadTransaction& t, uint64_t dir);

// Bytes charged for `n`: max(size, quota_reserved) for a regular file, else 0.
int64_t chargedBytes(const Inode& n);

// Adds `bytes` and `inodes` to every quota of `chain`. A positive amount is
// checked first against each limit (kQuotaExceeded naming the directory and
// its use), unless `force` (bytes already written: a close, a reap).
Status charge(kv::Transaction& t, const std::vector<QuotaDir>& chain, int64_t bytes,
              int64_t inodes, bool force);

// charge() of the change in `n`'s charged bytes from `before` to `after`,
// along the chain of after.parent().
Status recharge(kv::Transaction& t, const Inode& before, const Inode& after, bool force);

// The use of quota directory `dir`: bytes, inodes.
Result<std::pair<int64_t, int64_t>> quotaUse(kv::ReadTransaction& t, uint64_t dir,
                                             bool snapshot);

}  // namespace cistern::meta
