#include "net/rpc_client.h"

#include <google/protobuf/message.h>
#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/detached.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <deque>
#include <future>
#include <unordered_map>

#include "common/clock.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/metrics.h"
#include "net/blocking.h"
#include "net/io_pool.h"
#include "net/local_call.h"
#include "net/recv_buffer.h"
#include "net/sync_connection.h"

namespace cistern::net {

using asio::awaitable;
using asio::use_awaitable;
using tcp = asio::ip::tcp;

void CancelToken::cancel() {
  std::map<uint64_t, std::function<void()>> cbs;
  {
    std::lock_guard lock(mu_);
    if (cancelled_.exchange(true)) return;
    cbs.swap(callbacks_);
  }
  for (auto& [id, fn] : cbs) fn();
}

uint64_t CancelToken::subscribe(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    if (!cancelled_) {
      uint64_t id = next_id_++;
      callbacks_.emplace(id, std::move(fn));
      return id;
    }
  }
  fn();
  return 0;
}

void CancelToken::unsubscribe(uint64_t id) {
  std::lock_guard lock(mu_);
  callbacks_.erase(id);
}

namespace {

// A call waiting for its response. Shared by the caller's coroutine and the
// connection's reader; both run on the connection's thread.
struct PendingCall {
  explicit PendingCall(const asio::any_io_executor& ex) : wake(ex) {}
  google::protobuf::Message* response = nullptr;
  std::span<uint8_t> payload_dest;
  size_t payload_len = 0;
  asio::steady_timer wake;  // cancelled to wake the caller
  Status result;
  bool done = false;
  bool cancelled = false;
  bool abandoned = false;  // the caller has returned: touch none of its memory
  bool receiving = false;  // the reader is reading into payload_dest
};

// What every call checks before it starts.
Status checkCall(const Method& method, const google::protobuf::Message& request,
                 const google::protobuf::Message* response, const CallOptions& options,
                 const ClientOptions& client) {
  CISTERN_CHECK(request.GetDescriptor() == method.input, method.name);
  CISTERN_CHECK(response == nullptr || response->GetDescriptor() == method.output, method.name);
  if (options.request_payload.size() > client.limits.payload_bytes_max) {
    return Status(ErrorCode::kPayloadTooLarge,
                  fmt::format("request payload of {} bytes exceeds {}",
                              options.request_payload.size(), client.limits.payload_bytes_max));
  }
  if (options.credential.size() > kCredentialBytesMax) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{}: a credential of {} bytes exceeds {}", method.name,
                              options.credential.size(), kCredentialBytesMax));
  }
  if (options.cancel && options.cancel->cancelled())
    return Status(ErrorCode::kCancelled, method.name);
  return Status::OK();
}

struct OutFrame {
  uint64_t request_id;
  std::array<uint8_t, kHeaderSize> header;
  std::string message;
  std::span<const uint8_t> payload;
};

}  // namespace

class ClientConnection : public std::enable_shared_from_this<ClientConnection> {
 public:
  ClientConnection(asio::io_context& ctx, Endpoint ep, const ClientOptions& options)
      : ex_(ctx.get_executor()),
        endpoint_(std::move(ep)),
        options_(options),
        socket_(ctx),
        write_signal_(ctx),
        state_signal_(ctx),
        slot_signal_(ctx) {}

  asio::any_io_executor executor() const { return ex_; }

  awaitable<Status> call(const Method& method, const google::protobuf::Message& request,
                         google::protobuf::Message* response, CallOptions options);
  void shutdown() { fail(Status(ErrorCode::kShuttingDown, "rpc client destroyed")); }

 private:
  enum class State { kIdle, kConnecting, kConnected };

  awaitable<Status> ensureConnected(SteadyTime deadline);
  awaitable<void> reader(uint64_t generation);
  awaitable<void> writer(uint64_t generation);
  // Waits on `timer` until it is cancelled or `deadline` passes; returns false on deadline.
  awaitable<bool> waitSignal(asio::steady_timer& timer, SteadyTime deadline);
  // Closes the socket and fails every pending call with `status`.
  void fail(const Status& status);
  void complete(const std::shared_ptr<PendingCall>& p, Status s);

  asio::any_io_executor ex_;
  Endpoint endpoint_;
  ClientOptions options_;
  tcp::socket socket_;
  asio::steady_timer write_signal_;
  asio::steady_timer state_signal_;
  asio::steady_timer slot_signal_;
  State state_ = State::kIdle;
  uint64_t generation_ = 0;
  uint64_t next_request_id_ = 1;
  uint32_t inflight_ = 0;
  std::unordered_map<uint64_t, std::shared_ptr<PendingCall>> pending_;
  std::deque<std::unique_ptr<OutFrame>> out_;  // unique_ptr: buffers must not move during a write
  std::vector<uint64_t> writing_;              // request ids in the write now in progress
};

