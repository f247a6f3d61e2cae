#include "storage/storage_service.h"

#include <fmt/format.h>

#include <asio/this_coro.hpp>

#include "common/config.h"
#include "common/fault.h"
#include "common/host.h"
#include "common/metrics.h"
#include "net/blocking.h"
#include "storage.pb.h"
#include "storage/loop_ring.h"
#include "storage/storage_service_util.h"

namespace cistern::storage {
namespace {

// Ranges of one Locate: a client asks for one read-ahead window's chunks.
constexpr int kLocateRangesMax = 64;

void fillLocated(std::vector<Result<ChunkEngine::Location>> located, LocateResp& resp) {
  for (auto& loc : located) {
    auto* out = resp.add_ranges();
    out->set_code(static_cast<uint32_t>(loc.code()));
    if (!loc.ok()) continue;
    out->set_path(std::move(loc->path));
    out->set_dev(loc->dev);
    out->set_ino(loc->ino);
    out->set_slot_offset(loc->slot_offset);
    out->set_chunk_length(loc->length);
    out->mutable_crcs()->Add(loc->crcs.begin(), loc->crcs.end());
  }
}

metrics::Gauge& queuedGauge() {
  static auto& g = metrics::Registry::global().gauge(
      "storage_queued_bytes", {}, "Bytes of admitted storage requests not finished yet");
  return g;
}

}  // namespace

void StorageServiceOptions::bind(ConfigBinder& b, const std::string& p) {
  b.bind(p + ".blocking_threads", &blocking_threads,
         "threads that serve chunk reads and writes of a target (at least 1)");
  b.bind(p + ".queued_bytes_max", &queued_bytes_max,
         "bytes of requests admitted to a target at once; more get EAGAIN (backpressure)");
  b.bind(p + ".background_share", &background_share,
         "share of queued_bytes_max that background-QoS requests may use, in (0, 1]");
  b.bind(p + ".recovery_bytes_per_second", &recovery_bytes_per_second,
         "bytes a second resyncs copy from this target to others, all chains together "
         "(0: no limit): foreground I/O keeps the rest of the disk and link");
  b.bind(p + ".short_circuit_reads", &short_circuit_reads,
         "clients on this host that can open the target's files may read chunks from them "
         "themselves (verified against the CRCs the server gives)");
}

Status StorageServiceOptions::validate() const {
  if (blocking_threads == 0)
    return Status(ErrorCode::kInvalidArgument, "storage blocking_threads must be at least 1");
  if (!(background_share > 0 && background_share <= 1)) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("storage background_share {} is not in (0, 1]", background_share));
  }
  return Status::OK();
}

Status StorageService::admit(uint64_t bytes, int qos) {
  static auto& refused = metrics::Registry::global().counter(
      "storage_requests_refused_total", {}, "Requests refused because the target was busy");
  uint64_t limit = options_.queued_bytes_max;
  if (qos == QOS_BACKGROUND) limit = static_cast<uint64_t>(limit * options_.background_share);
  uint64_t cur = queued_.load();
  do {
    // One request larger than the budget still runs when nothing else is queued.
    if (cur > 0 && cur + bytes > limit) {
      refused.inc();
      return Status(ErrorCode::kTargetBusy,
                    fmt::format("target {} has {} bytes queued (limit {}); retry later",
                                engine_.path(), cur, limit));
    }
  } while (!queued_.compare_exchange_weak(cur, cur + bytes));
  queuedGauge().add(static_cast<int64_t>(bytes));
  return Status::OK();
}

void StorageService::done(uint64_t bytes) {
  queued_.fetch_sub(bytes);
  queuedGauge().add(-static_cast<int64_t>(bytes));
}

StorageService::StorageService(ChunkEngine& engine, net::RpcServer& server,
                               StorageServiceOptions options, ChainTable* chains,
                               net::RpcClient* peers)
    : engine_(engine),
      options_(options),
      chains_(chains),
      peers_(peers),
      pool_(options.blocking_threads),
      buffers_(options.batch_read_bytes_max),
      shm_(options.shm_attached_max, options.shm_bytes_max) {
  if (chains_) {
    locks_ = std::make_unique<ChunkLocks>(pool_);
    options_.short_circuit_reads = false;
    options_.loop_read_bytes_max = 0;
  }
  registerCommonHandlers(server);  // first: the same-process calls need theirs
  if (chains_) {
    registerChainHandlers(server);
  } else {
    registerOneMachineHandlers(server);
  }
}

