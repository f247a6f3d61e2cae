// Per-chunk locks for coroutines and threads (chunk_locks.h).
#include "storage/chunk_locks.h"

#include <asio/post.hpp>

#include <future>
#include <memory>

#include "net/blocking.h"

namespace cistern::storage {

bool ChunkLocks::tryLockOrWait(ChunkId id, std::function<void()> wake) {
  std::lock_guard lock(mu_);
  auto [it, fresh] = held_.try_emplace(id);
  if (fresh) return true;
  if (wake) it->second.push_back(std::move(wake));
  return false;
}

void ChunkLocks::unlock(ChunkId id) {
  std::function<void()> next;
  {
    std::lock_guard lock(mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return;
    if (it->second.empty()) {
      held_.erase(it);
      return;
    }
    next = std::move(it->second.front());  // handed over: the entry stays
    it->second.pop_front();
  }
  next();
}

asio::awaitable<ChunkLocks::Guard> ChunkLocks::lock(ChunkId id) {
  if (tryLockOrWait(id, nullptr)) co_return Guard(this, id);
  co_await net::suspendUntilResumed([&](auto resume) {
    auto r = std::make_shared<decltype(resume)>(std::move(resume));
    // Queued behind the holder, or taken if it let go meanwhile: then
    // resumed from the pool, never from inside this initiation.
    if (tryLockOrWait(id, [r] { (*r)(); })) asio::post(pool_, [r] { (*r)(); });
  });
  co_return Guard(this, id);
}

ChunkLocks::Guard ChunkLocks::lockBlocking(ChunkId id) {
  auto handed = std::make_shared<std::promise<void>>();
  auto got = handed->get_future();
  if (!tryLockOrWait(id, [handed] { handed->set_value(); })) got.wait();
  return Guard(this, id);
}

void ChunkLocks::markDirty(ChunkId id, uint32_t chain) {
  std::lock_guard lock(mu_);
  dirty_[id] = chain;
}

std::vector<std::pair<ChunkId, uint32_t>> ChunkLocks::dirtyChunks() const {
  std::lock_guard lock(mu_);
  return {dirty_.begin(), dirty_.end()};
}

void ChunkLocks::clearDirty(ChunkId id) {
  std::lock_guard lock(mu_);
  dirty_.erase(id);
}

bool ChunkLocks::dirty(ChunkId id) const {
  std::lock_guard lock(mu_);
  return dirty_.count(id) > 0;
}

}  // namespace cistern::storage
