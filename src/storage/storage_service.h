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
// One service serves one target. On one machine (`cistern up`) each chain
// is one target and requests are served as above. With a ChainTable (a
// storage server of a cluster, `cistern serve --role storage`) the target
// is a replica of several chains (docs/chain_protocol.md, "Storage
// servers"): clients' changes go to a chain's head, which applies them and
// forwards them down the chain (Forward) before it answers; a replica
// reads only chunks without an uncommitted version, only while its serving
// lease holds; same-process calls, reads on the I/O threads and
// short-circuit reads (Locate) are off.
#pragma once

#include <asio/thread_pool.hpp>
#include <atomic>
#include <deque>
#include <functional>
#include <set>

#include "common/pacer.h"
#include "net/buffer_pool.h"
#include "net/rpc_server.h"
#include "storage/chain_table.h"
#include "storage/chunk_engine.h"
#include "storage/chunk_locks.h"
#include "storage/shm_registry.h"
#include "storage/storage_service_options.h"

namespace cistern::net {
class RpcClient;
}

namespace cistern::storage {

class BatchReadReq;
class ChunkInfo;
class ForwardReq;
class ForwardResp;
class BatchReadResp;
class TruncateReq;
class SyncReq;
class TruncateResp;
class WriteReq;
class WriteResp;

class StorageService {
 public:
  // Registers the methods on `server` (before server.start()). `chains`
  // (with `peers`, the client that forwards to successors): a replica of a
  // cluster's chains.
  StorageService(ChunkEngine& engine, net::RpcServer& server, StorageServiceOptions options = {},
                 ChainTable* chains = nullptr, net::RpcClient* peers = nullptr);
  ~StorageService();  // stop the RpcServer first

  uint64_t queuedBytes() const { return queued_.load(); }

  // Chains whose resync into this target has finished (a predecessor's
  // SYNC_DONE), as (chain, target) for the next heartbeat; taken once.
  std::vector<std::pair<uint32_t, uint32_t>> takeSynced();
  // Called when a resync into this target finished (to report it at once).
  void onSynced(std::function<void()> f) { on_synced_ = std::move(f); }
  // Called after mgmtd pushed a routing table (PushRouting).
  void onRouting(std::function<void()> f) { on_routing_ = std::move(f); }
  // Makes `p.successor` (SYNCING) hold what this target holds of chain
  // `p.chain` — every chunk it lacks or holds at another version, none this
  // target lacks — then tells it so (SYNC_DONE). Blocks; `stop` ends it
  // early (kCancelled). Writes to the chain go on meanwhile: each chunk is
  // copied under its lock, and writes reach the successor too.
  Status resync(const ChainPosition& p, const std::atomic<bool>* stop = nullptr);
  // Repairs this target's copy of `id` in `chain` (it failed verification:
  // a read or a scrub found it) with a SERVING peer's copy of the same
  // versions, the tail's first (docs/chain_protocol.md, "Repair"). Blocks.
  Status repair(ChunkId id, uint32_t chain);
  // repair() on a thread of its own; at most kRepairsQueued at once (more
  // are dropped: the next read or scrub finds them again).
  void repairLater(ChunkId id, uint32_t chain);
  // Pushes every dirty chunk of a chain this target heads down the chain
  // (REPLACE of its copy), so that a change whose client gave up does not
  // leave the chunk unreadable. Blocks; run it every so often.
  Status settleDirty();

 private:
  // Holds `bytes` of the target's budget while a request runs.
  class Admission {
   public:
    Admission(StorageService& s, uint64_t bytes) : s_(s), bytes_(bytes) {}
    ~Admission() {
      if (held_) s_.done(bytes_);
    }
    Status admit(int qos) {
      RETURN_ON_ERROR(s_.admit(bytes_, qos));
      held_ = true;
      return Status::OK();
    }

   private:
    StorageService& s_;
    uint64_t bytes_;
    bool held_ = false;
  };
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

