// libcistern chunk I/O: a read or write is cut into one piece per chunk;
// the pieces run as coroutines on the driver thread, at most
// io_parallel_max at once, each retried on transient errors with backoff.
// A call of one small piece runs on the caller's thread instead.
#include <fmt/format.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <condition_variable>
#include <cstring>
#include <thread>

#include "client/client_impl.h"
#include "client/remote_chunk_remover.h"
#include "common/fault.h"
#include "common/host.h"
#include "common/log.h"
#include "common/metrics.h"
#include "storage.pb.h"

namespace cistern::client {

namespace {

using Clock = std::chrono::steady_clock;

const net::Method& kWrite() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Write");
  return m;
}
const net::Method& kBatchRead() {
  static const auto m = net::Method::of("cistern.storage.StorageService.BatchRead");
  return m;
}
const net::Method& kShmAttach() {
  static const auto m = net::Method::of("cistern.storage.StorageService.ShmAttach");
  return m;
}
const net::Method& kLocate() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Locate");
  return m;
}
const net::Method& kSync() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Sync");
  return m;
}
const net::Method& kTruncate() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Truncate");
  return m;
}
const net::Method& kRemove() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Remove");
  return m;
}

// The chain that holds chunk `index` of a file laid out so.
uint32_t chainOf(const meta::Layout& layout, uint64_t index) {
  return layout.chains(static_cast<int>(index % static_cast<uint64_t>(layout.chains_size())));
}

// Chunk bytes read or written, by the way they went: "shm" (same-host
// shared memory), "socket", "local" (a call to a server of this process,
// on the caller's buffer: net/local_call.h), or "short_circuit" (read from
// the server's files by this process).
metrics::Counter& readBytes(const char* path) {
  return metrics::Registry::global().counter("client_read_bytes_total", {{"path", path}},
                                             "Chunk bytes read from storage servers");
}
metrics::Counter& writeBytes(const char* path) {
  return metrics::Registry::global().counter("client_write_bytes_total", {{"path", path}},
                                             "Chunk bytes written to storage servers");
}

bool retryable(const Status& s) {
  return transient(s) || s.code() == ErrorCode::kStaleChainVersion;
}

// The call ended before its server answered: the server may still be using
// the shared memory it named.
bool endedUnanswered(const Status& s) {
  return s.code() == ErrorCode::kDeadlineExceeded || s.code() == ErrorCode::kCancelled ||
         s.code() == ErrorCode::kConnectionClosed || s.code() == ErrorCode::kBadFrame;
}

// A worker's next piece, or null when none is left.
Piece* nextPiece(PendingIo* run) {
  size_t i = run->next.fetch_add(1);
  return i < run->pieces.size() ? &run->pieces[i] : nullptr;
}

// A piece failed: the first error is the call's, and no more pieces start.
void pieceFailed(PendingIo* run, const Status& s) {
  std::lock_guard lock(run->mu);
  if (run->error.ok()) run->error = s;
  run->next.store(run->pieces.size());
}

// A piece ended: done (PendingIo::waitRange), or the call's first error.
void pieceEnded(PendingIo* run, const Piece* p, const Status& s) {
  if (!s.ok()) {
    pieceFailed(run, s);
    return;
  }
  std::lock_guard lock(run->mu);
  run->done[static_cast<size_t>(p - run->pieces.data())] = 1;
  run->cv.notify_all();
}

void workerDone(PendingIo* run) {
  std::lock_guard lock(run->mu);
  if (--run->running == 0) run->cv.notify_all();
}

asio::awaitable<void> pieceWorker(PendingIo* run) {
  while (Piece* p = nextPiece(run)) {
    Status s = co_await run->client->runPiece(run->write, run->inode, *p);
    pieceEnded(run, p, s);
  }
  workerDone(run);
}

// pieceWorker() for pieces served by this process, on a thread that may block.
void blockingPieceWorker(PendingIo* run) {
  while (Piece* p = nextPiece(run)) {
    Status s = run->client->runPieceBlocking(run->write, run->inode, *p);
    pieceEnded(run, p, s);
  }
  workerDone(run);
}

