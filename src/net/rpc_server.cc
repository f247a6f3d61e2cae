#include "net/rpc_server.h"

#include <google/protobuf/message.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <shared_mutex>
#include <unordered_map>

#include "common/crc32c.h"
#include "common/log.h"
#include "common/metrics.h"
#include "net/buffer_pool.h"
#include "net/io_pool.h"
#include "net/local_call.h"
#include "net/recv_buffer.h"

namespace cistern::net {

using asio::awaitable;
using asio::use_awaitable;
using tcp = asio::ip::tcp;

namespace {

struct MethodEntry {
  Method method;
  const google::protobuf::Message* request;
  const google::protobuf::Message* response;
  Handler handler;
  LocalHandler local;  // empty: calls from this process use the socket too
  metrics::Counter* calls;
  metrics::Counter* errors;
  metrics::Histogram* latency_us;
  metrics::Counter* request_bytes;
  metrics::Counter* response_bytes;
};

struct ServerMetrics {
  metrics::Counter& bad_frames;
  metrics::Counter& connections;
  metrics::Gauge& open_connections;
  metrics::Gauge& inflight;
  metrics::Gauge& queued_bytes;
  static ServerMetrics& get() {
    auto& r = metrics::Registry::global();
    static ServerMetrics m{
        r.counter("rpc_server_bad_frames_total", {}, "Connections closed for a malformed frame"),
        r.counter("rpc_server_connections_total", {}, "Accepted connections"),
        r.gauge("rpc_server_open_connections", {}, "Open connections"),
        r.gauge("rpc_server_inflight_requests", {},
                "Requests read whose response is not yet written"),
        r.gauge("rpc_server_queued_response_bytes", {}, "Response bytes waiting to be written")};
    return m;
  }
};

// Counts a served call in its method's metrics.
void record(const MethodEntry& entry, const Status& status, uint64_t request_bytes,
            uint64_t response_payload_bytes, SteadyTime start) {
  entry.calls->inc();
  entry.request_bytes->inc(request_bytes);
  if (!status.ok()) {
    entry.errors->inc();
    // By code too; looked up only on failure.
    metrics::Registry::global()
        .counter(
            "rpc_server_errors_by_code_total",
            {{"method", entry.method.name}, {"code", std::string(errorCodeName(status.code()))}},
            "Failed calls by method and error code")
        .inc();
  } else {
    entry.response_bytes->inc(response_payload_bytes);
  }
  entry.latency_us->observe(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count()));
}

}  // namespace

struct OutFrame {
  std::array<uint8_t, kHeaderSize> header;
  std::string message;
  std::span<const uint8_t> payload;
  std::shared_ptr<const void> owner;
  size_t bytes() const { return kHeaderSize + message.size() + payload.size(); }
};

class ServerConnection : public std::enable_shared_from_this<ServerConnection> {
 public:
  ServerConnection(RpcServer::Impl* server, tcp::socket socket, std::string peer)
      : server_(server),
        socket_(std::move(socket)),
        peer_(std::move(peer)),
        write_signal_(socket_.get_executor()),
        slot_signal_(socket_.get_executor()) {}

  void start();
  // Stops reading new requests; the connection closes once in-flight calls are answered.
  void drain();
  void close(std::string_view why);
  bool closed() const { return closed_; }
  tcp::socket::executor_type executor() { return socket_.get_executor(); }

 private:
  awaitable<void> reader();
  awaitable<void> writer();
  awaitable<void> serve(const MethodEntry* entry, FrameHeader header,
                        std::unique_ptr<google::protobuf::Message> request, std::string credential,
                        PooledBuffer payload);
  void respond(const FrameHeader& req, const Status& status, std::string message,
               std::span<const uint8_t> payload, std::shared_ptr<const void> owner);
  void badFrame(const Status& s);
  void finishOne(size_t bytes);

  RpcServer::Impl* server_;
  tcp::socket socket_;
  std::string peer_;
  asio::steady_timer write_signal_;
  asio::steady_timer slot_signal_;
  std::deque<OutFrame> out_;
  RecvBuffer in_;  // reader()
  uint32_t inflight_ = 0;
  bool draining_ = false;
  bool closed_ = false;
};

