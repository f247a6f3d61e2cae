// libcistern's same-host paths: short-circuit reads from the servers'
// files (docs/client.md, "Short-circuit reads") and chunk bytes moved
// through shared memory lent to the servers ("Same-host reads and writes").
#include <fmt/format.h>

#include <asio/use_awaitable.hpp>

#include "client/chunk_io.h"
#include "client/client_impl.h"
#include "client/methods.h"
#include "common/fault.h"
#include "common/host.h"
#include "common/log.h"
#include "storage.pb.h"

namespace cistern::client {

namespace {

void addRange(storage::LocateReq* req, const meta::Inode& inode, const Piece& p) {
  auto* range = req->add_ranges();
  range->mutable_chunk()->set_inode(inode.ino());
  range->mutable_chunk()->set_index(p.index);
  range->set_offset(p.offset);
  range->set_length(p.length);
}

// Another host, turned off, an older server: through the server from now on.
bool refusesShortCircuit(const Status& s) {
  return s.code() == ErrorCode::kNotFound || s.code() == ErrorCode::kUnknownMethod;
}

// Ranges per Locate: the server's limit.
constexpr size_t kLocateRangesMax = 64;

}  // namespace

void ClientImpl::refuseShortCircuit(const net::Endpoint& server, const Status& why) {
  if (short_circuit_->refused(server)) return;
  short_circuit_->refuse(server);
  CLOG_INFO("client", "no short-circuit reads from {}: {}", server.toString(), why.toString());
}

void ClientImpl::locateAll(PendingIo& run) {
  run.located.assign(run.pieces.size(), nullptr);
  std::map<std::string, std::pair<net::Endpoint, std::vector<size_t>>> servers;
  for (size_t i = 0; i < run.pieces.size(); ++i) {
    auto r = route(run.pieces[i].chain);
    if (!r.ok() || short_circuit_->refused(r->endpoint)) continue;  // the piece finds out
    auto& [endpoint, pieces] = servers[r->endpoint.toString()];
    endpoint = r->endpoint;
    pieces.push_back(i);
  }
  for (auto& [name, server] : servers) {
    const auto& [endpoint, pieces] = server;
    for (size_t from = 0; from < pieces.size(); from += kLocateRangesMax) {
      const size_t to = std::min(pieces.size(), from + kLocateRangesMax);
      storage::LocateReq req;
      for (size_t k = from; k < to; ++k) addRange(&req, run.inode, run.pieces[pieces[k]]);
      req.set_boot_id(hostBootId());
      auto resp = std::make_unique<storage::LocateResp>();
      auto cap = capability(run.inode.ino(), /*write=*/false);
      if (!cap.ok()) break;  // each piece asks again, and reports
      Status s = rpc_->callSync(endpoint, kLocate(), req, resp.get(), {.credential = *cap});
      if (refusesShortCircuit(s)) refuseShortCircuit(endpoint, s);
      // Anything else wrong: each piece asks again, and retries or reports.
      if (!s.ok() || resp->ranges_size() != static_cast<int>(to - from)) break;
      for (size_t k = from; k < to; ++k)
        run.located[pieces[k]] = &resp->ranges(static_cast<int>(k - from));
      run.located_resps.push_back(std::move(resp));
    }
  }
}

std::optional<Status> ClientImpl::shortCircuitRead(const ChainRoute& r, const meta::Inode& inode,
                                                   Piece& p, const storage::LocatedRange* located) {
  auto refuse = [&](const Status& why) -> std::optional<Status> {
    refuseShortCircuit(r.endpoint, why);
    return std::nullopt;
  };
  storage::LocateResp resp;
  if (located == nullptr) {
    storage::LocateReq req;
    addRange(&req, inode, p);
    req.set_boot_id(hostBootId());
    ASSIGN_OR_RETURN(std::string cap, capability(inode.ino(), /*write=*/false));
    Status s = rpc_->callSync(r.endpoint, kLocate(), req, &resp, {.credential = cap});
    if (refusesShortCircuit(s)) return refuse(s);
    if (!s.ok()) return s;  // tried again (transient) or reported
    if (resp.ranges_size() != 1)
      return refuse(Status(ErrorCode::kBadMessage, "a Locate answer without one range"));
    located = &resp.ranges(0);
  }
  const auto& loc = *located;
  Status s;
  size_t got = 0;
  if (loc.code() == static_cast<uint32_t>(ErrorCode::kNotFound)) {
    got = 0;  // a chunk never written: zeros
  } else if (loc.code() != 0) {
    return Status(static_cast<ErrorCode>(loc.code()), "");
  } else {
    RETURN_ON_ERROR(CISTERN_FAULT("client.short_circuit.read"));  // the piece fails
    s = short_circuit_->read(loc, p.offset, p.length, p.data, &got);
    if (s.code() == ErrorCode::kNotSupported) return refuse(s);
    if (!s.ok()) {
      // The slot changed since the Locate (or the disk is bad, which the
      // server will say): through the server this time.
      static auto& fallbacks = metrics::Registry::global().counter(
          "client_short_circuit_fallbacks_total", {},
          "Short-circuit reads whose bytes failed their CRCs, read again through the server");
      fallbacks.inc();
      CLOG_DEBUG("client", "short-circuit read of {}: {}", pieceName(false, inode, p),
                 s.toString());
      return std::nullopt;
    }
  }
  if (got < p.length) std::memset(p.data + got, 0, p.length - got);
  readBytes("short_circuit").inc(got);
  return Status::OK();
}

bool ClientImpl::shortCircuits(const std::vector<Piece>& pieces) {
  if (!short_circuit_) return false;
  for (const Piece& p : pieces) {
    auto r = route(p.chain);
    if (!r.ok() || r->replicated() || short_circuit_->refused(r->endpoint) ||
        rpc_->callsLocally(r->endpoint, kBatchRead()))
      return false;
  }
  return true;
}

asio::awaitable<uint64_t> ClientImpl::shmHandle(const ChainRoute& r) {
  uint64_t handle = shm_->handleFor(r.endpoint);
  if (handle == ShmSlots::kRefused || handle == ShmSlots::kAttaching) co_return 0;
  if (handle == ShmSlots::kNotTried) {
    storage::ShmAttachReq req;
    shm_->fillAttach(&req);
    storage::ShmAttachResp resp;
    Status s = co_await rpc_->call(r.endpoint, kShmAttach(), req, &resp);
    if (!s.ok()) {
      // Unreachable or busy now: try again on a later call. Anything else (another
      // host, an older server): the socket from now on.
      bool later = transient(s);
      shm_->setHandle(r.endpoint, later ? ShmSlots::kNotTried : ShmSlots::kRefused);
      if (!later)
        CLOG_INFO("client", "no shared memory with {}: {}", r.endpoint.toString(), s.toString());
      co_return 0;
    }
    handle = resp.handle();
    shm_->setHandle(r.endpoint, handle);
  }
  co_return handle;
}

asio::awaitable<std::optional<Status>> ClientImpl::shmWrite(const ChainRoute& r,
                                                            const meta::Inode& inode, Piece& p) {
  if (p.length > shm_->slotBytes()) co_return std::nullopt;
  uint64_t handle = co_await shmHandle(r);
  if (handle == 0) co_return std::nullopt;
  int slot = shm_->take();
  if (slot < 0) co_return std::nullopt;
  std::memcpy(shm_->data(slot), p.data, p.length);
  storage::WriteReq req;
  req.mutable_chunk()->set_inode(inode.ino());
  req.mutable_chunk()->set_index(p.index);
  req.set_offset(p.offset);
  req.set_chain_version(r.version);
  req.set_chain(p.chain);
  req.set_shm_handle(handle);
  req.set_shm_offset(shm_->offset(slot));
  req.set_shm_length(p.length);
  req.set_not_after_unix_ns(attemptFence());
  req.set_unsynced(!options_.sync_each_write);
  storage::WriteResp resp;
  std::string cap;
  Status s = capabilityInto(inode.ino(), /*write=*/true, &cap);
  if (s.ok()) {
    net::CallOptions o;
    o.credential = cap;
    s = co_await rpc_->call(r.endpoint, kWrite(), req, &resp, o);
  }
  // Ended before the server answered: it may still be reading the slot.
  shm_->give(slot, !endedUnanswered(s));
  if (s.ok()) {
    writeBytes("shm").inc(p.length);
    noteWritten(p.chain, resp);
  }
  if (s.code() == ErrorCode::kNotFound) {
    // The server dropped our memory (restarted, or made room): over the
    // socket this time, attached anew next time.
    shm_->dropHandle(r.endpoint, handle);
    co_return std::nullopt;
  }
  co_return s;
}

asio::awaitable<std::optional<Status>> ClientImpl::shmRead(const ChainRoute& r,
                                                           const meta::Inode& inode, Piece& p) {
  uint64_t handle = co_await shmHandle(r);
  if (handle == 0) co_return std::nullopt;
  // Straight into the caller's buffer when it lies in a read-ahead window of
  // our memory; else a slot at a time, copied out.
  const std::optional<uint64_t> direct = shm_->windowOffset(p.data, p.length);
  int slot = -1;
  if (!direct) {
    slot = shm_->take();
    if (slot < 0) co_return std::nullopt;
  }
  const uint32_t step = direct ? p.length : shm_->slotBytes();
  Status s;
  bool clean = true;
  for (uint32_t done = 0; done < p.length;) {
    uint32_t n = std::min(p.length - done, step);
    storage::BatchReadReq req;
    auto* range = req.add_ranges();
    range->mutable_chunk()->set_inode(inode.ino());
    range->mutable_chunk()->set_index(p.index);
    range->set_offset(p.offset + done);
    range->set_length(n);
    range->set_chain(p.chain);
    range->set_chain_version(r.version);
    req.set_shm_handle(handle);
    req.set_shm_offset(direct ? *direct + done : shm_->offset(slot));
    storage::BatchReadResp resp;
    std::string cap;
    s = capabilityInto(inode.ino(), /*write=*/false, &cap);
    if (s.ok()) {
      net::CallOptions o;
      o.credential = cap;
      s = co_await rpc_->call(r.endpoint, kBatchRead(), req, &resp, o);
    }
    if (!s.ok()) {
      // Ended before the server answered: it may still write into the slot.
      clean = !endedUnanswered(s);
      break;
    }
    size_t got = resp.lengths_size() > 0 ? std::min(resp.lengths(0), n) : 0;
    s = rangeStatus(resp, &got);
    if (!s.ok()) break;
    if (direct) {
      static auto& windowed = metrics::Registry::global().counter(
          "client_shm_window_read_bytes_total", {},
          "Chunk bytes servers read straight into the client's windows (no copy)");
      windowed.inc(got);
    } else {
      std::memcpy(p.data + done, shm_->data(slot), got);
    }
    readBytes("shm").inc(got);
    if (got < n) {
      // The chunk ends here: the rest of the piece reads as zeros.
      std::memset(p.data + done + got, 0, p.length - done - got);
      break;
    }
    done += n;
  }
  if (direct) {
    // The server may still write into the window: its holder must not trust it.
    if (!clean) shm_->poisonWindow(p.data);
  } else {
    shm_->give(slot, clean);
  }
  if (s.code() == ErrorCode::kNotFound) {
    // The server dropped our memory (restarted, or made room): attach again.
    shm_->dropHandle(r.endpoint, handle);
    co_return std::nullopt;
  }
  co_return s;
}

}  // namespace cistern::client
