// ChunkEngine: the chunks of one storage target (one disk or directory).
//
// Layout (docs/chunk_format.md): chunk bytes live in fixed-size slots of
// group files, one set of group files per size class
// (`<path>/data/c<class>/g<group>.dat`); chunk metadata records live in a
// RocksDB at `<path>/meta`. Writes are copy-on-write: the new content of the
// chunk goes to a fresh slot and is synced, then the metadata record is
// replaced in one synced RocksDB write, then the old slot is released. A crash
// therefore shows the old or the new chunk, never a mix; a slot written but
// not committed is free again after reopen, because the slot bitmaps are
// rebuilt from the metadata. Every read verifies the CRC32C of the whole
// chunk and returns kCorruption (CHECKSUM_MISMATCH) and no bytes on mismatch.
// An fsync error puts the engine into a failed, read-only state (never retried).
//
// Threads: all methods are thread-safe; writes to one chunk are serialized by
// a striped lock, writes to different chunks run in parallel and are group-
// committed: one fdatasync per touched group file and one synced metadata
// batch for all writes waiting at that moment.
// Memory: one bit per slot, plus per-call buffers of at most one chunk.
// File descriptors: at most `open_files_max` group files are kept open.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include "common/result.h"
#include "storage/chunk_meta.h"
#include "storage/slot_allocator.h"

namespace rocksdb {
class DB;
}

namespace cistern::storage {

struct ChunkEngineOptions {
  // Target directory; created if missing.
  std::string path;
  // Bytes of one group file (slots per group = max(4, group_bytes / class size)). Default: 256 MiB.
  uint64_t group_bytes = 256ull << 20;
  // Groups per size class; past that writes fail with kNoSpace. Default: 4096.
  uint32_t groups_max = 4096;
  // Group files kept open. Default: 256.
  uint32_t open_files_max = 256;
  // fdatasync data and sync metadata before a write returns. Default: true.
  bool sync = true;
  // Writes fail with kNoSpace while the filesystem has less than this free,
  // so that the metadata store never meets ENOSPC itself (RocksDB does not
  // recover from a failed WAL write). Default: 64 MiB.
  uint64_t reserved_bytes = 64ull << 20;
};

class ChunkEngine {
 public:
  static Result<std::unique_ptr<ChunkEngine>> open(const ChunkEngineOptions& options);
  ~ChunkEngine();

  // Writes `data` at `offset` of chunk `id`, creating it if needed (bytes
  // before `offset` that were never written read as zeros). Returns the new
  // metadata. kInvalidArgument if the chunk would exceed 64 MiB.
  Result<ChunkMeta> write(ChunkId id, uint64_t offset, std::span<const uint8_t> data,
                          uint64_t chain_version);
  // Reads up to out.size() bytes from `offset`; returns the count (short at
  // the end of the chunk, 0 past it). kNotFound for a missing chunk.
  Result<size_t> read(ChunkId id, uint64_t offset, std::span<uint8_t> out);
  Result<std::optional<ChunkMeta>> query(ChunkId id);
  // Removes the chunk; removing a missing chunk succeeds (GC retries).
  Status remove(ChunkId id);
  // Re-verifies every chunk's CRC; returns the ids that fail.
  Result<std::vector<ChunkId>> scrub();

  uint64_t usedSlots(uint32_t size_class) const;
  bool failed() const { return failed_.load(); }

 private:
  ChunkEngine(ChunkEngineOptions options, std::unique_ptr<rocksdb::DB> db);
  Status rebuild();
  struct File {
    int fd;
    ~File();
  };
  Result<std::shared_ptr<File>> groupFile(uint32_t size_class, uint32_t group);
  Status readSlot(const ChunkMeta& m, uint8_t* out);
  Status fail(const std::string& what);
  std::mutex& chunkLock(const ChunkId& id);

  // Group commit: concurrent writes share one fdatasync per group file and
  // one synced RocksDB batch for their metadata.
  struct PendingCommit;
  Status commit(PendingCommit& p);
  void leadCommits(std::unique_lock<std::mutex>& lock);

  ChunkEngineOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  mutable std::mutex alloc_mu_;
  std::vector<SlotAllocator> allocators_;  // one per size class
  std::mutex files_mu_;
  std::unordered_map<uint64_t, std::pair<std::shared_ptr<File>, std::list<uint64_t>::iterator>>
      files_;
  std::list<uint64_t> lru_;  // front: most recent
  std::array<std::mutex, 64> chunk_locks_;
  std::mutex commit_mu_;
  std::condition_variable commit_cv_;
  std::vector<PendingCommit*> commit_queue_;
  bool committing_ = false;
  std::atomic<bool> failed_{false};
};

}  // namespace cistern::storage