struct RpcServer::Impl {
  ServerOptions options;
  std::unique_ptr<IoPool> pool;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::unordered_map<uint32_t, MethodEntry> methods;
  Guard guard;
  BufferPool buffers;
  Endpoint bound;
  bool started = false;
  bool stopped = false;
  std::string local_key;                    // the registry's key once registered, else empty
  std::atomic<uint64_t> local_inflight{0};  // local calls running

  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<ServerConnection*, std::weak_ptr<ServerConnection>> connections;

  awaitable<void> acceptLoop();
  void onClosed(ServerConnection* c) {
    {
      std::lock_guard lock(mu);
      connections.erase(c);
    }
    ServerMetrics::get().open_connections.add(-1);
    cv.notify_all();
  }
};

namespace {

// The started servers of this process that have local handlers, by endpoint.
struct LocalServers {
  std::shared_mutex mu;
  std::unordered_map<std::string, RpcServer::Impl*> by_endpoint;
  static LocalServers& get() {
    static LocalServers* servers = new LocalServers;  // outlives static destructors
    return *servers;
  }
};

// The local handler of `method` at `to` and its server, under servers.mu;
// null when there is none.
const MethodEntry* findLocal(const LocalServers& servers, const Endpoint& to, const Method& method,
                             RpcServer::Impl** server) {
  if (servers.by_endpoint.empty()) return nullptr;
  auto it = servers.by_endpoint.find(to.toString());
  if (it == servers.by_endpoint.end()) return nullptr;
  auto m = it->second->methods.find(method.id);
  if (m == it->second->methods.end() || !m->second.local) return nullptr;
  *server = it->second;
  return &m->second;
}

}  // namespace

bool servedLocally(const Endpoint& to, const Method& method) {
  LocalServers& servers = LocalServers::get();
  std::shared_lock lock(servers.mu);
  RpcServer::Impl* server = nullptr;
  return findLocal(servers, to, method, &server) != nullptr;
}

std::optional<Status> callLocal(const Endpoint& to, const Method& method,
                                const google::protobuf::Message& request,
                                google::protobuf::Message* response,
                                std::span<const uint8_t> request_payload,
                                std::span<uint8_t> response_payload, size_t* response_payload_len,
                                std::string_view credential) {
  LocalServers& servers = LocalServers::get();
  RpcServer::Impl* server = nullptr;
  const MethodEntry* entry = nullptr;
  {
    std::shared_lock lock(servers.mu);
    entry = findLocal(servers, to, method, &server);
    if (!entry || request.GetDescriptor() != entry->request->GetDescriptor() ||
        response->GetDescriptor() != entry->response->GetDescriptor())
      return std::nullopt;
    // Before the lock is released: stop() unregisters, then waits for these.
    server->local_inflight.fetch_add(1);
  }
  SteadyTime start = std::chrono::steady_clock::now();
  response->Clear();
  LocalPayloads payloads{request_payload, response_payload, 0, credential};
  Status status;
  try {
    if (server->guard) status = server->guard(entry->method, credential, request);
    if (status.ok()) status = entry->local(request, *response, payloads);
  } catch (const std::exception& e) {
    status = Status(ErrorCode::kInternal, fmt::format("handler threw: {}", e.what()));
    CLOG_ERROR("net", "{} local handler threw: {}", entry->method.name, e.what());
  }
  if (!status.ok()) payloads.response_len = 0;
  if (response_payload_len) *response_payload_len = payloads.response_len;
  record(*entry, status, request.ByteSizeLong() + request_payload.size(), payloads.response_len,
         start);
  {
    // Under the lock: once stop() sees no call running it may free the
    // server, so nothing of it may be touched after the count drops.
    std::lock_guard lock(server->mu);
    if (server->local_inflight.fetch_sub(1) == 1) server->cv.notify_all();
  }
  return status;
}

// --------------------------------------------------------------------------

