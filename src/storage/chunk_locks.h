// ChunkLocks: one change in flight per chunk on a chain's replica, held
// across the forward to the successor (docs/chain_protocol.md), by
// coroutines (the I/O threads wait without blocking) or by threads (the
// resync). Waiters take the chunk in arrival order. Also the replica's
// uncommitted ("dirty") chunks: those changed here and not yet acknowledged
// by the rest of the chain, which reads must not return.
//
// Memory: one entry per chunk locked or dirty now. Thread-safe.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/thread_pool.hpp>

#include <deque>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "storage/chunk_meta.h"

namespace cistern::storage {

struct ChunkIdHash {
  size_t operator()(const ChunkId& id) const {
    return std::hash<uint64_t>()(id.inode * 0x9e3779b97f4a7c15ull ^ id.index);
  }
};

class ChunkLocks {
 public:
  // `pool` runs the wake-up of a waiter whose chunk was released while it
  // was getting in line.
  explicit ChunkLocks(asio::thread_pool& pool) : pool_(pool) {}

  class Guard {
   public:
    Guard(ChunkLocks* locks, ChunkId id) : locks_(locks), id_(id) {}
    Guard(Guard&& o) noexcept : locks_(std::exchange(o.locks_, nullptr)), id_(o.id_) {}
    Guard& operator=(Guard&&) = delete;
    ~Guard() {
      if (locks_) locks_->unlock(id_);
    }

   private:
    ChunkLocks* locks_;
    ChunkId id_;
  };
  asio::awaitable<Guard> lock(ChunkId id);
  Guard lockBlocking(ChunkId id);

  // A chunk changed here under `chain` and not yet acknowledged by the rest
  // of the chain.
  void markDirty(ChunkId id, uint32_t chain);
  void clearDirty(ChunkId id);
  bool dirty(ChunkId id) const;
  // The dirty chunks now, with their chains.
  std::vector<std::pair<ChunkId, uint32_t>> dirtyChunks() const;

 private:
  // Takes the chunk now (true) or queues `wake` to be called when it is
  // handed over.
  bool tryLockOrWait(ChunkId id, std::function<void()> wake);
  void unlock(ChunkId id);

  asio::thread_pool& pool_;
  mutable std::mutex mu_;
  // Held chunks, with the waiters to hand them to in order.
  std::unordered_map<ChunkId, std::deque<std::function<void()>>, ChunkIdHash> held_;
  std::unordered_map<ChunkId, uint32_t, ChunkIdHash> dirty_;
};

}  // namespace cistern::storage
