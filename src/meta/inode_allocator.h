// InodeAllocator: hands out unique inode numbers without a hot key.
//
// Each allocator leases a block of `block` numbers from the allocator key in
// one small transaction, then hands them out from memory. Concurrent creates
// therefore touch the shared key once per block, not once per inode; numbers
// of a block left unused when a process stops are simply skipped. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>

#include "common/result.h"
#include "kv/engine.h"

namespace cistern::meta {

class InodeAllocator {
 public:
  // `block`: numbers leased per KV transaction. Default: 1024.
  InodeAllocator(kv::Engine& engine, uint32_t block = 1024) : engine_(engine), block_(block) {}
  Result<uint64_t> next();

 private:
  kv::Engine& engine_;
  uint32_t block_;
  std::mutex mu_;
  uint64_t next_ = 0;
  uint64_t limit_ = 0;  // next_ == limit_: lease a new block
};

}  // namespace cistern::meta