void ServerConnection::start() {
  auto self = shared_from_this();
  asio::co_spawn(
      socket_.get_executor(), [self]() { return self->reader(); }, asio::detached);
  asio::co_spawn(
      socket_.get_executor(), [self]() { return self->writer(); }, asio::detached);
}

void ServerConnection::drain() {
  draining_ = true;
  asio::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_receive, ec);
  slot_signal_.cancel();
  if (inflight_ == 0 && out_.empty()) close("server stopping");
}

void ServerConnection::close(std::string_view why) {
  if (closed_) return;
  closed_ = true;
  CLOG_DEBUG("net", "closing connection from {}: {}", peer_, why);
  asio::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  write_signal_.cancel();
  slot_signal_.cancel();
  for (auto& f : out_) finishOne(f.bytes());
  out_.clear();
  server_->onClosed(this);
}

void ServerConnection::badFrame(const Status& s) {
  ServerMetrics::get().bad_frames.inc();
  CLOG_WARN("net", "closing connection from {}: {}", peer_, s.toString());
  close(s.message());
}

awaitable<void> ServerConnection::reader() {
  auto self = shared_from_this();
  const FrameLimits& limits = server_->options.limits;
  std::array<uint8_t, kHeaderSize> hbuf;
  std::string message;
  asio::error_code ec;
  while (!closed_ && !draining_) {
    while (inflight_ >= server_->options.inflight_per_connection_max && !closed_ && !draining_) {
      slot_signal_.expires_at(asio::steady_timer::time_point::max());
      co_await slot_signal_.async_wait(asio::redirect_error(use_awaitable, ec));
    }
    if (closed_ || draining_) break;
    size_t n = co_await in_.read(socket_, hbuf, nullptr, ec);
    if (ec) {
      if (closed_ || draining_) break;
      if (n == 0 && ec == asio::error::eof) {
        close("closed by peer");
      } else {
        badFrame(Status(
            ErrorCode::kConnectionClosed,
            fmt::format("disconnected mid-frame after {} header bytes: {}", n, ec.message())));
      }
      co_return;
    }
    auto h = decodeHeader(hbuf, limits);
    if (!h.ok()) {
      badFrame(h.status());
      co_return;
    }
    if (h->isResponse()) {
      badFrame(Status(ErrorCode::kBadFrame, "response frame sent to a server"));
      co_return;
    }
    message.resize(h->message_len);
    PooledBuffer payload;
    if (h->payload_len > 0) payload = server_->buffers.get(h->payload_len);
    uint32_t crc = 0;
    co_await in_.read(socket_, {reinterpret_cast<uint8_t*>(message.data()), message.size()}, &crc,
                      ec);
    if (!ec && h->payload_len > 0) {
      co_await in_.read(socket_, std::span<uint8_t>(payload.data(), h->payload_len),
                        h->payloadChecksummed() ? &crc : nullptr, ec);
    }
    if (ec) {
      if (!closed_) {
        badFrame(Status(ErrorCode::kConnectionClosed,
                        fmt::format("disconnected mid-frame in the body: {}", ec.message())));
      }
      co_return;
    }
    if (crc != h->body_crc) {
      badFrame(Status(ErrorCode::kBadFrame, "body checksum mismatch"));
      co_return;
    }
    auto it = server_->methods.find(h->method);
    ++inflight_;
    ServerMetrics::get().inflight.add(1);
    if (it == server_->methods.end()) {
      CLOG_WARN("net", "unknown method {:#x} from {}", h->method, peer_);
      respond(*h, Status(ErrorCode::kUnknownMethod, fmt::format("method {:#x}", h->method)), {}, {},
              nullptr);
      continue;
    }
    std::unique_ptr<google::protobuf::Message> request(it->second.request->New());
    const size_t cl = h->credential_len;  // <= message_len (decodeHeader)
    if (!request->ParseFromArray(message.data() + cl, static_cast<int>(message.size() - cl))) {
      CLOG_WARN("net", "unparsable {} request from {}", it->second.method.name, peer_);
      respond(
          *h,
          Status(ErrorCode::kBadMessage, fmt::format("cannot parse {}", it->second.method.name)),
          {}, {}, nullptr);
      continue;
    }
    asio::co_spawn(
        socket_.get_executor(),
        serve(&it->second, *h, std::move(request), message.substr(0, cl), std::move(payload)),
        asio::detached);
  }
  if (draining_ && inflight_ == 0 && out_.empty()) close("drained");
}

