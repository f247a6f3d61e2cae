// Chain replication in the storage service (storage_service.h;
// docs/chain_protocol.md, "Storage servers"): a client's change at the head,
// a forwarded change at the other replicas, and the resync of a SYNCING
// successor.
#include <fmt/format.h>

#include <asio/post.hpp>
#include <asio/thread_pool.hpp>

#include <condition_variable>
#include <cstring>
#include <thread>

#include <asio/experimental/awaitable_operators.hpp>
#include "common/fault.h"
#include "common/log.h"
#include "common/metrics.h"

#include "mgmt.pb.h"
#include "net/blocking.h"
#include "net/rpc_client.h"
#include "storage.pb.h"
#include "storage/forward_rules.h"
#include "storage/storage_service.h"
#include "storage/storage_service_util.h"

namespace cistern::storage {
namespace {

std::string idText(ChunkId id) { return fmt::format("chunk {}:{}", id.inode, id.index); }

// This replica's disk failed a change (EIO, ENOSPC) that its successors may
// hold: the forward went through or its fate is unknown (only these
// refusals say the successor did not take it).
template <typename Outcome>
bool diskFailedWhatTheChainMayHold(const ChainPosition& pos, const Outcome& out) {
  const ErrorCode e = out.applied.code(), fe = out.forwarded.code();
  return pos.successor != 0 && (e == ErrorCode::kIOError || e == ErrorCode::kNoSpace) &&
         fe != ErrorCode::kChunkVersionMismatch && fe != ErrorCode::kStaleChainVersion &&
         fe != ErrorCode::kNotServing;
}

const net::Method& kForward() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Forward");
  return m;
}
const net::Method& kCopy() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Copy");
  return m;
}
const net::Method& kList() {
  static const auto m = net::Method::of("cistern.storage.StorageService.List");
  return m;
}
// Chunks a resync copies at once.
constexpr size_t kResyncCopies = 8;
// A forward waits for the rest of the chain; a replica that does not
// answer within this is treated as failed for this attempt (the client
// retries; mgmtd takes a dead one out).
constexpr uint32_t kForwardTimeoutMs = 5000;

}  // namespace

std::vector<std::pair<uint32_t, uint32_t>> StorageService::takeSynced() {
  std::lock_guard lock(synced_mu_);
  return std::exchange(synced_, {});
}

Result<StorageService::Copy> StorageService::copyOf(ChunkId id, bool with_data) {
  Copy c;
  ASSIGN_OR_RETURN(c.meta, engine_.query(id));
  if (!c.meta || !with_data) return c;
  c.bytes.emplace(buffers_.get(c.meta->length));
  ASSIGN_OR_RETURN(size_t n,
                   engine_.read(id, 0, std::span<uint8_t>(c.bytes->data(), c.meta->length)));
  if (n != c.meta->length) {
    return Status(ErrorCode::kInternal,
                  fmt::format("{}: read {} of its {} bytes", idText(id), n, c.meta->length));
  }
  return c;
}

Result<std::optional<ChunkMeta>> StorageService::applyLocal(ChunkId id, const Change& c,
                                                            uint32_t chain, uint64_t chain_version,
                                                            int64_t not_after_ns,
                                                            uint64_t chunk_version) {
  switch (c.op) {
    case ForwardReq::WRITE: {
      RETURN_ON_ERROR(CISTERN_FAULT("storage.write.queued"));
      ASSIGN_OR_RETURN(ChunkMeta m, engine_.write(id, c.offset, c.data, chain_version,
                                                  /*stable=*/true, not_after_ns,
                                                  /*durable=*/true, nullptr, chain));
      return std::optional<ChunkMeta>(m);
    }
    case ForwardReq::TRUNCATE: {
      ASSIGN_OR_RETURN(ChunkMeta m,
                       engine_.truncate(id, c.length, chain_version, not_after_ns, chain));
      return std::optional<ChunkMeta>(m);
    }
    case ForwardReq::REPLACE: {
      ASSIGN_OR_RETURN(ChunkMeta m, engine_.replace(id, c.data, chain, chain_version, chunk_version,
                                                    /*durable=*/!c.sync));
      return std::optional<ChunkMeta>(m);
    }
    case ForwardReq::REMOVE:
      RETURN_ON_ERROR(engine_.remove(id, not_after_ns));
      return std::optional<ChunkMeta>();
  }
  return Status(ErrorCode::kInvalidArgument, fmt::format("unknown change {}", c.op));
}