struct RpcClient::Impl {
  ClientOptions options;
  std::unique_ptr<IoPool> pool;
  std::mutex mu;
  std::map<std::string, std::vector<std::shared_ptr<ClientConnection>>> conns;
  std::atomic<uint64_t> rr{0};
  metrics::Counter* calls;
  metrics::Counter* errors;

  struct SyncPool {
    std::vector<std::unique_ptr<SyncConnection>> idle;
    uint32_t open = 0;  // idle + in use
  };
  std::map<std::string, SyncPool> sync;  // under mu

  // A connection for one callSync(), or null when the endpoint's are all in use.
  std::unique_ptr<SyncConnection> takeSync(const Endpoint& ep) {
    std::lock_guard lock(mu);
    SyncPool& p = sync[ep.toString()];
    if (!p.idle.empty()) {
      auto c = std::move(p.idle.back());
      p.idle.pop_back();
      return c;
    }
    if (p.open >= options.sync_connections_per_endpoint) return nullptr;
    ++p.open;
    return std::make_unique<SyncConnection>(ep, options);
  }
  void giveBackSync(const Endpoint& ep, std::unique_ptr<SyncConnection> c) {
    std::lock_guard lock(mu);
    sync[ep.toString()].idle.push_back(std::move(c));
  }

  std::shared_ptr<ClientConnection> pick(const Endpoint& ep) {
    std::lock_guard lock(mu);
    auto& list = conns[ep.toString()];
    if (list.empty()) {
      for (uint32_t i = 0; i < std::max(1u, options.connections_per_endpoint); ++i) {
        list.push_back(std::make_shared<ClientConnection>(pool->next(), ep, options));
      }
    }
    return list[rr.fetch_add(1, std::memory_order_relaxed) % list.size()];
  }
};

// --------------------------------------------------------------------------

awaitable<bool> ClientConnection::waitSignal(asio::steady_timer& timer, SteadyTime deadline) {
  asio::error_code ec;
  timer.expires_at(deadline);
  co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
  co_return ec == asio::error::operation_aborted;
}

awaitable<Status> ClientConnection::ensureConnected(SteadyTime deadline) {
  while (state_ != State::kConnected) {
    if (state_ == State::kConnecting) {
      if (!co_await waitSignal(state_signal_, deadline) && state_ != State::kConnected) {
        co_return Status(ErrorCode::kDeadlineExceeded,
                         fmt::format("connecting to {}", endpoint_.toString()));
      }
      continue;
    }
    state_ = State::kConnecting;
    asio::error_code ec;
    tcp::resolver resolver(ex_);
    auto results = co_await resolver.async_resolve(endpoint_.host, std::to_string(endpoint_.port),
                                                   asio::redirect_error(use_awaitable, ec));
    if (!ec) {
      // A timer closes the socket if the connect takes too long.
      SteadyTime connect_deadline =
          std::min(deadline, std::chrono::steady_clock::now() +
                                 std::chrono::milliseconds(options_.connect_timeout_ms));
      asio::steady_timer guard(ex_);
      guard.expires_at(connect_deadline);
      bool timed_out = false;
      guard.async_wait([this, &timed_out](asio::error_code e) {
        if (!e) {
          timed_out = true;
          asio::error_code ignore;
          socket_.close(ignore);
        }
      });
      co_await asio::async_connect(socket_, results, asio::redirect_error(use_awaitable, ec));
      guard.cancel();
      if (timed_out && ec) ec = asio::error::timed_out;
    }
    if (ec) {
      asio::error_code ignore;
      socket_.close(ignore);
      state_ = State::kIdle;
      state_signal_.cancel();
      co_return Status(ErrorCode::kConnectionFailed,
                       fmt::format("connect to {}: {}", endpoint_.toString(), ec.message()));
    }
    socket_.set_option(tcp::no_delay(true), ec);
    state_ = State::kConnected;
    ++generation_;
    auto self = shared_from_this();
    uint64_t gen = generation_;
    asio::co_spawn(
        ex_, [self, gen] { return self->reader(gen); }, asio::detached);
    asio::co_spawn(
        ex_, [self, gen] { return self->writer(gen); }, asio::detached);
    state_signal_.cancel();
  }
  co_return Status::OK();
}