void StorageService::registerOneMachineHandlers(net::RpcServer& server) {
  server.handle<WriteReq, WriteResp>(
      method("Write"),
      [this](net::CallContext& ctx, const WriteReq& req,
             WriteResp& resp) -> asio::awaitable<Status> {
        std::shared_ptr<const ShmMapping> shm;
        CO_ASSIGN_OR_RETURN(auto data, writeData(req, ctx.requestPayload(), &shm));
        Admission admitted(*this, data.size());
        if (Status a = admitted.admit(req.qos()); !a.ok()) co_return a;
        // Bytes in a client's shared memory are copied before they are
        // checksummed: the client changing them meanwhile cannot make the CRC
        // disagree. A payload is this request's own (aligned) buffer.
        co_return co_await net::runBlocking(
            pool_, [&] { return writeChunk(req, data, /*copy=*/shm != nullptr, resp); });
      });
  // From a client in this process (net/local_call.h), on its thread: the
  // payload is the caller's buffer, which is not ours to keep stable.
  server.handleLocal(method("Write"),
                     [this](const google::protobuf::Message& m, google::protobuf::Message& r,
                            net::LocalPayloads& p) -> Status {
                       const auto& req = static_cast<const WriteReq&>(m);
                       std::shared_ptr<const ShmMapping> shm;
                       ASSIGN_OR_RETURN(auto data, writeData(req, p.request, &shm));
                       Admission admitted(*this, data.size());
                       RETURN_ON_ERROR(admitted.admit(req.qos()));
                       return writeChunk(req, data, /*copy=*/true, static_cast<WriteResp&>(r));
                     });
  // From a client in this process: straight into the caller's buffer (or
  // the shared memory it names).
  server.handleLocal(
      method("BatchRead"),
      [this](const google::protobuf::Message& m, google::protobuf::Message& r,
             net::LocalPayloads& p) -> Status {
        const auto& req = static_cast<const BatchReadReq&>(m);
        ASSIGN_OR_RETURN(uint64_t total, readBytes(req));
        Admission admitted(*this, total);
        RETURN_ON_ERROR(admitted.admit(req.qos()));
        std::shared_ptr<const ShmMapping> shm;
        ASSIGN_OR_RETURN(auto dest, readShm(req, total, &shm));
        if (!dest) {
          if (total > p.response.size()) {
            return Status(ErrorCode::kPayloadTooLarge,
                          fmt::format("batch read of {} bytes exceeds the caller's {}-byte buffer",
                                      total, p.response.size()));
          }
          dest = p.response.data();
        }
        size_t at = readRanges(req, dest, static_cast<BatchReadResp&>(r));
        if (!shm) p.response_len = at;
        return Status::OK();
      });
  server.handle<RemoveReq, RemoveResp>(
      method("Remove"),
      [this](net::CallContext&, const RemoveReq& req, RemoveResp& resp) -> asio::awaitable<Status> {
        Admission admitted(*this, kRequestBytes);
        if (Status a = admitted.admit(req.qos()); !a.ok()) co_return a;
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          RETURN_ON_ERROR(CISTERN_FAULT("storage.remove.queued"));
          const auto not_after = static_cast<int64_t>(req.not_after_unix_ns());
          for (const auto& c : req.chunks())
            resp.add_codes(static_cast<uint32_t>(engine_.remove(idOf(c), not_after).code()));
          if (req.has_from()) {
            uint32_t limit = req.limit() == 0 ? 1000 : std::min<uint32_t>(req.limit(), 10000);
            bool more = false;
            ASSIGN_OR_RETURN(uint32_t removed,
                             engine_.removeFrom(req.from().inode(), req.from().index(), limit,
                                                &more, not_after));
            resp.set_removed(removed);
            resp.set_more(more);
          }
          return Status::OK();
        });
      });
  server.handle<TruncateReq, TruncateResp>(method("Truncate"),
                                           [this](net::CallContext&, const TruncateReq& req,
                                                  TruncateResp& resp) -> asio::awaitable<Status> {
                                             Admission admitted(*this, kRequestBytes);
                                             if (Status a = admitted.admit(req.qos()); !a.ok())
                                               co_return a;
                                             co_return co_await net::runBlocking(
                                                 pool_, [&] { return truncateChunk(req, resp); });
                                           });
  server.handleLocal(method("Truncate"),
                     [this](const google::protobuf::Message& m, google::protobuf::Message& r,
                            net::LocalPayloads&) -> Status {
                       const auto& req = static_cast<const TruncateReq&>(m);
                       Admission admitted(*this, kRequestBytes);
                       RETURN_ON_ERROR(admitted.admit(req.qos()));
                       return truncateChunk(req, static_cast<TruncateResp&>(r));
                     });
  server.handleLocal(
      method("Sync"),
      [this](const google::protobuf::Message& m, google::protobuf::Message&,
             net::LocalPayloads&) -> Status { return syncTarget(static_cast<const SyncReq&>(m)); });
}