asio::awaitable<Status> StorageService::forwardOnce(const ChainPosition& pos, ForwardReq f,
                                                    std::span<const uint8_t> payload) {
  CO_ASSIGN_OR_RETURN(auto to, net::Endpoint::parse(pos.successor_endpoint));
  f.set_chain(pos.chain);
  f.set_chain_version(pos.version);
  ForwardResp resp;
  net::CallOptions co;
  co.timeout_ms = kForwardTimeoutMs;
  co.request_payload = payload;
  co_return co_await peers_->call(to, kForward(), f, &resp, co);
}

ForwardReq StorageService::copyRequest(ChunkId id, const Copy& copy, uint32_t only_chain,
                                       std::span<const uint8_t>* payload) {
  ForwardReq r;
  r.mutable_chunk()->set_inode(id.inode);
  r.mutable_chunk()->set_index(id.index);
  *payload = {};
  if (copy.meta && (only_chain == 0 || copy.meta->chain == only_chain)) {
    r.set_op(ForwardReq::REPLACE);
    r.set_chunk_version(copy.meta->chunk_version);
    r.set_content_chain_version(copy.meta->chain_version);
    *payload = {copy.bytes->data(), copy.meta->length};
  } else {
    r.set_op(ForwardReq::REMOVE);
  }
  return r;
}

Status StorageService::sendCopyBlocking(const ChainPosition& p, ChunkId id, bool sync) {
  ASSIGN_OR_RETURN(auto to, net::Endpoint::parse(p.successor_endpoint));
  ASSIGN_OR_RETURN(Copy copy, copyOf(id, true));
  net::CallOptions co;
  co.timeout_ms = kForwardTimeoutMs;
  // A resync sends only the chain's chunks (a target is in several).
  ForwardReq r = copyRequest(id, copy, sync ? p.chain : 0, &co.request_payload);
  r.set_chain(p.chain);
  r.set_chain_version(p.version);
  r.set_sync(sync);
  ForwardResp resp;
  return peers_->callSync(to, kForward(), r, &resp, co);
}

asio::awaitable<Status> StorageService::replaceDownstream(const ChainPosition& pos, ChunkId id,
                                                          bool sync) {
  CO_ASSIGN_OR_RETURN(Copy copy,
                      co_await net::runBlocking(pool_, [&] { return copyOf(id, true); }));
  std::span<const uint8_t> bytes;
  ForwardReq r = copyRequest(id, copy, 0, &bytes);
  r.set_sync(sync);
  co_return co_await forwardOnce(pos, r, bytes);
}

asio::awaitable<StorageService::Outcome> StorageService::applyAndForward(
    const ChainPosition& pos, const ForwardReq& f, std::span<const uint8_t> payload,
    std::function<Result<std::optional<ChunkMeta>>()> apply) {
  using namespace asio::experimental::awaitable_operators;
  const auto local = [&]() -> Outcome {
    Outcome o;
    auto r = apply();
    if (r.ok()) {
      o.meta = std::move(*r);
    } else {
      o.applied = r.status();
    }
    return o;
  };
  Outcome out;
  if (pos.successor == 0 || f.sync()) {
    out = co_await net::runBlocking(pool_, local);
    co_return out;
  }
  // Both at once: each is a durable write of about the same time, so the
  // chain's latency is about one replica's instead of the sum.
  auto [here, forwarded] =
      co_await (net::runBlocking(pool_, local) && forwardOnce(pos, f, payload));
  out = std::move(here);
  out.forwarded = std::move(forwarded);
  // The successor holds another version than the one the change applies to:
  // it gets this replica's whole copy, once the change is applied here.
  if (out.forwarded.code() == ErrorCode::kChunkVersionMismatch && out.applied.ok())
    out.forwarded = co_await replaceDownstream(pos, idOf(f.chunk()), false);
  co_return out;
}

asio::awaitable<Status> StorageService::settle(ChunkId id, const ChainPosition& pos) {
  if (pos.successor != 0) CO_RETURN_ON_ERROR(co_await replaceDownstream(pos, id, false));
  locks_->clearDirty(id);
  co_return Status::OK();
}

Status StorageService::stillAt(uint32_t chain, uint64_t chain_version) const {
  auto pos = chains_->position(chain);
  if (pos && pos->version == chain_version) return Status::OK();
  return Status(
      ErrorCode::kStaleChainVersion,
      fmt::format("chain {} moved past version {} during the change", chain, chain_version));
}

