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

#include "client/chunk_io.h"
#include "client/client_impl.h"
#include "client/methods.h"
#include "common/fault.h"
#include "common/host.h"
#include "common/log.h"
#include "common/metrics.h"
#include "storage.pb.h"

namespace cistern::client {

namespace {

using Clock = std::chrono::steady_clock;

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

// A read piece as a BatchRead range, routed with chain `version`.
void fillReadRange(storage::ReadRange* range, const meta::Inode& inode, const Piece& p,
                   uint64_t version) {
  range->mutable_chunk()->set_inode(inode.ino());
  range->mutable_chunk()->set_index(p.index);
  range->set_offset(p.offset);
  range->set_length(p.length);
  range->set_chain(p.chain);
  range->set_chain_version(version);
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

}  // namespace

// One piece's request and answer over the socket, for either path: the
// driver's coroutines and blocking callers.
class ClientImpl::SocketPiece {
 public:
  // `fence`: a write's not_after_unix_ns (ClientImpl::attemptFence).
  // `credential`: the file's capability (ClientImpl::capability).
  SocketPiece(ClientImpl& client, bool write, const meta::Inode& inode, Piece& p,
              const ChainRoute& r, uint64_t fence, std::string credential)
      : client_(client), write_(write), p_(p), credential_(std::move(credential)) {
    options_.ran_locally = &local_;
    options_.credential = credential_;
    if (write) {
      write_req_.mutable_chunk()->set_inode(inode.ino());
      write_req_.mutable_chunk()->set_index(p.index);
      write_req_.set_offset(p.offset);
      write_req_.set_chain_version(r.version);
      write_req_.set_chain(p.chain);
      write_req_.set_update_client(client.update_client_);
      write_req_.set_update_seq(p.update_seq);
      write_req_.set_not_after_unix_ns(fence);
      write_req_.set_unsynced(!client.options_.sync_each_write);
      options_.request_payload = std::span<const uint8_t>(p.data, p.length);
    } else {
      fillReadRange(read_req_.add_ranges(), inode, p, r.version);
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
  std::string credential_;
  net::CallOptions options_;
};

std::string ClientImpl::pieceName(bool write, const meta::Inode& inode, const Piece& p) {
  return fmt::format("{} chunk {}:{} on chain {}", write ? "write" : "read", inode.ino(), p.index,
                     p.chain);
}

ClientImpl::ChainRoute ClientImpl::readRoute(ChainRoute r, uint64_t ino, const Piece& p) {
  if (!r.replicated()) return r;
  const size_t n = r.replicas.size();
  if (p.to_tail) {
    r.endpoint = r.replicas[n - 1];
  } else {
    const uint64_t spread = ino * 0x9e3779b97f4a7c15ull + p.index;
    r.endpoint = r.replicas[(spread + p.attempts) % n];
  }
  return r;
}

Result<ClientImpl::ChainRoute> ClientImpl::pieceRoute(bool write, uint64_t ino, Piece& p) {
  ASSIGN_OR_RETURN(ChainRoute r, route(p.chain));
  if (write) {
    giveUpdateId(p);
    return r;
  }
  return readRoute(std::move(r), ino, p);
}

Status ClientImpl::afterReadAttempt(Piece& p, const Status& s, const Result<ChainRoute>& route) {
  if (s.code() == ErrorCode::kChunkNotCommitted) {
    p.to_tail = true;
    return s;
  }
  p.to_tail = false;
  ++p.attempts;
  if (s.code() == ErrorCode::kCorruption && route.ok() && route->replicated() &&
      ++p.corrupt < route->replicas.size()) {
    static auto& failovers = metrics::Registry::global().counter(
        "client_read_corrupt_failovers_total", {},
        "Reads that met a replica's copy failing verification and went to another replica");
    failovers.inc();
    return Status(
        ErrorCode::kTargetBusy,  // retried at once on the next replica
        fmt::format("{}: {}; reading another replica", route->endpoint.toString(), s.toString()));
  }
  return s;
}

std::optional<Status> ClientImpl::giveUp(const Status& s, Clock::time_point deadline,
                                         Clock::duration backoff, bool fenced) {
  const bool again = retryable(s) || (fenced && s.code() == ErrorCode::kLeaseExpired);
  if (!again || Clock::now() + backoff > deadline) return s;
  // The chain may have moved on (a replica taken out, a new head): routing
  // again costs one call to mgmtd per attempt, and attempts back off.
  if (s.code() == ErrorCode::kStaleChainVersion || s.code() == ErrorCode::kNotServing ||
      s.code() == ErrorCode::kConnectionFailed || s.code() == ErrorCode::kConnectionClosed ||
      s.code() == ErrorCode::kDeadlineExceeded) {
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
    auto r = pieceRoute(write, inode.ino(), p);
    if (!r.ok()) {
      s = r.status();  // a chain with no serving replica now: waited for, as any refusal
    } else {
      // (Not a co_await inside a conditional expression: GCC 12 destroys its
      // temporaries twice.) Shared memory only on one machine: a replicated
      // write's bytes travel down the chain anyway.
      std::optional<Status> via;
      if (shm_ && write && !r->replicated()) via = co_await shmWrite(*r, inode, p);
      if (shm_ && !write && !r->replicated()) via = co_await shmRead(*r, inode, p);
      std::string cap;
      Status capped;
      if (!via) capped = capabilityInto(inode.ino(), write, &cap);
      if (via) {
        s = *via;
      } else if (!capped.ok()) {
        s = capped;
      } else {
        SocketPiece call(*this, write, inode, p, *r, write ? attemptFence() : 0, std::move(cap));
        s = co_await rpc_->call(r->endpoint, call.method(), call.request(), call.response(),
                                call.options());
        s = call.finish(std::move(s));
      }
    }
    if (s.ok()) co_return s;
    if (!write) s = afterReadAttempt(p, s, r);
    if (auto end = giveUp(s, deadline, backoff, /*fenced=*/write))
      co_return end->withContext(pieceName(write, inode, p));
    if (s.code() != ErrorCode::kChunkNotCommitted) {  // else the tail, at once
      asio::steady_timer timer(co_await asio::this_coro::executor, backoff);
      co_await timer.async_wait(asio::use_awaitable);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
  }
}

Status ClientImpl::runPieceBlocking(bool write, const meta::Inode& inode, Piece& p) {
  return retryBlocking(
      p.chain,
      [&](const ChainRoute& route) {
        ChainRoute r = route;
        if (write) {
          giveUpdateId(p);
        } else {
          r = readRoute(r, inode.ino(), p);
        }
        ASSIGN_OR_RETURN(std::string cap, capability(inode.ino(), write));
        SocketPiece call(*this, write, inode, p, r, write ? blockingFence(r.endpoint, kWrite()) : 0,
                         std::move(cap));
        Status s = call.finish(rpc_->callSync(r.endpoint, call.method(), call.request(),
                                              call.response(), call.options()));
        if (!s.ok() && !write) s = afterReadAttempt(p, s, r);
        return s;
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
        ASSIGN_OR_RETURN(std::string cap, capability(inode.ino(), /*write=*/false));
        SocketPiece call(*this, false, inode, p, r, 0, std::move(cap));
        return call.finish(rpc_->callSync(r.endpoint, call.method(), call.request(),
                                          call.response(), call.options()));
      },
      [&] { return pieceName(false, inode, p); });
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
  return r.ok() && !r->replicated() &&
         rpc_->callsLocally(r->endpoint, write ? kWrite() : kBatchRead());
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

Status ClientImpl::readMany(const meta::Inode& inode, std::span<const ReadSpan> spans) {
  if (spans.empty()) return Status::OK();
  if (inode.layout().chunk_size() == 0)
    return Status(ErrorCode::kCorruption, fmt::format("inode {} has no layout", inode.ino()));
  std::vector<Piece> pieces;
  for (const ReadSpan& s : spans) {
    auto cut_pieces = cut(inode, s.offset, s.n, s.out);
    pieces.insert(pieces.end(), cut_pieces.begin(), cut_pieces.end());
  }
  // Each piece's route; pieces of one server in one request, in order.
  struct Group {
    ChainRoute route;
    std::vector<Piece*> pieces;
    size_t bytes = 0;
  };
  std::vector<Group> groups;
  // Done by runPieces: in parallel, short-circuit where it can, with
  // retries. Pieces larger than a batch go there from the start.
  std::vector<Piece> again;
  for (Piece& p : pieces) {
    if (p.length > kManyBytesMax) {
      again.push_back(p);
      continue;
    }
    auto r = route(p.chain);
    if (!r.ok()) {
      again.push_back(p);
      continue;
    }
    ChainRoute rr = readRoute(std::move(*r), inode.ino(), p);
    Group* g = nullptr;
    for (auto& candidate : groups) {
      if (candidate.route.endpoint == rr.endpoint && candidate.pieces.size() < kManyRangesMax &&
          candidate.bytes + p.length <= kManyBytesMax) {
        g = &candidate;
        break;
      }
    }
    if (!g) g = &groups.emplace_back(Group{std::move(rr), {}, 0});
    g->pieces.push_back(&p);
    g->bytes += p.length;
  }
  std::vector<uint8_t> buf;
  for (Group& g : groups) {
    storage::BatchReadReq req;
    for (Piece* p : g.pieces) fillReadRange(req.add_ranges(), inode, *p, g.route.version);
    buf.resize(g.bytes);
    storage::BatchReadResp resp;
    size_t got = 0;
    bool local = false;
    net::CallOptions o;
    o.response_payload = std::span<uint8_t>(buf.data(), buf.size());
    o.response_payload_len = &got;
    o.ran_locally = &local;
    auto cap = capability(inode.ino(), /*write=*/false);
    if (!cap.ok()) return cap.status();
    o.credential = *cap;
    Status s = rpc_->callSync(g.route.endpoint, kBatchRead(), req, &resp, o);
    if (!s.ok() || resp.codes_size() != req.ranges_size() ||
        resp.lengths_size() != req.ranges_size()) {
      for (Piece* p : g.pieces) again.push_back(*p);
      continue;
    }
    // The ranges' bytes back to back; a hole or a short chunk reads as zeros.
    size_t at = 0;
    for (int i = 0; i < req.ranges_size(); ++i) {
      Piece* p = g.pieces[static_cast<size_t>(i)];
      size_t len = resp.lengths(i);
      const size_t sent = len;
      if (!rangeStatus(resp, &len, i).ok() || len > p->length || at + len > got) {
        again.push_back(*p);
        at += sent;
        continue;
      }
      std::memcpy(p->data, buf.data() + at, len);
      if (len < p->length) std::memset(p->data + len, 0, p->length - len);
      at += len;
    }
    readBytes(local ? "local" : "socket").inc(at);
  }
  return runPieces(false, inode, again);
}

Status ClientImpl::writeData(const meta::Inode& inode, uint64_t offset, size_t n,
                             const uint8_t* in) {
  if (inode.layout().chunk_size() == 0 || inode.layout().chains_size() == 0)
    return Status(ErrorCode::kCorruption, fmt::format("inode {} has no layout", inode.ino()));
  // Pieces only read from `data` when writing.
  auto pieces = cut(inode, offset, n, const_cast<uint8_t*>(in));
  return runPieces(true, inode, pieces);
}

}  // namespace cistern::client