void StorageService::registerCommonHandlers(net::RpcServer& server) {
  server.handle<BatchReadReq, BatchReadResp>(
      method("BatchRead"),
      [this](net::CallContext& ctx, const BatchReadReq& req,
             BatchReadResp& resp) -> asio::awaitable<Status> {
        CO_ASSIGN_OR_RETURN(uint64_t total, readBytes(req));
        Admission admitted(*this, total);
        if (Status a = admitted.admit(req.qos()); !a.ok()) co_return a;
        std::shared_ptr<const ShmMapping> shm;
        std::shared_ptr<net::PooledBuffer> out;
        CO_ASSIGN_OR_RETURN(auto dest, readShm(req, total, &shm));
        if (!dest) {
          out = std::make_shared<net::PooledBuffer>(buffers_.get(total));
          dest = out->data();
        }
        if (total <= options_.loop_read_bytes_max &&
            co_await readOnLoop(ctx, req, dest, out, resp)) {
          co_return Status::OK();
        }
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          size_t at = readRanges(req, dest, resp);
          if (out) ctx.setResponsePayload(std::span<const uint8_t>(out->data(), at), out);
          return Status::OK();
        });
      });
  server.handle<QueryReq, QueryResp>(
      method("Query"),
      [this](net::CallContext&, const QueryReq& req, QueryResp& resp) -> asio::awaitable<Status> {
        Admission admitted(*this, kRequestBytes);
        if (Status a = admitted.admit(req.qos()); !a.ok()) co_return a;
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          ASSIGN_OR_RETURN(auto m, engine_.query(idOf(req.chunk())));
          resp.set_exists(m.has_value());
          if (m) fill(resp.mutable_info(), *m);
          return Status::OK();
        });
      });
  server.handle<SyncReq, SyncResp>(
      method("Sync"),
      [this](net::CallContext&, const SyncReq& req, SyncResp&) -> asio::awaitable<Status> {
        co_return co_await net::runBlocking(sync_pool_, [&] { return syncTarget(req); });
      });
  server.handle<ListReq, ListResp>(
      method("List"),
      [this](net::CallContext&, const ListReq& req, ListResp& resp) -> asio::awaitable<Status> {
        Admission admitted(*this, kRequestBytes);
        if (Status a = admitted.admit(req.qos()); !a.ok()) co_return a;
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          uint32_t limit = req.limit() == 0 ? 1000 : std::min<uint32_t>(req.limit(), 10000);
          ASSIGN_OR_RETURN(auto chunks, engine_.list(idOf(req.from()), limit + 1));
          resp.set_more(chunks.size() > limit);
          if (chunks.size() > limit) chunks.pop_back();
          if (req.chain() != 0 && !chunks.empty()) {
            // A page of the target's chunks, of which the chain's: the
            // caller goes on from after the last one looked at.
            auto* last = resp.mutable_last_seen();
            last->set_inode(chunks.back().first.inode);
            last->set_index(chunks.back().first.index);
          }
          for (const auto& [id, m] : chunks) {
            if (req.chain() != 0 && m.chain != req.chain()) continue;
            auto* c = resp.add_chunks();
            c->mutable_chunk()->set_inode(id.inode);
            c->mutable_chunk()->set_index(id.index);
            fill(c->mutable_info(), m);
          }
          return Status::OK();
        });
      });
  server.handle<SpaceReq, SpaceResp>(
      method("Space"),
      [this](net::CallContext&, const SpaceReq&, SpaceResp& resp) -> asio::awaitable<Status> {
        auto s = engine_.space();  // statvfs and counters: cheap, runs inline
        resp.set_path(engine_.path());
        resp.set_fs_total_bytes(s.fs_total_bytes);
        resp.set_fs_free_bytes(s.fs_free_bytes);
        resp.set_reserved_bytes(s.reserved_bytes);
        resp.set_chunks(s.chunks);
        resp.set_data_bytes(s.data_bytes);
        resp.set_failed(s.failed);
        resp.set_queued_bytes(queued_.load());
        resp.set_kept_bytes(s.kept_bytes);
        for (const auto& c : s.classes) {
          auto* k = resp.add_classes();
          k->set_slot_bytes(c.slot_bytes);
          k->set_slots_used(c.slots_used);
          k->set_slots_max(c.slots_max);
          k->set_data_bytes(c.data_bytes);
        }
        co_return Status::OK();
      });
  server.handle<ShmAttachReq, ShmAttachResp>(
      method("ShmAttach"),
      [this](net::CallContext&, const ShmAttachReq& req,
             ShmAttachResp& resp) -> asio::awaitable<Status> {
        // Opens and maps a file: cheap, but a syscall or three; on the pool.
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          ASSIGN_OR_RETURN(uint64_t h, shm_.attach(req.boot_id(), req.pid(), req.fd(), req.bytes(),
                                                   req.token()));
          resp.set_handle(h);
          return Status::OK();
        });
      });
  server.handle<LocateReq, LocateResp>(
      method("Locate"),
      [this](net::CallContext&, const LocateReq& req, LocateResp& resp) -> asio::awaitable<Status> {
        if (!options_.short_circuit_reads) {
          co_return Status(ErrorCode::kNotFound,
                           chains_ ? "short-circuit reads are off for replicated chains"
                                   : "short-circuit reads are off on this server");
        }
        if (req.boot_id().empty() || req.boot_id() != hostBootId())
          co_return Status(ErrorCode::kNotFound, "short-circuit reads need the server's host");
        if (req.ranges_size() > kLocateRangesMax) {
          co_return Status(
              ErrorCode::kInvalidArgument,
              fmt::format("locate of {} ranges exceeds {}", req.ranges_size(), kLocateRangesMax));
        }
        Admission admitted(*this, kRequestBytes);
        if (Status a = admitted.admit(req.qos()); !a.ok()) co_return a;
        std::vector<ChunkEngine::LocateRange> ranges;
        ranges.reserve(static_cast<size_t>(req.ranges_size()));
        for (const auto& r : req.ranges())
          ranges.push_back({idOf(r.chunk()), r.offset(), r.length()});
        // Records and CRCs in memory (the usual case right after writes or
        // earlier reads): answered on this I/O thread, no hand-offs.
        if (auto located = engine_.locate(ranges, /*in_memory_only=*/true)) {
          fillLocated(std::move(*located), resp);
          co_return Status::OK();
        }
        co_return co_await net::runBlocking(pool_, [&]() -> Status {
          fillLocated(*engine_.locate(ranges), resp);
          return Status::OK();
        });
      });
  server.handle<ShmDetachReq, ShmDetachResp>(method("ShmDetach"),
                                             [this](net::CallContext&, const ShmDetachReq& req,
                                                    ShmDetachResp&) -> asio::awaitable<Status> {
                                               shm_.detach(req.handle());
                                               co_return Status::OK();
                                             });
}