Status StorageService::repair(ChunkId id, uint32_t chain) {
  static auto& repaired = metrics::Registry::global().counter(
      "storage_chunks_repaired_total", {},
      "Chunk copies that failed verification and were replaced by a peer's copy");
  if (engine_.failed())
    return Status(ErrorCode::kIOError, fmt::format("target {} failed", chains_->target()));
  auto pos = chains_->position(chain);
  if (!pos || !pos->serving)
    return Status(ErrorCode::kNotServing,
                  fmt::format("target {} does not serve chain {}", chains_->target(), chain));
  ChunkLocks::Guard guard = locks_->lockBlocking(id);
  ASSIGN_OR_RETURN(auto mine, engine_.query(id));
  if (!mine) return Status(ErrorCode::kNotFound, fmt::format("{}: no copy here", idText(id)));
  net::PooledBuffer buf = buffers_.get(mine->length);
  Status last(ErrorCode::kNotFound, fmt::format("chain {} has no other serving replica", chain));
  // The tail's copy first: it is the chain's committed one.
  for (auto it = pos->serving_peers.rbegin(); it != pos->serving_peers.rend(); ++it) {
    auto to = net::Endpoint::parse(*it);
    if (!to.ok()) continue;
    CopyReq req;
    req.mutable_chunk()->set_inode(id.inode);
    req.mutable_chunk()->set_index(id.index);
    req.set_chain(chain);
    CopyResp resp;
    size_t got = 0;
    net::CallOptions co;
    co.timeout_ms = kForwardTimeoutMs;
    co.response_payload = std::span<uint8_t>(buf.data(), mine->length);
    co.response_payload_len = &got;
    Status s = peers_->callSync(*to, kCopy(), req, &resp, co);
    if (s.ok() && !(resp.exists() && resp.info().chunk_version() == mine->chunk_version &&
                    resp.info().chain_version() == mine->chain_version && got == mine->length)) {
      s = Status(ErrorCode::kChunkVersionMismatch,
                 fmt::format("{} holds another version", *it));  // not this copy's repair
    }
    if (!s.ok()) {
      last = s;
      continue;
    }
    RETURN_ON_ERROR(engine_
                        .replace(id, std::span<const uint8_t>(buf.data(), got), chain,
                                 mine->chain_version, mine->chunk_version, /*durable=*/true)
                        .status());
    repaired.inc();
    CLOG_WARN("storage", "chain {}: {} failed verification on target {}; repaired from {}", chain,
              idText(id), chains_->target(), *it);
    return Status::OK();
  }
  return last.withContext(fmt::format("repairing {} of chain {}", idText(id), chain));
}

void StorageService::repairLater(ChunkId id, uint32_t chain) {
  {
    std::lock_guard lock(repair_mu_);
    if (repairing_.size() >= kRepairsQueued || !repairing_.insert(id).second) return;
  }
  asio::post(repair_pool_, [this, id, chain] {
    if (Status s = repair(id, chain); !s.ok())
      CLOG_WARN("storage", "chain {}: {}: {}", chain, idText(id), s.toString());
    std::lock_guard lock(repair_mu_);
    repairing_.erase(id);
  });
}

Status StorageService::settleDirty() {
  // A failed target's copies stopped moving: pushing them down the chain
  // would take back changes its successors hold (the head fails its
  // target for exactly that, headChange).
  if (engine_.failed()) return Status::OK();
  for (const auto& [id, chain] : locks_->dirtyChunks()) {
    auto pos = chains_->position(chain);
    if (!pos || !pos->head) continue;  // a head's to settle; it is dirty too
    ChunkLocks::Guard guard = locks_->lockBlocking(id);
    if (engine_.failed()) return Status::OK();  // failed meanwhile (headChange)
    if (!locks_->dirty(id)) continue;
    // A failed send leaves it dirty: the next pass tries again.
    if (pos->successor != 0 && !sendCopyBlocking(*pos, id, /*sync=*/false).ok()) continue;
    locks_->clearDirty(id);
  }
  return Status::OK();
}

bool StorageService::committedHere(std::pair<uint64_t, uint64_t> update) {
  std::lock_guard lock(updates_mu_);
  return updates_.count(update) > 0;
}

void StorageService::remember(std::pair<uint64_t, uint64_t> update) {
  std::lock_guard lock(updates_mu_);
  if (updates_.insert(update).second) update_order_.push_back(update);
  while (update_order_.size() > kRememberedUpdates) {
    updates_.erase(update_order_.front());
    update_order_.pop_front();
  }
}

