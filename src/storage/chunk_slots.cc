// The chunk engine's slots: holding, releasing and punching them, slots
// kept for new chunks, and removing chunks.
#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include "storage/chunk_engine_internal.h"

namespace cistern::storage {

using namespace engine_detail;

bool ChunkEngine::holdSlot(uint32_t c, SlotAddr a) {
  if (!logsData(c)) return false;
  size_t held;
  {
    std::lock_guard lock(logged_mu_);
    auto it = logged_slots_.find(slotKey(a));
    if (it == logged_slots_.end()) return false;
    logged_slots_.erase(it);
    // The record that freed it is applied by now: meta_applied_ covers it.
    held_.emplace_back(a, meta_applied_.load(std::memory_order_acquire));
    held = held_.size();
  }
  if (held > options_.logged_held_slots_max) {
    if (auto v = checkpointMeta(); !v.ok())
      CLOG_WARN("storage", "target {}: checkpoint for held slots: {}", options_.path,
                v.status().toString());
  }
  return true;
}

std::string ChunkEngine::groupPath(uint32_t c, uint32_t group) const {
  return fmt::format("{}/data/c{}/g{}.dat", abs_path_, c, group);
}

void ChunkEngine::punch(uint32_t c, SlotAddr a) {
  if (auto file = groupFile(c, a.group); file.ok()) {
    if (::fallocate((*file)->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(slotPos(c, a)), static_cast<off_t>(slotStride(c))) != 0) {
      CLOG_DEBUG("storage", "punch hole in {}: {}", options_.path, std::strerror(errno));
    }
  }
}

uint64_t ChunkEngine::keptBytesLocked() const {
  uint64_t bytes = 0;
  for (uint32_t c = 0; c < kClassCount; ++c) bytes += allocators_[c].keptSlots() * slotStride(c);
  return bytes;
}

void ChunkEngine::releaseSlot(uint32_t c, SlotAddr a, bool removed) {
  if (logsData(c)) {
    // Logged bytes reach the group file at checkpoints, in bulk: nothing to
    // keep. Punched before the slot is free again (afterwards a new chunk
    // may be in it).
    if (removed) punch(c, a);
    if (holdSlot(c, a)) return;
    std::lock_guard lock(alloc_mu_);
    allocators_[c].release(a);
    return;
  }
  {
    std::lock_guard lock(alloc_mu_);
    if (keptBytesLocked() + slotStride(c) <= options_.kept_free_bytes) {
      allocators_[c].release(a, /*kept=*/true);
      return;
    }
  }
  punch(c, a);
  std::lock_guard lock(alloc_mu_);
  allocators_[c].release(a);
}

void ChunkEngine::findKeptSlots() {
  std::unique_lock lock(alloc_mu_);
  for (uint32_t c = 0; c < kClassCount; ++c) {
    if (logsData(c)) continue;
    SlotAllocator& alloc = allocators_[c];
    for (uint32_t g = 0; g < alloc.groups(); ++g) {
      int fd = ::open(groupPath(c, g).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      // Data segments: written blocks (holes and, on ext4 and xfs,
      // fallocate's unwritten extents are skipped).
      off_t at = 0;
      for (;;) {
        off_t data = ::lseek(fd, at, SEEK_DATA);
        if (data < 0) break;  // ENXIO: no more data; EINVAL: not supported
        off_t hole = ::lseek(fd, data, SEEK_HOLE);
        if (hole <= data) break;
        uint64_t first = static_cast<uint64_t>(data) / slotStride(c);
        uint64_t last = (static_cast<uint64_t>(hole) - 1) / slotStride(c);
        for (uint64_t s = first; s <= last && s < alloc.slotsPerGroup(); ++s)
          (void)alloc.markKept(SlotAddr{g, static_cast<uint32_t>(s)});  // false if in use
        at = hole;
      }
      ::close(fd);
    }
  }
  lock.unlock();
  trimKept(options_.kept_free_bytes);
}

void ChunkEngine::trimKept(uint64_t budget) {
  // The highest slots of the largest classes go first.
  std::unique_lock lock(alloc_mu_);
  while (keptBytesLocked() > budget) {
    std::optional<std::pair<uint32_t, SlotAddr>> drop;
    for (uint32_t c = kClassCount; c-- > 0 && !drop;) {
      if (auto a = allocators_[c].dropHighestKept()) drop.emplace(c, *a);
    }
    if (!drop) break;
    lock.unlock();
    punch(drop->first, drop->second);
    lock.lock();
  }
}

Status ChunkEngine::remove(ChunkId id, int64_t not_after_ns) {
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  std::lock_guard chunk_lock(chunkLock(id));
  RETURN_ON_ERROR(checkNotAfter(id, not_after_ns));
  ASSIGN_OR_RETURN(auto m, query(id));
  if (!m) return Status::OK();
  PendingCommit pending{nullptr, encodeChunkKey(id), {}, /*erase=*/true};
  RETURN_ON_ERROR(commit(pending).withContext(idText(id)));
  {
    std::lock_guard lock(alloc_mu_);
    data_bytes_[m->size_class] -= m->length;
    --chunks_;
  }
  releaseSlot(m->size_class, m->addr, /*removed=*/true);
  return Status::OK();
}

Result<uint32_t> ChunkEngine::removeFrom(uint64_t inode, uint32_t first, uint32_t limit, bool* more,
                                         int64_t not_after_ns) {
  *more = false;
  ASSIGN_OR_RETURN(auto chunks, list(ChunkId{inode, first}, limit + 1));
  uint32_t removed = 0;
  for (const auto& [id, m] : chunks) {
    if (id.inode != inode) break;
    if (removed == limit) {
      *more = true;
      break;
    }
    RETURN_ON_ERROR(remove(id, not_after_ns));
    ++removed;
  }
  return removed;
}

}  // namespace cistern::storage