namespace {

// An I/O thread's AsyncReads, reused; `busy` of them are in use. Shared
// with the leases: a call suspended when its thread ends is destroyed later,
// on another thread, and gives its reads back then.
struct LoopReads {
  std::vector<std::unique_ptr<ChunkEngine::AsyncRead>> idle;
  uint32_t busy = 0;
};
const std::shared_ptr<LoopReads>& loopReads() {
  thread_local auto r = std::make_shared<LoopReads>();
  return r;
}

// Takes `n` of the thread's AsyncReads while it lives.
class LoopReadLease {
 public:
  explicit LoopReadLease(size_t n) : pool_(loopReads()) {
    for (size_t i = 0; i < n; ++i) {
      if (pool_->idle.empty()) {
        reads_.push_back(std::make_unique<ChunkEngine::AsyncRead>());
      } else {
        reads_.push_back(std::move(pool_->idle.back()));
        pool_->idle.pop_back();
      }
    }
    pool_->busy += static_cast<uint32_t>(n);
  }
  ~LoopReadLease() {
    pool_->busy -= static_cast<uint32_t>(reads_.size());
    for (auto& r : reads_) pool_->idle.push_back(std::move(r));
  }
  ChunkEngine::AsyncRead& operator[](size_t i) { return *reads_[i]; }