awaitable<void> ServerConnection::serve(const MethodEntry* entry, FrameHeader header,
                                        std::unique_ptr<google::protobuf::Message> request,
                                        std::string credential, PooledBuffer payload) {
  auto self = shared_from_this();
  SteadyTime start = std::chrono::steady_clock::now();
  CallContext ctx;
  ctx.header_ = header;
  ctx.peer_ = peer_;
  ctx.credential_ = std::move(credential);
  ctx.request_payload_ = {payload.data(), header.payload_len};
  if (header.deadline_ms) ctx.deadline_ = start + std::chrono::milliseconds(header.deadline_ms);
  std::unique_ptr<google::protobuf::Message> response(entry->response->New());
  Status status;
  try {
    if (server_->guard) status = server_->guard(entry->method, ctx.credential_, *request);
    if (status.ok()) status = co_await entry->handler(ctx, *request, *response);
  } catch (const std::exception& e) {
    status = Status(ErrorCode::kInternal, fmt::format("handler threw: {}", e.what()));
    CLOG_ERROR("net", "{} handler threw: {}", entry->method.name, e.what());
  }
  record(*entry, status, header.message_len + header.payload_len, ctx.response_payload_.size(),
         start);
  if (closed_) {
    finishOne(0);
    co_return;
  }
  if (status.ok()) {
    respond(header, status, response->SerializeAsString(), ctx.response_payload_,
            std::move(ctx.response_owner_));
  } else {
    respond(header, status, std::string(status.message()), {}, nullptr);
  }
}

void ServerConnection::respond(const FrameHeader& req, const Status& status, std::string message,
                               std::span<const uint8_t> payload,
                               std::shared_ptr<const void> owner) {
  if (closed_) return;
  FrameHeader h;
  h.flags = kFlagResponse;
  h.status = static_cast<uint16_t>(status.code());
  h.request_id = req.request_id;
  h.method = req.method;
  h.priority = req.priority;
  h.message_len = static_cast<uint32_t>(message.size());
  h.payload_len = static_cast<uint32_t>(payload.size());
  uint32_t crc = crc32c(message.data(), message.size());
  if (server_->options.payload_crc && !payload.empty()) {
    h.flags |= kFlagPayloadCrc;
    crc = crc32cExtend(crc, payload.data(), payload.size());
  }
  h.body_crc = crc;
  OutFrame f;
  encodeHeader(h, f.header.data());
  f.message = std::move(message);
  f.payload = payload;
  f.owner = std::move(owner);
  ServerMetrics::get().queued_bytes.add(static_cast<int64_t>(f.bytes()));
  out_.push_back(std::move(f));
  write_signal_.cancel();
}

void ServerConnection::finishOne(size_t bytes) {
  ServerMetrics::get().queued_bytes.add(-static_cast<int64_t>(bytes));
  ServerMetrics::get().inflight.add(-1);
  --inflight_;
  slot_signal_.cancel();
}

