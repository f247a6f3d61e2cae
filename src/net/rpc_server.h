// RpcServer: serves protobuf RPC methods over TCP (frame format: frame.h).
//
//   RpcServer server(options);
//   server.handle<EchoRequest, EchoResponse>(kEcho,
//       [](CallContext& ctx, const EchoRequest& req, EchoResponse& resp) -> asio::awaitable<Status>
//       {
//         resp.set_text(req.text());
//         co_return Status::OK();
//       });
//   RETURN_ON_ERROR(server.start());   // binds; server.endpoint() has the port
//
// Threads: options.threads I/O threads (default one per core), each with its
// own io_context; a connection and all its handlers run on one of them, so a
// handler must not block (offload blocking work, e.g. a KV transaction, to
// another executor). Register every method before start(); start/stop from
// one thread. Memory per connection is bounded: at most
// inflight_per_connection_max requests are read before their responses have
// been written, and a frame's lengths are checked against FrameLimits before
// any buffer is allocated. A malformed frame closes only its connection, with
// a logged error naming the peer. An unknown method or an unparsable message
// is answered with kUnknownMethod / kBadMessage and the connection stays open.
#pragma once

#include <asio/awaitable.hpp>

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "net/endpoint.h"
#include "net/frame.h"
#include "net/method.h"

namespace google::protobuf {
class Message;
}

namespace cistern::net {

struct ServerOptions {
  // Address to listen on. Default: 127.0.0.1:0 (a free port).
  std::string listen_host = "127.0.0.1";
  uint32_t listen_port = 0;
  // I/O threads; 0 = one per core. Default: 0.
  uint32_t threads = 0;
  // Requests read from one connection before their responses are written. Default: 64.
  uint32_t inflight_per_connection_max = 64;
  // Open connections; more are closed on accept. Default: 4096.
  uint32_t connections_max = 4096;
  // How long stop() waits for in-flight calls. Default: 5000 ms.
  uint32_t stop_grace_ms = 5000;
  // Checksum response payloads (message bodies are always checksummed). Default: true.
  bool payload_crc = true;
  FrameLimits limits;
};

// What a handler knows about its call. Valid until the handler's coroutine ends.
class CallContext {
 public:
  const FrameHeader& header() const { return header_; }
  const std::string& peer() const { return peer_; }
  std::span<const uint8_t> requestPayload() const { return request_payload_; }
  // The caller's token or capability from the frame (empty: none).
  const std::string& credential() const { return credential_; }
  // Time after which the caller stops waiting (SteadyTime::max() if none).
  SteadyTime deadline() const { return deadline_; }

  // The response payload, sent after the message. The bytes must stay valid
  // until the response is written; `owner` is kept alive until then.
  void setResponsePayload(std::span<const uint8_t> bytes, std::shared_ptr<const void> owner) {
    response_payload_ = bytes;
    response_owner_ = std::move(owner);
  }

 private:
  friend class ServerConnection;
  FrameHeader header_;
  std::string peer_;
  std::string credential_;
  std::span<const uint8_t> request_payload_;
  SteadyTime deadline_ = SteadyTime::max();
  std::span<const uint8_t> response_payload_;
  std::shared_ptr<const void> response_owner_;
};

using Handler = std::function<asio::awaitable<Status>(
    CallContext&, const google::protobuf::Message& request, google::protobuf::Message& response)>;

// A local call's raw payloads: the caller's own buffers.
struct LocalPayloads {
  std::span<const uint8_t> request;  // may change under the handler: copy before checksumming
  std::span<uint8_t> response;       // its size is the most the caller accepts
  size_t response_len = 0;           // set by the handler
  std::string_view credential;       // the caller's token or capability (empty: none)
};

// A method's handler for callers in this process (local_call.h): runs on the
// caller's thread, which may block, with no socket and none of the server's
// threads.
using LocalHandler =
    std::function<Status(const google::protobuf::Message& request,
                         google::protobuf::Message& response, LocalPayloads& payloads)>;

// Checked before every call's handler (remote and local): a call it fails
// is answered with its status and not run. Runs on the I/O thread (or the
// local caller's), so it must be quick (a MAC, a lookup).
using Guard = std::function<Status(const Method& method, std::string_view credential,
                                   const google::protobuf::Message& request)>;

class RpcServer {
 public:
  explicit RpcServer(const ServerOptions& options);
  ~RpcServer();  // stops
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  // `request` and `response` are the message prototypes of the method.
  void handleRaw(const Method& method, const google::protobuf::Message& request,
                 const google::protobuf::Message& response, Handler handler);

  template <typename Req, typename Resp, typename F>
  void handle(const Method& method, F f) {
    handleRaw(method, Req::default_instance(), Resp::default_instance(),
              [f = std::move(f)](CallContext& ctx, const google::protobuf::Message& req,
                                 google::protobuf::Message& resp) {
                return f(ctx, static_cast<const Req&>(req), static_cast<Resp&>(resp));
              });
  }

  // Lets callSync() from this process run `method` (registered with
  // handleRaw) through `local` on the calling thread when it calls this
  // server's endpoint (local_call.h). Before start().
  void handleLocal(const Method& method, LocalHandler local);

  // Sets the guard of every method (Guard above). Before start().
  void setGuard(Guard guard);

  // Binds and starts accepting. kIOError naming the address if binding fails.
  Status start();
  // Stops accepting and taking local calls, lets in-flight calls finish (up
  // to stop_grace_ms; local calls always), then closes every connection and
  // joins the threads. Idempotent.
  void stop();
  // The bound address (after start()).
  Endpoint endpoint() const;
  // Open connections now.
  size_t connectionCount() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace cistern::net
