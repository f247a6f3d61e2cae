// RemoteChunkRemover: the meta GC's ChunkRemover over the storage RPC.
//
// Chunk i of a file lives on chain layout.chains(i % stripe_width); `route`
// maps a chain id to the storage endpoint serving it (from mgmtd's routing
// table; one target per chain while replication is 1). Chunks go out in
// Remove calls of at most `batch` chunks, with the background QoS class so
// that GC never crowds out application I/O. A target that is busy
// (kTargetBusy) is retried with exponential backoff up to `busy_retries`
// times; any other failure is returned and the GC entry stays queued, so
// nothing is lost. Removing a chunk that is already gone succeeds.
// Thread-safe if `route` is.
#pragma once

#include <functional>

#include "meta/gc_worker.h"
#include "net/rpc_client.h"

namespace cistern::storage {

class RemoteChunkRemover : public meta::ChunkRemover {
 public:
  using Route = std::function<Result<net::Endpoint>(uint32_t chain)>;
  RemoteChunkRemover(net::RpcClient& client, Route route, uint32_t batch = 1024,
                     uint32_t busy_retries = 8)
      : client_(client), route_(std::move(route)), batch_(batch), busy_retries_(busy_retries) {}

  Status removeChunks(uint64_t ino, const meta::Layout& layout, uint64_t first,
                      uint64_t count) override;

 private:
  net::RpcClient& client_;
  Route route_;
  uint32_t batch_;
  uint32_t busy_retries_;
};

}  // namespace cistern::storage