awaitable<void> ServerConnection::writer() {
  auto self = shared_from_this();
  asio::error_code ec;
  std::vector<asio::const_buffer> bufs;
  std::deque<OutFrame> writing;
  while (!closed_) {
    if (out_.empty()) {
      if (draining_ && inflight_ == 0) {
        close("drained");
        break;
      }
      write_signal_.expires_at(asio::steady_timer::time_point::max());
      co_await write_signal_.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    // Gather several responses into one write.
    bufs.clear();
    size_t total = 0;
    while (!out_.empty() && writing.size() < 32 && total < (8u << 20)) {
      writing.push_back(std::move(out_.front()));
      out_.pop_front();
      OutFrame& f = writing.back();
      bufs.emplace_back(f.header.data(), f.header.size());
      if (!f.message.empty()) bufs.emplace_back(f.message.data(), f.message.size());
      if (!f.payload.empty()) bufs.emplace_back(f.payload.data(), f.payload.size());
      total += f.bytes();
    }
    co_await asio::async_write(socket_, bufs, asio::redirect_error(use_awaitable, ec));
    if (ec) {
      close(fmt::format("write failed: {}", ec.message()));
      break;
    }
    for (auto& f : writing) finishOne(f.bytes());
    writing.clear();
  }
  for (auto& f : writing) finishOne(f.bytes());
  // Connections closed with calls in flight: those calls still hold slots;
  // the gauge is corrected when their serve() coroutines end (respond is a no-op).
}

// --------------------------------------------------------------------------

awaitable<void> RpcServer::Impl::acceptLoop() {
  asio::error_code ec;
  while (true) {
    asio::io_context& target = pool->next();
    tcp::socket socket(target);
    co_await acceptor->async_accept(socket, asio::redirect_error(use_awaitable, ec));
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor->is_open()) co_return;
      CLOG_WARN("net", "accept failed: {}", ec.message());
      continue;
    }
    std::string peer = "?";
    auto remote = socket.remote_endpoint(ec);
    if (!ec) peer = Endpoint{remote.address().to_string(), remote.port()}.toString();
    socket.set_option(tcp::no_delay(true), ec);
    ServerMetrics::get().connections.inc();
    std::shared_ptr<ServerConnection> conn;
    {
      std::lock_guard lock(mu);
      if (stopped || connections.size() >= options.connections_max) {
        CLOG_WARN("net", "refusing connection from {}: {} connections open", peer,
                  connections.size());
        socket.close(ec);
        continue;
      }
      conn = std::make_shared<ServerConnection>(this, std::move(socket), peer);
      connections[conn.get()] = conn;
    }
    ServerMetrics::get().open_connections.add(1);
    CLOG_DEBUG("net", "accepted connection from {}", peer);
    asio::post(target, [conn] { conn->start(); });
  }
}

RpcServer::RpcServer(const ServerOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
}

RpcServer::~RpcServer() { stop(); }

void RpcServer::handleRaw(const Method& method, const google::protobuf::Message& request,
                          const google::protobuf::Message& response, Handler handler) {
  CISTERN_CHECK(!impl_->started, "register methods before start()");
  CISTERN_CHECK(request.GetDescriptor() == method.input, method.name);
  CISTERN_CHECK(response.GetDescriptor() == method.output, method.name);
  auto& r = metrics::Registry::global();
  metrics::Labels labels{{"method", method.name}};
  bool inserted =
      impl_->methods
          .emplace(method.id,
                   MethodEntry{method, &request, &response, std::move(handler), nullptr,
                               &r.counter("rpc_server_calls_total", labels, "Calls served"),
                               &r.counter("rpc_server_errors_total", labels, "Calls that failed"),
                               &r.histogram("rpc_server_latency_us", labels, "Handler latency"),
                               &r.counter("rpc_server_request_bytes_total", labels,
                                          "Request bytes received (message and payload)"),
                               &r.counter("rpc_server_response_payload_bytes_total", labels,
                                          "Response payload bytes sent")})
          .second;
  CISTERN_CHECK(inserted, "method registered twice");
}

void RpcServer::handleLocal(const Method& method, LocalHandler local) {
  CISTERN_CHECK(!impl_->started, "register methods before start()");
  auto it = impl_->methods.find(method.id);
  CISTERN_CHECK(it != impl_->methods.end(), "handleLocal before handleRaw: " + method.name);
  it->second.local = std::move(local);
}

void RpcServer::setGuard(Guard guard) {
  CISTERN_CHECK(!impl_->started, "set the guard before start()");
  impl_->guard = std::move(guard);
}