// pieceWorker() for read pieces served short-circuit, on a thread that may block.
void shortCircuitWorker(PendingIo* run) {
  while (Piece* p = nextPiece(run)) {
    const size_t i = static_cast<size_t>(p - run->pieces.data());
    Status s = run->client->runPieceShortCircuit(
        run->inode, *p, i < run->located.size() ? run->located[i] : nullptr);
    pieceEnded(run, p, s);
  }
  workerDone(run);
}

// The status of a one-range BatchRead's range: a hole (a chunk never
// written) is no error and reads as zero bytes got.
Status rangeStatus(const storage::BatchReadResp& resp, size_t* got) {
  auto code = resp.codes_size() > 0 ? static_cast<ErrorCode>(resp.codes(0)) : ErrorCode::kOk;
  if (code == ErrorCode::kNotFound) {
    *got = 0;
  } else if (code != ErrorCode::kOk) {
    return Status(code, "");
  }
  return Status::OK();
}

}  // namespace

// One piece's request and answer over the socket, for either path: the
// driver's coroutines and blocking callers.
class ClientImpl::SocketPiece {
 public:
  // `fence`: a write's not_after_unix_ns (ClientImpl::attemptFence).
  SocketPiece(ClientImpl& client, bool write, const meta::Inode& inode, Piece& p,
              const ChainRoute& r, uint64_t fence)
      : client_(client), write_(write), p_(p) {
    options_.ran_locally = &local_;
    if (write) {
      write_req_.mutable_chunk()->set_inode(inode.ino());
      write_req_.mutable_chunk()->set_index(p.index);
      write_req_.set_offset(p.offset);
      write_req_.set_chain_version(r.version);
      write_req_.set_not_after_unix_ns(fence);
      write_req_.set_unsynced(!client.options_.sync_each_write);
      options_.request_payload = std::span<const uint8_t>(p.data, p.length);
    } else {
      auto* range = read_req_.add_ranges();
      range->mutable_chunk()->set_inode(inode.ino());
      range->mutable_chunk()->set_index(p.index);
      range->set_offset(p.offset);
      range->set_length(p.length);
      options_.response_payload = std::span<uint8_t>(p.data, p.length);
      options_.response_payload_len = &got_;
    }
  }
  SocketPiece(const SocketPiece&) = delete;  // options_ points into it
  SocketPiece& operator=(const SocketPiece&) = delete;
  const net::Method& method() const { return write_ ? kWrite() : kBatchRead(); }
  const google::protobuf::Message& request() const {
    return write_ ? static_cast<const google::protobuf::Message&>(write_req_) : read_req_;
  }
  google::protobuf::Message* response() {
    return write_ ? static_cast<google::protobuf::Message*>(&write_resp_) : &read_resp_;
  }
  const net::CallOptions& options() const { return options_; }

  // The call's status, with a read's per-range code applied: a hole or a
  // short chunk reads as zeros.
  Status finish(Status s) {
    if (!s.ok()) return s;
    const char* path = local_ ? "local" : "socket";
    if (write_) {
      writeBytes(path).inc(p_.length);
      client_.noteWritten(p_.chain, write_resp_);
      return s;
    }
    RETURN_ON_ERROR(rangeStatus(read_resp_, &got_));
    if (got_ < p_.length) std::memset(p_.data + got_, 0, p_.length - got_);
    readBytes(path).inc(got_);
    return s;
  }

 private:
  ClientImpl& client_;
  bool write_;
  Piece& p_;
  storage::WriteReq write_req_;
  storage::WriteResp write_resp_;
  storage::BatchReadReq read_req_;
  storage::BatchReadResp read_resp_;
  size_t got_ = 0;
  bool local_ = false;  // callSync() ran it as a local call
  net::CallOptions options_;
};

std::string ClientImpl::pieceName(bool write, const meta::Inode& inode, const Piece& p) {
  return fmt::format("{} chunk {}:{} on chain {}", write ? "write" : "read", inode.ino(), p.index,
                     p.chain);
}

std::optional<Status> ClientImpl::giveUp(const Status& s, Clock::time_point deadline,
                                         Clock::duration backoff, bool fenced) {
  const bool again = retryable(s) || (fenced && s.code() == ErrorCode::kLeaseExpired);
  if (!again || Clock::now() + backoff > deadline) return s;
  if (s.code() == ErrorCode::kStaleChainVersion) {
    Status refreshed = refreshRouting();  // blocking (on the driver thread too): rare
    if (!refreshed.ok()) return refreshed;
  }
  return std::nullopt;
}

