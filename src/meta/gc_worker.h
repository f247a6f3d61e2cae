// GcWorker: deletes the chunks of unlinked files.
//
// Unlinking a file's last name (or the last close of an unlinked file) puts
// a GC entry into the queue in the same transaction. The worker takes entries
// in batches, skips files that are still open for writing, asks storage to
// remove every chunk of the file through ChunkRemover, and only then deletes
// the entry, so a crash at any point leaves work to redo, never a leak.
// Removing a chunk that is already gone must succeed (ChunkRemover is
// idempotent).
//
// Truncation queues nothing: the client removes the chunks past the new end
// before the truncate commits (docs/client.md, "Truncate"). Entries that are
// not for a whole file (written by earlier versions, which queued truncated
// chunks) remove from the entry's first chunk or the file's current end,
// whichever is later.
#pragma once

#include <cstdint>

#include "common/result.h"
#include "kv/engine.h"
#include "meta.pb.h"

namespace cistern::meta {

// The storage side of garbage collection.
class ChunkRemover {
 public:
  virtual ~ChunkRemover() = default;
  // Removes every chunk of inode `ino` with index >= `first`, placed by
  // `layout`, including any past the file's recorded length.
  virtual Status removeFrom(uint64_t ino, const Layout& layout, uint64_t first) = 0;
};

// How far a file's bytes reach in storage, for the sessions of a writer
// that died before it recorded its length (MetaStore::reapSessions).
class StoredEnd {
 public:
  virtual ~StoredEnd() = default;
  // The end of the last chunk of inode `ino` with index >= `first`, placed by
  // `layout` (chunk i starts at i * chunk_size), as a file offset; 0 when it
  // has none there.
  virtual Result<uint64_t> storedEnd(uint64_t ino, const Layout& layout, uint64_t first) = 0;
};

class GcWorker {
 public:
  GcWorker(kv::Engine& engine, ChunkRemover& remover) : engine_(engine), remover_(remover) {}
  // Processes up to `max_entries` queue entries; returns how many were completed.
  Result<size_t> runOnce(size_t max_entries = 256);

 private:
  kv::Engine& engine_;
  ChunkRemover& remover_;
};

}  // namespace cistern::meta