asio::awaitable<Status> StorageService::headChange(uint32_t chain, uint64_t chain_version,
                                                   ChunkId id, const Change& c,
                                                   std::pair<uint64_t, uint64_t> update,
                                                   int64_t not_after_ns, ChunkInfo* info) {
  CO_RETURN_ON_ERROR(chains_->serving(chain, chain_version).status());
  ChunkLocks::Guard guard = co_await locks_->lock(id);
  // Where this replica stands once it holds the chunk (the chain may have
  // moved while it waited).
  CO_ASSIGN_OR_RETURN(ChainPosition pos, chains_->serving(chain, chain_version));
  // A failed target takes no change (checked holding the chunk: a change
  // that waited behind the one that failed it must not go on): its copy no
  // longer moves, so a change would go down the chain under a version its
  // successors hold with other bytes, or settle them back to its own.
  if (engine_.failed())
    co_return Status(ErrorCode::kIOError,
                     fmt::format("target {} failed: it takes no changes", chains_->target()));
  if (!pos.head) {
    co_return Status(ErrorCode::kNotServing,
                     fmt::format("target {} is not the head of chain {} (version {})",
                                 chains_->target(), chain, chain_version));
  }
  // A change of this chunk that did not get down the chain (a successor
  // failed): the chain gets this replica's copy first.
  if (locks_->dirty(id)) {
    Status s = co_await settle(id, pos);
    if (!s.ok()) co_return s.withContext(fmt::format("chain {}: settling {}", chain, idText(id)));
  }
  const bool has_update = update.first != 0;
  if (has_update && committedHere(update)) {  // a client's retry of a change committed here
    auto meta = co_await net::runBlocking(pool_, [&] { return engine_.query(id); });
    if (!meta.ok()) co_return meta.status();
    if (*meta && info) fill(info, **meta);
    co_return Status::OK();
  }
  CO_ASSIGN_OR_RETURN(auto before,
                      co_await net::runBlocking(pool_, [&] { return engine_.query(id); }));
  ForwardReq f;
  f.mutable_chunk()->set_inode(id.inode);
  f.mutable_chunk()->set_index(id.index);
  f.set_op(static_cast<ForwardReq::Op>(c.op));
  f.set_offset(c.offset);
  f.set_length(c.length);
  if (before) {
    f.set_base_version(before->chunk_version);
    f.set_base_chain_version(before->chain_version);
  }
  // Each change makes the next version (the chunk is held).
  if (c.op != ForwardReq::REMOVE) f.set_chunk_version((before ? before->chunk_version : 0) + 1);
  f.set_update_client(update.first);
  f.set_update_seq(update.second);
  // A late attempt is refused before any replica takes it (the local
  // apply checks again, as the engine does).
  CO_RETURN_ON_ERROR(engine_.checkNotAfter(id, not_after_ns));
  locks_->markDirty(id, chain);
  Outcome out = co_await applyAndForward(pos, f, c.data, [&]() -> Result<std::optional<ChunkMeta>> {
    RETURN_ON_ERROR(CISTERN_FAULT("storage.head.apply"));  // the head's disk alone failing
    return applyLocal(id, c, chain, chain_version, not_after_ns, 0);
  });
  if (!out.applied.ok()) {
    if (diskFailedWhatTheChainMayHold(pos, out)) {
      // The disk here failed a change the rest of the chain may hold and
      // may have shown to a reader of the tail: taking it back would
      // un-commit it. This target fails instead (read-only, out of its
      // heartbeats: mgmtd takes it out of its chains and the successors,
      // with the change, go on); the client's retry reaches the new head,
      // which remembers the update (docs/chain_protocol.md, "A head that
      // fails to apply").
      (void)engine_.failTarget(fmt::format("chain {}: {} applied down the chain but not here: {}",
                                           chain, idText(id), out.applied.toString()));
      co_return out.applied;
    }
    // Changed nothing here, and the successors refused it too (the same
    // bad input) or not at all: the copy they hold is this one's.
    if (pos.successor != 0 && out.forwarded.ok()) {
      if (Status back = co_await replaceDownstream(pos, id, false); !back.ok())
        co_return out.applied;
    }
    locks_->clearDirty(id);
    co_return out.applied;
  }
  if (out.meta && c.op != ForwardReq::REMOVE && out.meta->chunk_version != f.chunk_version()) {
    co_return Status(ErrorCode::kInternal,
                     fmt::format("{}: applied as version {}, expected {}", idText(id),
                                 out.meta->chunk_version, f.chunk_version()));
  }
  // In this copy now, which reaches the whole chain before any other change
  // of the chunk (a dirty chunk is settled first): a retry is answered, not
  // applied again, whatever happens to the forward.
  if (has_update) remember(update);
  if (!out.forwarded.ok()) {
    // Stays dirty: the next change of the chunk, or the client's retry,
    // settles it first. Transient for the client either way.
    const Status& s = out.forwarded;
    co_return Status(
        s.code() == ErrorCode::kStaleChainVersion ? s.code() : ErrorCode::kConnectionFailed,
        fmt::format("chain {}: forwarding {} to target {}: {}", chain, idText(id), pos.successor,
                    s.toString()));
  }
  // The chain moved while the change was under way: a resync of a new
  // member that listed this target's chunks meanwhile may have missed it,
  // so it is not acknowledged (it stays dirty; the client's retry, or the
  // background settle, carries it down the new chain).
  CO_RETURN_ON_ERROR(stillAt(chain, chain_version));
  // The head dying here, its change committed down the chain but not
  // answered: the client's retry goes to the next head, which knows it.
  if (Status f = CISTERN_FAULT("storage.head.after_forward"); !f.ok()) co_return f;
  locks_->clearDirty(id);
  if (out.meta && info) fill(info, *out.meta);
  co_return Status::OK();
}