Status RpcServer::start() {
  CISTERN_CHECK(!impl_->started, "start() twice");
  impl_->started = true;
  std::string where = fmt::format("{}:{}", impl_->options.listen_host, impl_->options.listen_port);
  asio::error_code ec;
  auto addr = asio::ip::make_address(impl_->options.listen_host, ec);
  if (ec || impl_->options.listen_port > 65535) {
    impl_->stopped = true;
    return Status(
        ErrorCode::kInvalidArgument,
        fmt::format("listen address {}: {}", where, ec ? ec.message() : "port out of range"));
  }
  impl_->pool = std::make_unique<IoPool>(impl_->options.threads, "rpc-srv");
  impl_->acceptor = std::make_unique<tcp::acceptor>(impl_->pool->at(0));
  tcp::acceptor& acceptor = *impl_->acceptor;
  tcp::endpoint ep(addr, static_cast<uint16_t>(impl_->options.listen_port));
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    impl_->stopped = true;
    impl_->acceptor.reset();  // before the pool that owns its io_context
    impl_->pool.reset();
    return Status(ErrorCode::kIOError, fmt::format("listen on {}: {}", where, ec.message()));
  }
  auto local = acceptor.local_endpoint(ec);
  impl_->bound = Endpoint{local.address().to_string(), local.port()};
  asio::co_spawn(impl_->pool->at(0), impl_->acceptLoop(), asio::detached);
  if (std::any_of(impl_->methods.begin(), impl_->methods.end(),
                  [](const auto& m) { return m.second.local != nullptr; })) {
    LocalServers& servers = LocalServers::get();
    std::lock_guard lock(servers.mu);
    // A second server on the same endpoint cannot have bound; keep the first.
    if (servers.by_endpoint.emplace(impl_->bound.toString(), impl_.get()).second)
      impl_->local_key = impl_->bound.toString();
  }
  CLOG_INFO("net", "rpc server listening on {}", impl_->bound.toString());
  return Status::OK();
}

void RpcServer::stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped) return;
  if (!s.local_key.empty()) {
    LocalServers& servers = LocalServers::get();
    std::lock_guard lock(servers.mu);
    servers.by_endpoint.erase(s.local_key);
  }
  {
    // No local call starts after the erase; the running ones hold pointers
    // into this server (and into what its handlers use) until they return.
    std::unique_lock lock(s.mu);
    s.cv.wait(lock, [&] { return s.local_inflight.load() == 0; });
  }
  std::vector<std::shared_ptr<ServerConnection>> conns;
  {
    std::lock_guard lock(s.mu);
    s.stopped = true;
    for (auto& [p, w] : s.connections) {
      if (auto c = w.lock()) conns.push_back(std::move(c));
    }
  }
  asio::post(s.pool->at(0), [&s] {
    asio::error_code ec;
    s.acceptor->close(ec);
  });
  // Each connection stops reading and closes itself once its calls are answered.
  for (auto& c : conns) asio::post(c->executor(), [c] { c->drain(); });
  {
    std::unique_lock lock(s.mu);
    if (!s.cv.wait_for(lock, std::chrono::milliseconds(s.options.stop_grace_ms),
                       [&] { return s.connections.empty(); })) {
      CLOG_WARN("net", "rpc server stop: {} connections still busy after {} ms; closing them",
                s.connections.size(), s.options.stop_grace_ms);
    }
  }
  for (auto& c : conns) asio::post(c->executor(), [c] { c->close("server stopped"); });
  {
    std::unique_lock lock(s.mu);
    s.cv.wait_for(lock, std::chrono::seconds(1), [&] { return s.connections.empty(); });
  }
  conns.clear();
  s.pool->stop();
  s.acceptor.reset();
  s.pool.reset();  // destroys any coroutine frames still parked in the contexts
  CLOG_INFO("net", "rpc server on {} stopped", s.bound.toString());
}

Endpoint RpcServer::endpoint() const { return impl_->bound; }

size_t RpcServer::connectionCount() const {
  std::lock_guard lock(impl_->mu);
  return impl_->connections.size();
}

}  // namespace cistern::net
