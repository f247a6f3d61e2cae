// StorageService: serves one ChunkEngine over RPC (cistern.storage.StorageService).
//
// Chunk I/O blocks (pread/pwrite, fdatasync), so handlers run on a pool of
// `blocking_threads` threads; the pool and the RPC server's per-connection
// in-flight bound together bound the bytes a server holds. A batch read
// returns at most `batch_read_bytes_max` bytes (kPayloadTooLarge beyond).
// Targets, chains and QoS classes come with mgmtd; today one engine is one target.
#pragma once

#include <asio/thread_pool.hpp>

#include "net/rpc_server.h"
#include "storage/chunk_engine.h"

namespace cistern::storage {

class StorageService {
 public:
  // Registers the methods on `server` (before server.start()).
  StorageService(ChunkEngine& engine, net::RpcServer& server, uint32_t blocking_threads = 8,
                 uint64_t batch_read_bytes_max = 64ull << 20);
  ~StorageService();  // stop the RpcServer first

 private:
  ChunkEngine& engine_;
  asio::thread_pool pool_;
  uint64_t batch_read_bytes_max_;
};

}  // namespace cistern::storage