  // Chain replication (storage_chains.cc).
  struct Change {
    int op = 0;  // ForwardReq::Op
    uint64_t offset = 0;
    uint64_t length = 0;  // TRUNCATE
    std::span<const uint8_t> data;
    bool sync = false;  // a resync's copy: written unsynced (SYNC_DONE syncs)
  };
  void registerChainHandlers(net::RpcServer& server);
  // Write, Truncate, Remove and the same-process calls of one machine.
  void registerOneMachineHandlers(net::RpcServer& server);
  // The rest, both ways.
  void registerCommonHandlers(net::RpcServer& server);
  // A client's change at the head: applied here, forwarded, then answered.
  asio::awaitable<Status> headChange(uint32_t chain, uint64_t chain_version, ChunkId id,
                                     const Change& c, std::pair<uint64_t, uint64_t> update,
                                     int64_t not_after_ns, ChunkInfo* info);
  bool committedHere(std::pair<uint64_t, uint64_t> update);
  // kStaleChainVersion unless this target is still at `chain_version` of
  // `chain` (checked once a change is applied and passed on).
  Status stillAt(uint32_t chain, uint64_t chain_version) const;
  void remember(std::pair<uint64_t, uint64_t> update);
  asio::awaitable<Status> onForward(const ForwardReq& f, std::span<const uint8_t> payload,
                                    ForwardResp& resp);
  // Sends `f` to the successor.
  asio::awaitable<Status> forwardOnce(const ChainPosition& pos, ForwardReq f,
                                      std::span<const uint8_t> payload);
  // Sends the successor this target's whole copy of `id` (REPLACE), or its
  // removal if there is none.
  asio::awaitable<Status> replaceDownstream(const ChainPosition& pos, ChunkId id, bool sync);
  // A change applied here (`apply`, on the pool) and forwarded as `f` at
  // once; a successor holding another version gets this copy after.
  struct Outcome {
    Status applied;
    std::optional<ChunkMeta> meta;
    Status forwarded;
  };
  asio::awaitable<Outcome> applyAndForward(const ChainPosition& pos, const ForwardReq& f,
                                           std::span<const uint8_t> payload,
                                           std::function<Result<std::optional<ChunkMeta>>()> apply);
  // Pushes this target's copy of a dirty chunk down the chain (REPLACE or
  // REMOVE); clean after.
  asio::awaitable<Status> settle(ChunkId id, const ChainPosition& pos);
  // The chunk's record and, if `with_data`, its bytes (into a pooled buffer).
  struct Copy {
    std::optional<ChunkMeta> meta;
    std::optional<net::PooledBuffer> bytes;
  };
  Result<Copy> copyOf(ChunkId id, bool with_data);
  Result<std::optional<ChunkMeta>> applyLocal(ChunkId id, const Change& c, uint32_t chain,
                                              uint64_t chain_version, int64_t not_after_ns,
                                              uint64_t chunk_version);
  // The Forward that gives a successor this target's copy of `id`: its
  // REPLACE, or a REMOVE when there is none (or, with `only_chain`, it is
  // of another chain); `*payload` the copy's bytes.
  ForwardReq copyRequest(ChunkId id, const Copy& copy, uint32_t only_chain,
                         std::span<const uint8_t>* payload);
  // Sends `p.successor` this target's copy of `id` (blocking; the caller
  // holds the chunk); `sync`: as part of a resync.
  Status sendCopyBlocking(const ChainPosition& p, ChunkId id, bool sync);
  // A successor's REPLACE or REMOVE during a resync (blocking).
  Status syncChunk(const ChainPosition& p, ChunkId id);

  ChunkEngine& engine_;
  StorageServiceOptions options_;
  ChainTable* chains_ = nullptr;
  net::RpcClient* peers_ = nullptr;
  asio::thread_pool pool_;
  // Syncs, one at a time: a sync may wait on a device flush for as long as
  // the writes before it took, and must not hold the threads reads and
  // writes need meanwhile. Those queued behind one find little left to do.
  asio::thread_pool sync_pool_{1};
  net::BufferPool buffers_;
  ShmRegistry shm_;
  std::atomic<uint64_t> queued_{0};
  std::unique_ptr<ChunkLocks> locks_;  // with chains_
  // Updates this head committed, for clients' retries: (client, seq) ->
  // nothing; the oldest forgotten past kRememberedUpdates.
  static constexpr size_t kRememberedUpdates = 4096;
  std::mutex updates_mu_;
  std::set<std::pair<uint64_t, uint64_t>> updates_;
  std::deque<std::pair<uint64_t, uint64_t>> update_order_;
  std::mutex synced_mu_;
  std::vector<std::pair<uint32_t, uint32_t>> synced_;
  std::function<void()> on_synced_;
  std::function<void()> on_routing_;
  Pacer recovery_pacer_{options_.recovery_bytes_per_second};  // resync copies
  static constexpr size_t kRepairsQueued = 64;
  std::mutex repair_mu_;
  std::set<ChunkId> repairing_;  // queued or running
  // Last: destroyed (joined) first, before anything a repair uses.
  asio::thread_pool repair_pool_{1};
};

}  // namespace cistern::storage