asio::awaitable<Status> StorageService::onForward(const ForwardReq& f,
                                                  std::span<const uint8_t> payload,
                                                  ForwardResp& resp) {
  auto pos = chains_->position(f.chain());
  if (!pos || !(pos->serving || pos->syncing)) {
    co_return Status(ErrorCode::kNotServing, fmt::format("target {} takes no changes of chain {}",
                                                         chains_->target(), f.chain()));
  }
  if (pos->version != f.chain_version()) {
    co_return Status(ErrorCode::kStaleChainVersion,
                     fmt::format("chain {}: forwarded under version {}, target {} has {}",
                                 f.chain(), f.chain_version(), chains_->target(), pos->version));
  }
  if (f.op() == ForwardReq::SYNC_DONE) {
    // The resync's copies were written unsynced: durable before the target
    // can serve.
    CO_RETURN_ON_ERROR(co_await net::runBlocking(pool_, [&] { return engine_.sync(); }));
    // Synced, this copy of the chain is its predecessor's: a dirty mark it
    // kept from before (a change it took that never settled) is stale and
    // would keep the chunk unreadable here. Each is cleared under its lock
    // (a change in flight clears its own).
    for (const auto& [id, chain] : locks_->dirtyChunks()) {
      if (chain != f.chain()) continue;
      ChunkLocks::Guard guard = co_await locks_->lock(id);
      locks_->clearDirty(id);
    }
    {
      std::lock_guard lock(synced_mu_);
      synced_.push_back({f.chain(), chains_->target()});
    }
    if (on_synced_) on_synced_();
    co_return Status::OK();
  }
  const ChunkId id = idOf(f.chunk());
  ChunkLocks::Guard guard = co_await locks_->lock(id);
  pos = chains_->position(f.chain());  // once it holds the chunk: the chain may have moved
  if (!pos || !(pos->serving || pos->syncing) || pos->version != f.chain_version()) {
    co_return Status(ErrorCode::kStaleChainVersion,
                     fmt::format("chain {} moved past version {} at target {}", f.chain(),
                                 f.chain_version(), chains_->target()));
  }
  if (engine_.failed())  // its copy no longer moves (headChange): it passes nothing on
    co_return Status(ErrorCode::kIOError,
                     fmt::format("target {} failed: it takes no changes", chains_->target()));
  CO_ASSIGN_OR_RETURN(auto have,
                      co_await net::runBlocking(pool_, [&] { return engine_.query(id); }));
  ForwardKind kind;
  ChunkStamp result{f.chunk_version(), f.chain_version()};
  switch (f.op()) {
    case ForwardReq::WRITE:
    case ForwardReq::TRUNCATE:
      kind = ForwardKind::kChange;
      break;
    case ForwardReq::REPLACE:
      kind = ForwardKind::kReplace;
      result.chain_version = f.content_chain_version();
      break;
    case ForwardReq::REMOVE:
      kind = ForwardKind::kRemove;
      break;
    default:
      co_return Status(ErrorCode::kInvalidArgument, fmt::format("unknown change {}", f.op()));
  }
  std::optional<ChunkStamp> held;
  if (have) held = ChunkStamp{have->chunk_version, have->chain_version};
  const ForwardAction action = classifyForward(
      kind, held ? &*held : nullptr, ChunkStamp{f.base_version(), f.base_chain_version()}, result);
  if (action == ForwardAction::kMismatch) {
    co_return Status(
        ErrorCode::kChunkVersionMismatch,
        fmt::format("{}: target {} holds version {}.{}, the change applies to {}.{}", idText(id),
                    chains_->target(), held ? held->version : 0, held ? held->chain_version : 0,
                    f.base_version(), f.base_chain_version()));
  }
  const bool apply = action == ForwardAction::kApply;
  locks_->markDirty(id, f.chain());
  Change c{f.op(), f.offset(), f.length(), payload, f.sync()};
  const uint64_t stamp =
      f.op() == ForwardReq::REPLACE ? f.content_chain_version() : f.chain_version();
  Outcome out =
      co_await applyAndForward(*pos, f, payload, [&]() -> Result<std::optional<ChunkMeta>> {
        if (!apply) return have;
        return applyLocal(id, c, f.chain(), stamp, 0, f.chunk_version());
      });
  if (!out.applied.ok()) {
    if (!f.sync() && diskFailedWhatTheChainMayHold(*pos, out)) {
      // As at the head (headChange): the replicas after this one may hold
      // the change, and the tail may have shown it; this one fails rather
      // than hold an older copy the chain could later be settled back to.
      (void)engine_.failTarget(fmt::format("chain {}: {} applied down the chain but not here: {}",
                                           f.chain(), idText(id), out.applied.toString()));
      co_return out.applied.withContext(fmt::format("chain {}", f.chain()));
    }
    if (pos->successor == 0 || !out.forwarded.ok()) locks_->clearDirty(id);
    co_return out.applied.withContext(fmt::format("chain {}", f.chain()));
  }
  std::optional<ChunkMeta> now = out.meta;
  if (now && f.op() != ForwardReq::REMOVE && now->chunk_version != f.chunk_version()) {
    co_return Status(ErrorCode::kInternal,
                     fmt::format("{}: applied as version {}, the chain's is {}", idText(id),
                                 now->chunk_version, f.chunk_version()));
  }
  if (f.update_client() != 0) remember({f.update_client(), f.update_seq()});  // as at the head
  CO_RETURN_ON_ERROR(out.forwarded);
  CO_RETURN_ON_ERROR(stillAt(f.chain(), f.chain_version()));  // as in headChange
  locks_->clearDirty(id);
  if (now) fill(resp.mutable_info(), *now);
  co_return Status::OK();
}

