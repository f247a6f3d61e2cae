// The meta GC's and session reaper's way to storage (meta::ChunkRemover,
// meta::StoredEnd) over the storage RPC: client::RemoteChunkRemover, which
// knows nothing of meta, behind meta's interfaces. Wiring the two is the
// composition layer's job, so that neither library depends on the other.
#pragma once

#include "client/remote_chunk_remover.h"
#include "meta/gc_worker.h"

namespace cistern::server {

class GcRemover final : public meta::ChunkRemover, public meta::StoredEnd {
 public:
  explicit GcRemover(client::RemoteChunkRemover remover) : remover_(std::move(remover)) {}
  Status removeFrom(uint64_t ino, const meta::Layout& layout, uint64_t first) override {
    return remover_.removeFrom(ino, layout, first);
  }
  Result<uint64_t> storedEnd(uint64_t ino, const meta::Layout& layout, uint64_t first) override {
    return remover_.storedEnd(ino, layout, first);
  }

 private:
  client::RemoteChunkRemover remover_;
};

}  // namespace cistern::server
