// libcistern's chunk calls besides reads and writes: moving an inline
// file's bytes to chunk 0, cutting chunks for a truncate, syncing what this
// client wrote, and the fences that keep late calls from landing.
#include <fmt/format.h>

#include "client/chunk_io.h"
#include "client/client_impl.h"
#include "client/methods.h"
#include "client/remote_chunk_remover.h"
#include "common/fault.h"
#include "common/host.h"
#include "common/log.h"
#include "storage.pb.h"

namespace cistern::client {

Status ClientImpl::moveInlineBytes(const meta::Inode& inode, const std::string& bytes,
                                   int64_t not_after_ns) {
  const auto& layout = inode.layout();
  if (layout.chunk_size() == 0 || layout.chains_size() == 0)
    return Status(ErrorCode::kCorruption, fmt::format("inode {} has no layout", inode.ino()));
  storage::ChunkRef chunk;
  chunk.set_inode(inode.ino());
  chunk.set_index(0);
  const auto fence = static_cast<uint64_t>(not_after_ns);
  // A converter that stalls here (a paused process, a slow network) is what
  // the fence is for: LocalClient.AConversionStalledPastItsLeaseCannotPutOldBytesBack.
  // Each attempt also stops at its own end (attemptFence), as every chunk
  // write does: one given up on inside the lease cannot put these bytes back
  // over the writes that follow the conversion.
  RETURN_ON_ERROR(CISTERN_FAULT("client.inline.before_move"));
  ASSIGN_OR_RETURN(const std::string cap, capability(inode.ino(), /*write=*/true));
  auto retried = [&](const auto& once) {
    return retryBlocking(layout.chains(0), once,
                         [&] { return fmt::format("chunk {}:0", inode.ino()); });
  };
  if (bytes.empty()) {
    // Nothing to keep; an earlier, unfinished conversion may have left a chunk.
    return retried([&](const ChainRoute& r) -> Status {
      storage::RemoveReq req;
      *req.add_chunks() = chunk;
      req.set_chain(layout.chains(0));
      req.set_chain_version(r.version);
      req.set_not_after_unix_ns(blockingFence(r.endpoint, kRemove(), fence));
      storage::RemoveResp resp;
      RETURN_ON_ERROR(rpc_->callSync(r.endpoint, kRemove(), req, &resp, {.credential = cap}));
      auto code = resp.codes_size() == 1 ? static_cast<ErrorCode>(resp.codes(0)) : ErrorCode::kOk;
      return code == ErrorCode::kOk ? Status::OK() : Status(code, "remove");
    });
  }
  const uint64_t update_seq = next_update_seq_.fetch_add(1);
  RETURN_ON_ERROR(retried([&](const ChainRoute& r) {
    storage::WriteReq req;
    *req.mutable_chunk() = chunk;
    req.set_chain_version(r.version);
    req.set_chain(layout.chains(0));
    req.set_update_client(update_client_);
    req.set_update_seq(update_seq);
    req.set_not_after_unix_ns(blockingFence(r.endpoint, kWrite(), fence));
    storage::WriteResp resp;
    net::CallOptions options;
    options.request_payload =
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    options.credential = cap;
    return rpc_->callSync(r.endpoint, kWrite(), req, &resp, options);
  }));
  // Cut to the bytes' length: nothing longer that an earlier, unfinished
  // conversion left there shows through.
  return truncateChunk(inode, 0, bytes.size(), fence);
}

Status ClientImpl::truncateChunk(const meta::Inode& inode, uint64_t index, uint64_t length,
                                 uint64_t fence) {
  ASSIGN_OR_RETURN(const std::string cap, capability(inode.ino(), /*write=*/true));
  return retryBlocking(
      chainOf(inode.layout(), index),
      [&](const ChainRoute& r) {
        storage::TruncateReq req;
        req.mutable_chunk()->set_inode(inode.ino());
        req.mutable_chunk()->set_index(static_cast<uint32_t>(index));
        req.set_length(length);
        req.set_chain_version(r.version);
        req.set_chain(chainOf(inode.layout(), index));
        req.set_not_after_unix_ns(blockingFence(r.endpoint, kTruncate(), fence));
        storage::TruncateResp resp;
        return rpc_->callSync(r.endpoint, kTruncate(), req, &resp, {.credential = cap});
      },
      [&] { return fmt::format("truncate chunk {}:{}", inode.ino(), index); },
      /*fenced=*/fence == 0);
}

void ClientImpl::noteWritten(uint32_t chain, const storage::WriteResp& resp) {
  const std::string& boot = resp.host_boot_id();
  if (boot.empty()) return;  // durable already
  std::lock_guard lock(unsynced_mu_);
  UnsyncedChain& u = unsynced_[chain];
  if (u.host_boot_id != boot) {
    // The host booted with writes not yet synced: they may be gone.
    if (u.written > u.synced) u.lost = true;
    u.host_boot_id = boot;
  }
  ++u.written;
}

Status ClientImpl::syncWrites() {
  struct Todo {
    uint32_t chain;
    std::string host_boot_id;
    uint64_t written;
    bool lost;
  };
  std::vector<Todo> todo;
  {
    std::lock_guard lock(unsynced_mu_);
    for (auto& [chain, u] : unsynced_) {
      if (u.written > u.synced || u.lost)
        todo.push_back({chain, u.host_boot_id, u.written, u.lost});
      u.lost = false;
    }
  }
  Status first;
  for (const Todo& t : todo) {
    Status s;
    if (t.lost) {
      s = Status(ErrorCode::kIOError,
                 fmt::format("chain {}: its target's host booted before writes to it were synced; "
                             "they may never have reached the disk",
                             t.chain));
    } else {
      s = retryBlocking(
          t.chain,
          [&](const ChainRoute& r) {
            storage::SyncReq req;
            req.set_host_boot_id(t.host_boot_id);
            storage::SyncResp resp;
            return rpc_->callSync(r.endpoint, kSync(), req, &resp);
          },
          [&] { return fmt::format("sync chain {}", t.chain); });
    }
    if (s.ok()) {
      static auto& syncs = metrics::Registry::global().counter(
          "client_syncs_total", {}, "Syncs of storage targets this client wrote to unsynced");
      syncs.inc();
      std::lock_guard lock(unsynced_mu_);
      UnsyncedChain& u = unsynced_[t.chain];
      u.synced = std::max(u.synced, t.written);
    } else if (first.ok()) {
      first = s;
    }
  }
  return first;
}

uint64_t ClientImpl::attemptFence() const {
  const int64_t timeout_ns = int64_t{options_.call_timeout_ms} * 1'000'000;
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  return static_cast<uint64_t>(now_ns + timeout_ns - std::min(kClockSkewNs, timeout_ns / 4));
}

uint64_t ClientImpl::blockingFence(const net::Endpoint& to, const net::Method& method,
                                   uint64_t lease) const {
  if (rpc_->callsLocally(to, method)) return lease;
  const uint64_t own = attemptFence();
  return lease == 0 ? own : std::min(lease, own);
}

Status ClientImpl::cutData(const meta::Inode& inode, uint64_t new_size) {
  const auto& layout = inode.layout();
  uint64_t chunk = layout.chunk_size();
  if (inode.type() != meta::REGULAR || inode.data_inline() || chunk == 0 ||
      layout.chains_size() == 0) {
    return Status::OK();
  }
  ASSIGN_OR_RETURN(std::string cap, capability(inode.ino(), /*write=*/true));
  // The chunks wholly past the new end first, so that a cut stopped part way
  // leaves the file's bytes before some point, zeros after it.
  RemoteChunkRemover remover(
      *rpc_,
      [this](uint32_t chain) -> Result<net::Endpoint> {
        ASSIGN_OR_RETURN(auto r, route(chain));
        return r.endpoint;
      },
      {.fence = [this](const net::Endpoint& to) { return blockingFence(to, kRemove()); },
       .foreground = true,
       .chain_version = [this](uint32_t chain) -> uint64_t {
         auto r = route(chain);
         return r.ok() ? r->version : 0;
       },
       .refresh = [this] { (void)refreshRouting(); },
       .credential = std::move(cap)});
  RETURN_ON_ERROR(remover.removeFrom(inode.ino(), layout, (new_size + chunk - 1) / chunk));
  if (new_size % chunk != 0)
    RETURN_ON_ERROR(truncateChunk(inode, new_size / chunk, new_size % chunk, /*fence=*/0));
  // A client that stops here (it died, meta is unreachable) leaves the file at
  // its old size reading zeros from new_size on: what truncating and growing
  // it again would give, never an old byte past the new end.
  return CISTERN_FAULT("client.truncate.before_commit");
}

}  // namespace cistern::client