void StorageService::registerChainHandlers(net::RpcServer& server) {
  server.handle<WriteReq, WriteResp>(
      method("Write"),
      [this](net::CallContext& ctx, const WriteReq& req,
             WriteResp& resp) -> asio::awaitable<Status> {
        std::shared_ptr<const ShmMapping> shm;
        CO_ASSIGN_OR_RETURN(auto data, writeData(req, ctx.requestPayload(), &shm));
        Admission admitted(*this, data.size());
        if (Status a = admitted.admit(req.qos()); !a.ok()) co_return a;
        // Bytes in a client's shared memory may change meanwhile: every
        // replica gets the same copy.
        std::optional<net::PooledBuffer> copy;
        if (shm) {
          copy.emplace(buffers_.get(data.size()));
          std::memcpy(copy->data(), data.data(), data.size());
          data = {copy->data(), data.size()};
        }
        Change c{ForwardReq::WRITE, req.offset(), 0, data};
        co_return co_await headChange(req.chain(), req.chain_version(), idOf(req.chunk()), c,
                                      {req.update_client(), req.update_seq()},
                                      static_cast<int64_t>(req.not_after_unix_ns()),
                                      resp.mutable_info());
      });
  server.handle<TruncateReq, TruncateResp>(
      method("Truncate"),
      [this](net::CallContext&, const TruncateReq& req,
             TruncateResp& resp) -> asio::awaitable<Status> {
        Admission admitted(*this, kRequestBytes);
        if (Status a = admitted.admit(req.qos()); !a.ok()) co_return a;
        Change c{ForwardReq::TRUNCATE, 0, req.length(), {}};
        co_return co_await headChange(req.chain(), req.chain_version(), idOf(req.chunk()), c,
                                      {0, 0}, static_cast<int64_t>(req.not_after_unix_ns()),
                                      resp.mutable_info());
      });
  server.handle<RemoveReq, RemoveResp>(
      method("Remove"),
      [this](net::CallContext&, const RemoveReq& req, RemoveResp& resp) -> asio::awaitable<Status> {
        Admission admitted(*this, kRequestBytes);
        if (Status a = admitted.admit(req.qos()); !a.ok()) co_return a;
        const auto not_after = static_cast<int64_t>(req.not_after_unix_ns());
        const Change c{ForwardReq::REMOVE, 0, 0, {}};
        for (const auto& ref : req.chunks()) {
          Status s = co_await headChange(req.chain(), req.chain_version(), idOf(ref), c, {0, 0},
                                         not_after, nullptr);
          resp.add_codes(static_cast<uint32_t>(s.code()));
        }
        if (req.has_from()) {
          // The chunks of the inode from `from.index` on, one change each.
          const uint32_t limit = req.limit() == 0 ? 1000 : std::min<uint32_t>(req.limit(), 10000);
          const ChunkId from = idOf(req.from());
          CO_ASSIGN_OR_RETURN(auto chunks, co_await net::runBlocking(pool_, [&] {
                                return engine_.list(from, limit + 1);
                              }));
          uint32_t removed = 0;
          bool more = false;
          for (const auto& [id, m] : chunks) {
            if (id.inode != from.inode) break;
            if (removed == limit) {
              more = true;
              break;
            }
            if (m.chain != 0 && m.chain != req.chain()) continue;
            CO_RETURN_ON_ERROR(co_await headChange(req.chain(), req.chain_version(), id, c, {0, 0},
                                                   not_after, nullptr));
            ++removed;
          }
          resp.set_removed(removed);
          resp.set_more(more);
        }
        co_return Status::OK();
      });
  server.handle<PushRoutingReq, PushRoutingResp>(
      method("PushRouting"),
      [this](net::CallContext&, const PushRoutingReq& req,
             PushRoutingResp&) -> asio::awaitable<Status> {
        mgmt::Routing routing;
        if (!routing.ParseFromString(req.routing()))
          co_return Status(ErrorCode::kBadMessage, "pushed routing does not parse");
        CO_RETURN_ON_ERROR(chains_->update(routing));
        if (on_routing_) on_routing_();
        co_return Status::OK();
      });
  server.handle<CopyReq, CopyResp>(
      method("Copy"),
      [this](net::CallContext& ctx, const CopyReq& req, CopyResp& resp) -> asio::awaitable<Status> {
        Admission admitted(*this, kRequestBytes);
        if (Status a = admitted.admit(QOS_BACKGROUND); !a.ok()) co_return a;
        auto pos = chains_->position(req.chain());
        if (!pos || !pos->serving || !chains_->leased() || engine_.failed())
          co_return Status(
              ErrorCode::kNotServing,
              fmt::format("target {} serves no copy of chain {}", chains_->target(), req.chain()));
        const ChunkId id = idOf(req.chunk());
        ChunkLocks::Guard guard = co_await locks_->lock(id);
        if (locks_->dirty(id))
          co_return Status(ErrorCode::kChunkNotCommitted, "uncommitted version; ask the tail");
        CO_ASSIGN_OR_RETURN(Copy copy,
                            co_await net::runBlocking(pool_, [&] { return copyOf(id, true); }));
        if (!copy.meta || copy.meta->chain != req.chain()) co_return Status::OK();
        resp.set_exists(true);
        fill(resp.mutable_info(), *copy.meta);
        auto bytes = std::make_shared<net::PooledBuffer>(std::move(*copy.bytes));
        ctx.setResponsePayload(std::span<const uint8_t>(bytes->data(), copy.meta->length), bytes);
        co_return Status::OK();
      });
  server.handle<ForwardReq, ForwardResp>(method("Forward"),
                                         [this](net::CallContext& ctx, const ForwardReq& req,
                                                ForwardResp& resp) -> asio::awaitable<Status> {
                                           // Not admitted against the budget: refusing a forward
                                           // would fail a change the head has applied; the head's
                                           // admission bounds them.
                                           co_return co_await onForward(req, ctx.requestPayload(),
                                                                        resp);
                                         });
}