 private:
  std::shared_ptr<LoopReads> pool_;
  std::vector<std::unique_ptr<ChunkEngine::AsyncRead>> reads_;
};

}  // namespace

asio::awaitable<bool> StorageService::readOnLoop(net::CallContext& ctx, const BatchReadReq& req,
                                                 uint8_t* dest,
                                                 std::shared_ptr<net::PooledBuffer> out,
                                                 BatchReadResp& resp) {
  static auto& served = metrics::Registry::global().counter(
      "storage_loop_reads_total", {},
      "Batch reads served on the I/O thread that received them, through its io_uring");
  static auto& redone = metrics::Registry::global().counter(
      "storage_loop_reads_redone_total", {},
      "Batch reads started on an I/O thread and done again on the pool");
  constexpr int kRangesMax = 8;
  const int ranges = req.ranges_size();
  if (ranges == 0 || ranges > kRangesMax) co_return false;
  for (const auto& r : req.ranges()) {
    if (r.length() > ChunkEngine::kAsyncReadBytesMax) co_return false;
  }
  if (loopReads()->busy + ranges > options_.loop_reads_max) co_return false;
  LoopRing* ring = LoopRing::forThread(co_await asio::this_coro::executor);
  if (!ring) co_return false;
  LoopReadLease reads(ranges);
  uint32_t codes[kRangesMax], lengths[kRangesMax];
  size_t first_io[kRangesMax + 1];
  IoRequest io[2 * kRangesMax];
  size_t ios = 0, at = 0;
  for (int i = 0; i < ranges; ++i) {
    const auto& r = req.ranges(i);
    first_io[i] = ios;
    auto n = engine_.startRead(idOf(r.chunk()), r.offset(),
                               std::span<uint8_t>(dest + at, r.length()), reads[i]);
    if (n.ok() && !*n) co_return false;  // not from memory: all on the pool
    codes[i] = static_cast<uint32_t>(n.code());
    lengths[i] = n.ok() ? static_cast<uint32_t>(**n) : 0;
    at += lengths[i];  // only the bytes returned, back to back
    if (n.ok()) {
      for (IoRequest& q : reads[i].io()) io[ios++] = q;
    }
  }
  first_io[ranges] = ios;
  int results[2 * kRangesMax];
  co_await ring->run({io, ios}, {results, ios});
  for (int i = 0; i < ranges; ++i) {
    if (codes[i] != static_cast<uint32_t>(ErrorCode::kOk)) continue;
    std::span<const int> mine(results + first_io[i], first_io[i + 1] - first_io[i]);
    if (!engine_.finishRead(reads[i], mine)) {
      redone.inc();
      co_return false;
    }
  }
  for (int i = 0; i < ranges; ++i) {
    resp.add_codes(codes[i]);
    resp.add_lengths(lengths[i]);
  }
  if (out) {
    std::span<const uint8_t> bytes(out->data(), at);
    ctx.setResponsePayload(bytes, std::move(out));
  }
  served.inc();
  co_return true;
}

StorageService::~StorageService() {
  pool_.join();
  sync_pool_.join();
}

Result<std::span<const uint8_t>> StorageService::writeData(const WriteReq& req,
                                                           std::span<const uint8_t> payload,
                                                           std::shared_ptr<const ShmMapping>* shm) {
  if (req.shm_handle() == 0) return payload;
  if (!payload.empty()) {
    return Status(ErrorCode::kInvalidArgument, "a write names shared memory and carries a payload");
  }
  ASSIGN_OR_RETURN(*shm, shmRange(req.shm_handle(), req.shm_offset(), req.shm_length()));
  return std::span<const uint8_t>((*shm)->data + req.shm_offset(), req.shm_length());
}

Status StorageService::writeChunk(const WriteReq& req, std::span<const uint8_t> data, bool copy,
                                  WriteResp& resp) {
  // A write held up on its way to the chunk (a full queue, a stalled thread).
  RETURN_ON_ERROR(CISTERN_FAULT("storage.write.queued"));
  bool unsynced = false;
  ASSIGN_OR_RETURN(ChunkMeta m,
                   engine_.write(idOf(req.chunk()), req.offset(), data, req.chain_version(),
                                 /*stable=*/!copy, static_cast<int64_t>(req.not_after_unix_ns()),
                                 /*durable=*/!req.unsynced(), &unsynced));
  fill(resp.mutable_info(), m);
  if (unsynced) resp.set_host_boot_id(hostBootId());
  return Status::OK();
}

