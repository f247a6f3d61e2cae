// GcWorker: deletes the chunks of unlinked and truncated files.
//
// Metadata operations put (inode, first chunk) entries into the GC queue in
// the same transaction that unlinks or truncates. The worker takes entries in
// batches, skips files that are still open for writing, asks storage to
// remove the chunks through ChunkRemover, and only then deletes the entry, so
// a crash at any point leaves work to redo, never a leak. Removing a chunk
// that is already gone must succeed (ChunkRemover is idempotent).
//
// Known gap (until storage lands, issue 4/5): a file truncated and then grown
// again before the worker runs keeps its old chunks past the truncation point
// in the regrown range; the worker deletes only chunks past the current end.
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
  // Removes chunks [first, first + count) of inode `ino`, placed by `layout`.
  virtual Status removeChunks(uint64_t ino, const Layout& layout, uint64_t first,
                              uint64_t count) = 0;
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