Status StorageService::syncChunk(const ChainPosition& p, ChunkId id) {
  ChunkLocks::Guard guard = locks_->lockBlocking(id);
  if (engine_.failed())  // failed meanwhile (headChange): its copy may be older than the chain's
    return Status(ErrorCode::kIOError,
                  fmt::format("target {} failed: it syncs no successor", chains_->target()));
  return sendCopyBlocking(p, id, /*sync=*/true);
}

Status StorageService::resync(const ChainPosition& p, const std::atomic<bool>* stop) {
  if (engine_.failed())  // its copies may be older than the chain's (settleDirty)
    return Status(ErrorCode::kIOError,
                  fmt::format("target {} failed: it syncs no successor", chains_->target()));
  ASSIGN_OR_RETURN(auto to, net::Endpoint::parse(p.successor_endpoint));
  const auto stopped = [&] { return stop && stop->load(); };
  // Both lists in chunk order, a page at a time, merged.
  constexpr uint32_t kPage = 1000;
  std::vector<std::pair<ChunkId, ChunkMeta>> mine;
  size_t mi = 0;
  ChunkId mine_from{};
  bool mine_more = true;
  struct Theirs {
    ChunkId id;
    uint64_t version, chain_version;
  };
  std::vector<Theirs> theirs;
  size_t ti = 0;
  ChunkId theirs_from{};
  bool theirs_more = true;
  const auto next = [](ChunkId id) {
    return id.index == UINT32_MAX ? ChunkId{id.inode + 1, 0} : ChunkId{id.inode, id.index + 1};
  };
  // Chunks are copied kResyncCopies at a time (each a read here, a send
  // and a durable write there): one at a time leaves both disks idle
  // between them.
  std::mutex mu;
  std::condition_variable cv;
  size_t in_flight = 0;
  Status failed;
  asio::thread_pool copiers(kResyncCopies);  // last: joined first on an early return
  const auto copy = [&](ChunkId id, uint64_t bytes) {
    // Recovery's share of the disk and link (storage.service.recovery_bytes_per_second),
    // waited for before the chunk is held.
    std::this_thread::sleep_until(recovery_pacer_.reserve(bytes, std::chrono::steady_clock::now()));
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return in_flight < kResyncCopies; });
      if (!failed.ok()) return false;
      ++in_flight;
    }
    asio::post(copiers, [&, id] {
      Status s = syncChunk(p, id).withContext(
          fmt::format("resync of chain {} to target {}: {}", p.chain, p.successor, idText(id)));
      std::lock_guard lock(mu);
      --in_flight;
      if (!s.ok() && failed.ok()) failed = s;
      cv.notify_all();
    });
    return true;
  };
  uint64_t copied = 0;
  const auto started = std::chrono::steady_clock::now();
  for (;;) {
    if (stopped()) {
      copiers.join();
      return Status(ErrorCode::kCancelled, "resync stopped");
    }
    while (mi == mine.size() && mine_more) {
      ASSIGN_OR_RETURN(auto page, engine_.list(mine_from, kPage));
      mine_more = page.size() == kPage;
      if (!page.empty()) mine_from = next(page.back().first);
      mine.clear();
      mi = 0;
      for (auto& e : page) {
        if (e.second.chain == p.chain) mine.push_back(std::move(e));
      }
    }
    while (ti == theirs.size() && theirs_more) {
      ListReq req;
      req.mutable_from()->set_inode(theirs_from.inode);
      req.mutable_from()->set_index(theirs_from.index);
      req.set_limit(kPage);
      req.set_chain(p.chain);
      req.set_qos(QOS_BACKGROUND);
      ListResp resp;
      RETURN_ON_ERROR(peers_->callSync(to, kList(), req, &resp));
      theirs_more = resp.more();
      if (resp.has_last_seen()) theirs_from = next(idOf(resp.last_seen()));
      theirs.clear();
      ti = 0;
      for (const auto& c : resp.chunks()) {
        theirs.push_back({idOf(c.chunk()), c.info().chunk_version(), c.info().chain_version()});
      }
      if (theirs.empty() && !resp.has_last_seen()) theirs_more = false;
    }
    const bool have_mine = mi < mine.size(), have_theirs = ti < theirs.size();
    if (!have_mine && !have_theirs) break;
    ChunkId id;
    bool differ = true;
    uint64_t bytes = 0;  // what the copy sends (none for a removal)
    if (have_mine && (!have_theirs || mine[mi].first < theirs[ti].id)) {
      bytes = mine[mi].second.length;
      id = mine[mi++].first;  // theirs lacks it
    } else if (!have_mine || theirs[ti].id < mine[mi].first) {
      id = theirs[ti++].id;  // mine lacks it: removed there
    } else {
      id = mine[mi].first;
      bytes = mine[mi].second.length;
      differ = mine[mi].second.chunk_version != theirs[ti].version ||
               mine[mi].second.chain_version != theirs[ti].chain_version;
      ++mi;
      ++ti;
    }
    if (!differ) continue;
    if (!copy(id, bytes)) break;
    ++copied;
  }
  copiers.join();
  RETURN_ON_ERROR(failed);
  ForwardReq done;
  done.set_op(ForwardReq::SYNC_DONE);
  done.set_chain(p.chain);
  done.set_chain_version(p.version);
  ForwardResp resp;
  RETURN_ON_ERROR(peers_->callSync(to, kForward(), done, &resp));
  CLOG_INFO("storage", "chain {}: target {} synced ({} chunks copied or removed in {:.2f} s)",
            p.chain, p.successor, copied,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return Status::OK();
}

}  // namespace cistern::storage
