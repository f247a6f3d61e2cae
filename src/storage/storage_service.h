// StorageService: serves one ChunkEngine over RPC (cistern.storage.StorageService).
//
// Chunk I/O blocks (pread/pwrite, fdatasync), so handlers run on a pool of
// `blocking_threads` threads. Every request is admitted against the target's
// queued-bytes budget before it is queued there: past `queued_bytes_max`
// (foreground) or `background_share` of it (background QoS), the request is
// refused with kTargetBusy (EAGAIN) and the client backs off and retries —
// backpressure instead of unbounded queues. A batch read returns at most
// `batch_read_bytes_max` bytes (kPayloadTooLarge beyond), into a pooled buffer
// or, for a client on this host that attached shared memory, straight into it.
// A small batch read (at most `loop_read_bytes_max` in all, in at most 8
// ranges of at most ChunkEngine::kAsyncReadBytesMax) whose chunk records are
// in memory is served on the I/O thread that received it instead: its disk
// reads go through that thread's io_uring (storage/loop_ring.h) and the
// thread serves other requests meanwhile, sparing two thread hand-offs per
// read; at most `loop_reads_max` such ranges are in flight per I/O thread.
// Today one service serves one target; chains come with mgmtd.
#pragma once

#include <asio/thread_pool.hpp>
#include <atomic>

#include "net/buffer_pool.h"
#include "net/rpc_server.h"
#include "storage/chunk_engine.h"
#include "storage/shm_registry.h"
#include "storage/storage_service_options.h"

namespace cistern::storage {

class BatchReadReq;
class BatchReadResp;
class TruncateReq;
class SyncReq;
class TruncateResp;
class WriteReq;
class WriteResp;

class StorageService {
 public:
  // Registers the methods on `server` (before server.start()).
  StorageService(ChunkEngine& engine, net::RpcServer& server, StorageServiceOptions options = {});
  ~StorageService();  // stop the RpcServer first

  uint64_t queuedBytes() const { return queued_.load(); }

 private:
  class Admission;
  // Reserves `bytes` of the budget for a request of QoS class `qos`.
  Status admit(uint64_t bytes, int qos);
  void done(uint64_t bytes);
  // Serves a small batch read on the calling I/O thread (above) into `dest`
  // (`out` when not null, else shared memory). False when it cannot; then
  // nothing is sent and the caller reads everything on the pool.
  asio::awaitable<bool> readOnLoop(net::CallContext& ctx, const BatchReadReq& req, uint8_t* dest,
                                   std::shared_ptr<net::PooledBuffer> out, BatchReadResp& resp);
  // The bytes a write carries: its payload, or the range of a client's
  // shared memory it names (`*shm` then holds that mapping).
  Result<std::span<const uint8_t>> writeData(const WriteReq& req, std::span<const uint8_t> payload,
                                             std::shared_ptr<const ShmMapping>* shm);
  // The engine's part of a write, a truncate and a batch read (they block).
  // `copy`: `data` may change meanwhile (the engine checksums a copy).
  Status writeChunk(const WriteReq& req, std::span<const uint8_t> data, bool copy, WriteResp& resp);
  Status truncateChunk(const TruncateReq& req, TruncateResp& resp);
  Status syncTarget(const SyncReq& req);
  // Where a batch read's bytes go in the client's shared memory it names
  // (`*shm` then holds that mapping); null when it names none.
  Result<uint8_t*> readShm(const BatchReadReq& req, uint64_t total,
                           std::shared_ptr<const ShmMapping>* shm);
  // The bytes a batch read asks for, if within batch_read_bytes_max.
  Result<uint64_t> readBytes(const BatchReadReq& req) const;
  // Reads the ranges back to back into `dest`; returns the bytes read.
  size_t readRanges(const BatchReadReq& req, uint8_t* dest, BatchReadResp& resp);
  // The mapping attached under `handle` if it holds `bytes` at `offset`.
  Result<std::shared_ptr<const ShmMapping>> shmRange(uint64_t handle, uint64_t offset,
                                                     uint64_t bytes);

  ChunkEngine& engine_;
  StorageServiceOptions options_;
  asio::thread_pool pool_;
  // Syncs, one at a time: a sync may wait on a device flush for as long as
  // the writes before it took, and must not hold the threads reads and
  // writes need meanwhile. Those queued behind one find little left to do.
  asio::thread_pool sync_pool_{1};
  net::BufferPool buffers_;
  ShmRegistry shm_;
  std::atomic<uint64_t> queued_{0};
};

}  // namespace cistern::storage