void ClientConnection::complete(const std::shared_ptr<PendingCall>& p, Status s) {
  p->result = std::move(s);
  p->done = true;
  p->wake.cancel();
}

void ClientConnection::fail(const Status& status) {
  if (state_ == State::kIdle && pending_.empty()) return;
  if (state_ == State::kConnected) {
    CLOG_DEBUG("net", "connection to {} failed: {}", endpoint_.toString(), status.toString());
  }
  asio::error_code ec;
  socket_.close(ec);
  state_ = State::kIdle;
  ++generation_;
  auto pending = std::move(pending_);
  pending_.clear();
  out_.clear();
  writing_.clear();
  for (auto& [id, p] : pending) complete(p, status);
  write_signal_.cancel();
  state_signal_.cancel();
}

awaitable<Status> ClientConnection::call(const Method& method,
                                         const google::protobuf::Message& request,
                                         google::protobuf::Message* response, CallOptions options) {
  auto self = shared_from_this();
  uint32_t timeout_ms = options.timeout_ms ? options.timeout_ms : options_.call_timeout_ms;
  SteadyTime deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  if (Status s = checkCall(method, request, response, options, options_); !s.ok()) co_return s;

  CO_RETURN_ON_ERROR(co_await ensureConnected(deadline));
  while (inflight_ >= options_.inflight_per_connection_max) {
    if (!co_await waitSignal(slot_signal_, deadline) &&
        inflight_ >= options_.inflight_per_connection_max) {
      co_return Status(ErrorCode::kDeadlineExceeded,
                       fmt::format("{}: waiting for a free slot", method.name));
    }
  }
  if (state_ != State::kConnected) CO_RETURN_ON_ERROR(co_await ensureConnected(deadline));

  ++inflight_;
  auto p = std::make_shared<PendingCall>(ex_);
  p->response = response;
  p->payload_dest = options.response_payload;
  uint64_t id = next_request_id_++;
  pending_[id] = p;

  auto frame = std::make_unique<OutFrame>();
  OutFrame& f = *frame;
  f.request_id = id;
  f.payload = options.request_payload;
  FrameHeader h =
      requestHeader(method, request, options, timeout_ms, options_.payload_crc, id, &f.message);
  encodeHeader(h, f.header.data());
  out_.push_back(std::move(frame));
  write_signal_.cancel();

  uint64_t cancel_sub = 0;
  if (options.cancel) {
    std::weak_ptr<PendingCall> weak = p;
    cancel_sub = options.cancel->subscribe([weak, ex = ex_] {
      asio::post(ex, [weak] {
        if (auto pc = weak.lock(); pc && !pc->done) {
          pc->cancelled = true;
          pc->wake.cancel();
        }
      });
    });
  }

  while (!p->done) {
    asio::error_code ec;
    p->wake.expires_at(deadline);
    co_await p->wake.async_wait(asio::redirect_error(use_awaitable, ec));
    if (p->done) break;
    bool expired = !ec && std::chrono::steady_clock::now() >= deadline;
    if (!expired && !p->cancelled) continue;
    // The caller gives up. Make sure nothing touches its buffers afterwards.
    Status why = p->cancelled ? Status(ErrorCode::kCancelled, method.name)
                              : Status(ErrorCode::kDeadlineExceeded,
                                       fmt::format("{} after {} ms", method.name, timeout_ms));
    p->abandoned = true;
    pending_.erase(id);
    bool in_write = std::find(writing_.begin(), writing_.end(), id) != writing_.end();
    if (p->receiving || in_write) {
      // Bytes are moving to or from the caller's buffers: only closing the
      // connection stops that. Other calls on it fail with kConnectionClosed.
      fail(Status(ErrorCode::kConnectionClosed,
                  fmt::format("connection reset: {} abandoned mid-transfer", method.name)));
    } else {
      std::erase_if(out_, [id](const auto& o) { return o->request_id == id; });
    }
    p->result = why;
    p->done = true;
  }
  if (options.cancel && cancel_sub) options.cancel->unsubscribe(cancel_sub);
  --inflight_;
  slot_signal_.cancel_one();
  if (p->result.ok() && options.response_payload_len)
    *options.response_payload_len = p->payload_len;
  co_return p->result;
}