Result<uint64_t> StorageService::readBytes(const BatchReadReq& req) const {
  uint64_t total = 0;
  for (const auto& r : req.ranges()) total += r.length();
  if (total > options_.batch_read_bytes_max) {
    return Status(ErrorCode::kPayloadTooLarge, fmt::format("batch read of {} bytes exceeds {}",
                                                           total, options_.batch_read_bytes_max));
  }
  return total;
}

Result<uint8_t*> StorageService::readShm(const BatchReadReq& req, uint64_t total,
                                         std::shared_ptr<const ShmMapping>* shm) {
  if (req.shm_handle() == 0) return static_cast<uint8_t*>(nullptr);
  ASSIGN_OR_RETURN(*shm, shmRange(req.shm_handle(), req.shm_offset(), total));
  return (*shm)->data + req.shm_offset();
}

size_t StorageService::readRanges(const BatchReadReq& req, uint8_t* dest, BatchReadResp& resp) {
  size_t at = 0;
  for (const auto& r : req.ranges()) {
    const ChunkId id = idOf(r.chunk());
    if (chains_) {
      // A replica returns only committed versions, and only while it is a
      // serving member of the chain (docs/chain_protocol.md, "Reads"). A
      // change that lands during the read leaves the chunk dirty after it.
      Status ok = chains_->serving(r.chain(), r.chain_version()).status();
      if (ok.ok() && locks_->dirty(id))
        ok = Status(ErrorCode::kChunkNotCommitted, "uncommitted version; read the tail");
      if (!ok.ok()) {
        resp.add_codes(static_cast<uint32_t>(ok.code()));
        resp.add_lengths(0);
        continue;
      }
    }
    auto n = engine_.read(id, r.offset(), std::span<uint8_t>(dest + at, r.length()));
    if (chains_ && n.ok() && (locks_->dirty(id) || !chains_->leased()))
      n = Status(ErrorCode::kChunkNotCommitted, "uncommitted version; read the tail");
    // This copy failed verification: the client reads another replica, and
    // this one is repaired from a peer's (docs/chain_protocol.md, "Repair").
    if (chains_ && n.code() == ErrorCode::kCorruption) repairLater(id, r.chain());
    resp.add_codes(static_cast<uint32_t>(n.code()));
    size_t got = n.ok() ? *n : 0;
    resp.add_lengths(static_cast<uint32_t>(got));
    at += got;  // only the bytes returned, back to back
  }
  return at;
}

Status StorageService::syncTarget(const SyncReq& req) {
  // A Sync held up: a device flush that takes long.
  RETURN_ON_ERROR(CISTERN_FAULT("storage.sync.queued"));
  if (!req.host_boot_id().empty() && req.host_boot_id() != hostBootId()) {
    return Status(ErrorCode::kIOError,
                  fmt::format("target {}: its host booted after the unsynced writes being synced: "
                              "they may never have reached the disk",
                              engine_.path()));
  }
  return engine_.sync();
}

Status StorageService::truncateChunk(const TruncateReq& req, TruncateResp& resp) {
  RETURN_ON_ERROR(CISTERN_FAULT("storage.truncate.queued"));
  ASSIGN_OR_RETURN(ChunkMeta m,
                   engine_.truncate(idOf(req.chunk()), req.length(), req.chain_version(),
                                    static_cast<int64_t>(req.not_after_unix_ns())));
  fill(resp.mutable_info(), m);
  return Status::OK();
}

Result<std::shared_ptr<const ShmMapping>> StorageService::shmRange(uint64_t handle, uint64_t offset,
                                                                   uint64_t bytes) {
  auto shm = shm_.get(handle);
  if (!shm) {
    return Status(ErrorCode::kNotFound,
                  fmt::format("shared memory handle {} is not attached", handle));
  }
  if (offset > shm->bytes || bytes > shm->bytes - offset) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} bytes at {} exceed the {} bytes of shared memory", bytes, offset,
                              shm->bytes));
  }
  return shm;
}

}  // namespace cistern::storage
