#include "meta/inode_allocator.h"

#include <charconv>

#include "meta/schema.h"

namespace cistern::meta {

Result<uint64_t> InodeAllocator::next() {
  std::lock_guard lock(mu_);
  if (next_ == limit_) {
    uint64_t start = 0;
    Status s = kv::runTransaction(engine_, [&](kv::Transaction& t) -> Status {
      ASSIGN_OR_RETURN(auto raw, t.get(allocatorKey()));
      start = kFirstAllocatedIno;
      if (raw) {
        auto [p, ec] = std::from_chars(raw->data(), raw->data() + raw->size(), start);
        if (ec != std::errc() || p != raw->data() + raw->size() || start < kFirstAllocatedIno) {
          return Status(ErrorCode::kCorruption, "inode allocator record does not parse");
        }
      }
      t.set(allocatorKey(), std::to_string(start + block_));
      return Status::OK();
    });
    RETURN_ON_ERROR(s);
    next_ = start;
    limit_ = start + block_;
  }
  return next_++;
}

}  // namespace cistern::meta