awaitable<void> ClientConnection::writer(uint64_t generation) {
  auto self = shared_from_this();
  std::vector<asio::const_buffer> bufs;
  asio::error_code ec;
  while (generation == generation_) {
    if (out_.empty()) {
      write_signal_.expires_at(asio::steady_timer::time_point::max());
      co_await write_signal_.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    // Frames stay in out_ until written, so that their ids are known as in flight.
    bufs.clear();
    writing_.clear();
    size_t n = 0, total = 0;
    for (; n < out_.size() && n < 32 && total < (8u << 20); ++n) {
      OutFrame& f = *out_[n];
      writing_.push_back(f.request_id);
      bufs.emplace_back(f.header.data(), f.header.size());
      if (!f.message.empty()) bufs.emplace_back(f.message.data(), f.message.size());
      if (!f.payload.empty()) bufs.emplace_back(f.payload.data(), f.payload.size());
      total += kHeaderSize + f.message.size() + f.payload.size();
    }
    co_await asio::async_write(socket_, bufs, asio::redirect_error(use_awaitable, ec));
    if (generation != generation_) co_return;
    if (ec) {
      fail(Status(ErrorCode::kConnectionClosed,
                  fmt::format("write to {}: {}", endpoint_.toString(), ec.message())));
      co_return;
    }
    out_.erase(out_.begin(), out_.begin() + static_cast<long>(n));
    writing_.clear();
  }
}

awaitable<void> ClientConnection::reader(uint64_t generation) {
  auto self = shared_from_this();
  std::array<uint8_t, kHeaderSize> hbuf;
  std::string message;
  std::vector<uint8_t> scratch;
  RecvBuffer in;  // this connection's bytes only: a new one per reader
  asio::error_code ec;
  auto broken = [&](std::string_view what) {
    if (generation == generation_) {
      fail(Status(ErrorCode::kConnectionClosed,
                  fmt::format("{} {}: {}", what, endpoint_.toString(), ec.message())));
    }
  };
  while (generation == generation_) {
    co_await in.read(socket_, hbuf, nullptr, ec);
    if (generation != generation_) co_return;
    if (ec) co_return broken("read from");
    auto h = decodeHeader(hbuf, options_.limits);
    if (!h.ok() || !h->isResponse()) {
      Status s = h.ok() ? Status(ErrorCode::kBadFrame, "request frame from a server") : h.status();
      CLOG_WARN("net", "closing connection to {}: {}", endpoint_.toString(), s.toString());
      fail(s);
      co_return;
    }
    std::shared_ptr<PendingCall> p;
    if (auto it = pending_.find(h->request_id); it != pending_.end()) p = it->second;
    message.resize(h->message_len);
    uint32_t crc = 0;
    co_await in.read(socket_, {reinterpret_cast<uint8_t*>(message.data()), message.size()}, &crc,
                     ec);
    if (generation != generation_) co_return;
    if (ec) co_return broken("read from");
    Status result;
    if (h->status != 0) result = Status(static_cast<ErrorCode>(h->status), message);
    bool into_caller =
        p && !p->abandoned && h->status == 0 && h->payload_len <= p->payload_dest.size();
    if (p && !p->abandoned && h->payload_len > p->payload_dest.size()) {
      result = Status(ErrorCode::kPayloadTooLarge,
                      fmt::format("response payload of {} bytes exceeds the {} byte buffer",
                                  h->payload_len, p->payload_dest.size()));
    }
    if (h->payload_len > 0) {
      if (into_caller) {
        p->receiving = true;
        co_await in.read(socket_, p->payload_dest.first(h->payload_len),
                         h->payloadChecksummed() ? &crc : nullptr, ec);
        p->receiving = false;
        if (generation != generation_) co_return;
        if (ec) co_return broken("read from");
      } else {
        // Nobody wants these bytes (late response, error, too large): drain them.
        scratch.resize(std::min<size_t>(h->payload_len, 256 * 1024));
        for (size_t left = h->payload_len; left > 0;) {
          size_t n = std::min(left, scratch.size());
          co_await in.read(socket_, {scratch.data(), n}, h->payloadChecksummed() ? &crc : nullptr,
                           ec);
          if (generation != generation_) co_return;
          if (ec) co_return broken("read from");
          left -= n;
        }
      }
    }
    if (crc != h->body_crc) {
      CLOG_WARN("net", "closing connection to {}: body checksum mismatch", endpoint_.toString());
      fail(Status(ErrorCode::kBadFrame, "response body checksum mismatch"));
      co_return;
    }
    if (!p || p->abandoned) continue;
    if (result.ok() && p->response &&
        !p->response->ParseFromArray(message.data(), static_cast<int>(message.size()))) {
      result = Status(ErrorCode::kBadMessage, "cannot parse the response message");
    }
    p->payload_len = into_caller ? h->payload_len : 0;
    pending_.erase(h->request_id);
    complete(p, result);
  }
}

// --------------------------------------------------------------------------

RpcClient::RpcClient(const ClientOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  impl_->pool = std::make_unique<IoPool>(options.threads, "rpc-cli");
  auto& r = metrics::Registry::global();
  impl_->calls = &r.counter("rpc_client_calls_total", {}, "Calls made");
  impl_->errors = &r.counter("rpc_client_errors_total", {}, "Calls that failed");
}

RpcClient::~RpcClient() {
  std::vector<std::shared_ptr<ClientConnection>> all;
  {
    std::lock_guard lock(impl_->mu);
    for (auto& [k, list] : impl_->conns) all.insert(all.end(), list.begin(), list.end());
  }
  std::vector<std::future<void>> done;
  for (auto& c : all) {
    auto promise = std::make_shared<std::promise<void>>();
    done.push_back(promise->get_future());
    asio::post(c->executor(), [c, promise] {
      c->shutdown();
      promise->set_value();
    });
  }
  for (auto& f : done) f.wait();
  // Let the calls woken by shutdown() run to completion (their resumptions are
  // queued behind the shutdown handlers) before the contexts stop.
  for (int round = 0; round < 3; ++round) {
    std::vector<std::future<void>> barrier;
    for (size_t i = 0; i < impl_->pool->size(); ++i) {
      auto promise = std::make_shared<std::promise<void>>();
      barrier.push_back(promise->get_future());
      asio::post(impl_->pool->at(i), [promise] { promise->set_value(); });
    }
    for (auto& f : barrier) f.wait();
  }
  impl_->pool->stop();
  all.clear();
  {
    std::lock_guard lock(impl_->mu);
    impl_->conns.clear();
    impl_->sync.clear();
  }
  impl_->pool.reset();
}

awaitable<Status> RpcClient::call(const Endpoint& to, const Method& method,
                                  const google::protobuf::Message& request,
                                  google::protobuf::Message* response, CallOptions options) {
  auto conn = impl_->pick(to);
  impl_->calls->inc();
  std::string credential;  // lives until the call ends
  if (options.credential.empty() && impl_->options.credential) {
    credential = impl_->options.credential();
    options.credential = credential;
  }
  Status s = co_await runOn(conn->executor(), conn->call(method, request, response, options));
  if (!s.ok()) impl_->errors->inc();
  co_return s;
}

void RpcClient::setCredential(std::function<std::string()> credential) {
  impl_->options.credential = std::move(credential);
}

Status RpcClient::callSync(const Endpoint& to, const Method& method,
                           const google::protobuf::Message& request,
                           google::protobuf::Message* response, CallOptions options) {
  impl_->calls->inc();
  if (options.ran_locally) *options.ran_locally = false;
  std::string credential;  // lives until the call ends
  if (options.credential.empty() && impl_->options.credential) {
    credential = impl_->options.credential();
    options.credential = credential;
  }
  if (impl_->options.local_calls && !(options.cancel && options.cancel->cancelled())) {
    if (std::optional<Status> s =
            callLocal(to, method, request, response, options.request_payload,
                      options.response_payload, options.response_payload_len, options.credential)) {
      if (options.ran_locally) *options.ran_locally = true;
      if (!s->ok()) impl_->errors->inc();
      return std::move(*s);
    }
  }
  if (impl_->options.sync_connections_per_endpoint > 0) {
    if (Status s = checkCall(method, request, response, options, impl_->options); !s.ok()) {
      impl_->errors->inc();
      return s;
    }
    if (auto c = impl_->takeSync(to)) {
      uint32_t timeout_ms =
          options.timeout_ms ? options.timeout_ms : impl_->options.call_timeout_ms;
      Status s = c->call(method, request, response, options, timeout_ms);
      impl_->giveBackSync(to, std::move(c));
      if (!s.ok()) impl_->errors->inc();
      return s;
    }
  }
  auto conn = impl_->pick(to);
  std::promise<Status> promise;
  auto future = promise.get_future();
  asio::co_spawn(conn->executor(), conn->call(method, request, response, options),
                 [&promise](std::exception_ptr e, Status s) {
                   if (e) s = Status(ErrorCode::kInternal, "rpc call threw");
                   promise.set_value(std::move(s));
                 });
  Status s = future.get();
  if (!s.ok()) impl_->errors->inc();
  return s;
}

bool RpcClient::callsLocally(const Endpoint& to, const Method& method) const {
  return impl_->options.local_calls && servedLocally(to, method);
}

}  // namespace cistern::net