asio::awaitable<Status> ClientImpl::runPiece(bool write, const meta::Inode& inode, Piece& p) {
  auto deadline = Clock::now() + std::chrono::milliseconds(options_.retry_ms);
  std::chrono::milliseconds backoff(5);
  for (;;) {
    Status s;
    auto r = route(p.chain);
    if (!r.ok()) co_return r.status().withContext(pieceName(write, inode, p));
    // (Not a co_await inside a conditional expression: GCC 12 destroys its
    // temporaries twice.)
    std::optional<Status> via;
    if (shm_ && write) via = co_await shmWrite(*r, inode, p);
    if (shm_ && !write) via = co_await shmRead(*r, inode, p);
    if (via) {
      s = *via;
    } else {
      SocketPiece call(*this, write, inode, p, *r, write ? attemptFence() : 0);
      s = co_await rpc_->call(r->endpoint, call.method(), call.request(), call.response(),
                              call.options());
      s = call.finish(std::move(s));
    }
    if (s.ok()) co_return s;
    if (auto end = giveUp(s, deadline, backoff, /*fenced=*/write))
      co_return end->withContext(pieceName(write, inode, p));
    asio::steady_timer timer(co_await asio::this_coro::executor, backoff);
    co_await timer.async_wait(asio::use_awaitable);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

template <typename Once, typename What>
Status ClientImpl::retryBlocking(uint32_t chain, const Once& once, const What& what, bool fenced) {
  auto deadline = Clock::now() + std::chrono::milliseconds(options_.retry_ms);
  std::chrono::milliseconds backoff(5);
  for (;;) {
    auto r = route(chain);
    if (!r.ok()) return r.status().withContext(what());
    Status s = once(*r);
    if (s.ok()) return s;
    if (auto end = giveUp(s, deadline, backoff, fenced)) return end->withContext(what());
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

Status ClientImpl::runPieceBlocking(bool write, const meta::Inode& inode, Piece& p) {
  return retryBlocking(
      p.chain,
      [&](const ChainRoute& r) {
        SocketPiece call(*this, write, inode, p, r,
                         write ? blockingFence(r.endpoint, kWrite()) : 0);
        return call.finish(rpc_->callSync(r.endpoint, call.method(), call.request(),
                                          call.response(), call.options()));
      },
      [&] { return pieceName(write, inode, p); }, /*fenced=*/write);
}

Status ClientImpl::runPieceShortCircuit(const meta::Inode& inode, Piece& p,
                                        const storage::LocatedRange* located) {
  return retryBlocking(
      p.chain,
      [&](const ChainRoute& r) {
        if (!short_circuit_->refused(r.endpoint)) {
          // The answer located in advance serves the first attempt only.
          if (auto s = shortCircuitRead(r, inode, p, std::exchange(located, nullptr))) return *s;
        }
        SocketPiece call(*this, false, inode, p, r, 0);
        return call.finish(rpc_->callSync(r.endpoint, call.method(), call.request(),
                                          call.response(), call.options()));
      },
      [&] { return pieceName(false, inode, p); });
}

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
      Status s = rpc_->callSync(endpoint, kLocate(), req, resp.get());
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
    Status s = rpc_->callSync(r.endpoint, kLocate(), req, &resp);
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
    if (!r.ok() || short_circuit_->refused(r->endpoint) ||
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
  req.set_shm_handle(handle);
  req.set_shm_offset(shm_->offset(slot));
  req.set_shm_length(p.length);
  req.set_not_after_unix_ns(attemptFence());
  req.set_unsynced(!options_.sync_each_write);
  storage::WriteResp resp;
  Status s = co_await rpc_->call(r.endpoint, kWrite(), req, &resp);
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
    req.set_shm_handle(handle);
    req.set_shm_offset(direct ? *direct + done : shm_->offset(slot));
    storage::BatchReadResp resp;
    s = co_await rpc_->call(r.endpoint, kBatchRead(), req, &resp);
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

std::vector<Piece> ClientImpl::cut(const meta::Inode& inode, uint64_t offset, size_t n,
                                   uint8_t* data) const {
  std::vector<Piece> pieces;
  const auto& layout = inode.layout();
  uint64_t chunk = layout.chunk_size();
  if (chunk == 0 || layout.chains_size() == 0) return pieces;
  uint64_t end = offset + n;
  for (uint64_t at = offset; at < end;) {
    uint64_t index = at / chunk;
    uint64_t in_chunk = at % chunk;
    uint64_t len = std::min(end - at, chunk - in_chunk);
    Piece p;
    p.index = static_cast<uint32_t>(index);
    p.chain = chainOf(layout, index);
    p.offset = static_cast<uint32_t>(in_chunk);
    p.length = static_cast<uint32_t>(len);
    p.data = data + (at - offset);
    pieces.push_back(p);
    at += len;
  }
  return pieces;
}

Status PendingIo::wait() {
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return running == 0; });
  return error;
}

bool PendingIo::waitRange(const uint8_t* p, size_t n) {
  std::unique_lock lock(mu);
  auto read = [&] {
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& q = pieces[i];
      if (q.data + q.length <= p || q.data >= p + n) continue;
      if (!done[i]) return false;
    }
    return true;
  };
  cv.wait(lock, [&] { return running == 0 || read(); });
  return read();
}

bool PendingIo::finished() {
  std::lock_guard lock(mu);
  return running == 0;
}

PendingIo::~PendingIo() { (void)wait(); }

std::unique_ptr<PendingIo> ClientImpl::start(bool write, const meta::Inode& inode,
                                             std::vector<Piece> pieces) {
  auto run = std::make_unique<PendingIo>();
  run->client = this;
  run->write = write;
  run->inode = inode;
  run->pieces = std::move(pieces);
  run->done.assign(run->pieces.size(), 0);
  size_t workers = std::min<size_t>(options_.io_parallel_max, run->pieces.size());
  run->running = workers;
  // Pieces whose servers are all in this process run as blocking local calls
  // on a pool of their own (no sockets, no shared-memory slots, each piece
  // straight between its buffer and the engine); else as coroutines on the
  // driver thread.
  bool local = true;
  for (const Piece& p : run->pieces) {
    if (!servedHere(write, p.chain)) {
      local = false;
      break;
    }
  }
  // Read pieces from servers on this host that let us read their files:
  // blocking workers on that pool too (a pread each, no event loop), once
  // one Locate per server said where all of them lie.
  if (!write && !local && shortCircuits(run->pieces)) {
    asio::post(localPool(), [run = run.get(), workers] {
      run->client->locateAll(*run);
      for (size_t i = 1; i < workers; ++i)
        asio::post(run->client->localPool(), [run] { shortCircuitWorker(run); });
      shortCircuitWorker(run);
    });
    return run;
  }
  for (size_t i = 0; i < workers; ++i) {
    if (local) {
      asio::post(localPool(), [run = run.get()] { blockingPieceWorker(run); });
    } else {
      asio::co_spawn(*driver_, pieceWorker(run.get()), asio::detached);
    }
  }
  return run;
}

asio::thread_pool& ClientImpl::localPool() {
  std::call_once(local_pool_once_, [&] {
    local_pool_ =
        std::make_unique<asio::thread_pool>(std::max<uint32_t>(options_.io_parallel_max, 1));
  });
  return *local_pool_;
}

bool ClientImpl::servedHere(bool write, uint32_t chain) {
  auto r = route(chain);
  return r.ok() && rpc_->callsLocally(r->endpoint, write ? kWrite() : kBatchRead());
}

Status ClientImpl::runPieces(bool write, const meta::Inode& inode, std::vector<Piece>& pieces) {
  if (pieces.empty()) return Status::OK();
  // One small piece: a blocking call from this thread, over the socket,
  // spares two hand-offs (to the driver thread and back) that cost more
  // than the bytes' copy through the socket. One piece of any size when its
  // server is in this process: the call runs right here, on our buffer.
  if (pieces.size() == 1 &&
      (pieces[0].length <= kBlockingPieceMax || servedHere(write, pieces[0].chain)))
    return runPieceBlocking(write, inode, pieces[0]);
  return start(write, inode, std::move(pieces))->wait();
}

std::unique_ptr<PendingIo> ClientImpl::startRead(const meta::Inode& inode, uint64_t offset,
                                                 size_t n, uint8_t* out) {
  return start(false, inode, cut(inode, offset, n, out));
}

std::unique_ptr<PendingIo> ClientImpl::startWrite(const meta::Inode& inode, uint64_t offset,
                                                  size_t n, const uint8_t* in) {
  // Pieces only read from `in` when writing.
  return start(true, inode, cut(inode, offset, n, const_cast<uint8_t*>(in)));
}

Status ClientImpl::readData(const meta::Inode& inode, uint64_t offset, size_t n, uint8_t* out) {
  if (inode.layout().chunk_size() == 0)
    return Status(ErrorCode::kCorruption, fmt::format("inode {} has no layout", inode.ino()));
  auto pieces = cut(inode, offset, n, out);
  return runPieces(false, inode, pieces);
}

Status ClientImpl::writeData(const meta::Inode& inode, uint64_t offset, size_t n,
                             const uint8_t* in) {
  if (inode.layout().chunk_size() == 0 || inode.layout().chains_size() == 0)
    return Status(ErrorCode::kCorruption, fmt::format("inode {} has no layout", inode.ino()));
  // Pieces only read from `data` when writing.
  auto pieces = cut(inode, offset, n, const_cast<uint8_t*>(in));
  return runPieces(true, inode, pieces);
}

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
  auto retried = [&](const auto& once) {
    return retryBlocking(layout.chains(0), once,
                         [&] { return fmt::format("chunk {}:0", inode.ino()); });
  };
  if (bytes.empty()) {
    // Nothing to keep; an earlier, unfinished conversion may have left a chunk.
    return retried([&](const ChainRoute& r) -> Status {
      storage::RemoveReq req;
      *req.add_chunks() = chunk;
      req.set_not_after_unix_ns(blockingFence(r.endpoint, kRemove(), fence));
      storage::RemoveResp resp;
      RETURN_ON_ERROR(rpc_->callSync(r.endpoint, kRemove(), req, &resp));
      auto code = resp.codes_size() == 1 ? static_cast<ErrorCode>(resp.codes(0)) : ErrorCode::kOk;
      return code == ErrorCode::kOk ? Status::OK() : Status(code, "remove");
    });
  }
  RETURN_ON_ERROR(retried([&](const ChainRoute& r) {
    storage::WriteReq req;
    *req.mutable_chunk() = chunk;
    req.set_chain_version(r.version);
    req.set_not_after_unix_ns(blockingFence(r.endpoint, kWrite(), fence));
    storage::WriteResp resp;
    net::CallOptions options;
    options.request_payload =
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    return rpc_->callSync(r.endpoint, kWrite(), req, &resp, options);
  }));
  // Cut to the bytes' length: nothing longer that an earlier, unfinished
  // conversion left there shows through.
  return truncateChunk(inode, 0, bytes.size(), fence);
}

Status ClientImpl::truncateChunk(const meta::Inode& inode, uint64_t index, uint64_t length,
                                 uint64_t fence) {
  return retryBlocking(
      chainOf(inode.layout(), index),
      [&](const ChainRoute& r) {
        storage::TruncateReq req;
        req.mutable_chunk()->set_inode(inode.ino());
        req.mutable_chunk()->set_index(static_cast<uint32_t>(index));
        req.set_length(length);
        req.set_chain_version(r.version);
        req.set_not_after_unix_ns(blockingFence(r.endpoint, kTruncate(), fence));
        storage::TruncateResp resp;
        return rpc_->callSync(r.endpoint, kTruncate(), req, &resp);
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
  // The chunks wholly past the new end first, so that a cut stopped part way
  // leaves the file's bytes before some point, zeros after it.
  RemoteChunkRemover remover(
      *rpc_,
      [this](uint32_t chain) -> Result<net::Endpoint> {
        ASSIGN_OR_RETURN(auto r, route(chain));
        return r.endpoint;
      },
      {.fence = [this](const net::Endpoint& to) { return blockingFence(to, kRemove()); },
       .foreground = true});
  RETURN_ON_ERROR(remover.removeFrom(inode.ino(), layout, (new_size + chunk - 1) / chunk));
  if (new_size % chunk != 0)
    RETURN_ON_ERROR(truncateChunk(inode, new_size / chunk, new_size % chunk, /*fence=*/0));
  // A client that stops here (it died, meta is unreachable) leaves the file at
  // its old size reading zeros from new_size on: what truncating and growing
  // it again would give, never an old byte past the new end.
  return CISTERN_FAULT("client.truncate.before_commit");
}

}  // namespace cistern::client
